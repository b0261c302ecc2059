"""Where things live in a dataset, and which format version this code writes.

Every path rule of the format is here and nowhere else (``docs/format.md`` is the prose
version). A dataset (a local directory, or a prefix of a bucket) looks like::

    DATASET/
      manifest.json                                  format version, spaces, env id
      steps/_delta_log/<version>.json                the step table's Delta log
      steps/date=2026-11-22/part-<writer>-<seq>.parquet
      episodes/_delta_log/...                        the episodes table, the same way
      episodes/date=2026-11-22/part-<writer>-<seq>.parquet

and a writer's local state directory (the dataset itself when it is local)::

      _wal/<writer>/<table>-<seq>.arrows             write-ahead log of uncommitted rows
      _wal/<writer>/<table>-<seq>.rows               the same, as JSON lines (server steps)
      _quarantine/<stamp>/...                        damaged files moved aside, and report.json
      _journal/<writer>/journal-<n>.jsonl            a server's open episodes (server.journal)

A data file is part of a table when a commit of its Delta log names it, and only then.
"""

from __future__ import annotations

import re
from pathlib import Path

FORMAT_NAME = "rlpipe"
FORMAT_VERSION = 2

MANIFEST = "manifest.json"
STEPS = "steps"
EPISODES = "episodes"
TABLES = (STEPS, EPISODES)
WAL = "_wal"
WAL_LOCK = "LOCK"
QUARANTINE = "_quarantine"
JOURNAL = "_journal"
PARTITION_KEY = "date"

DEFAULT_AGENT_ID = "agent0"

# Keys of the Parquet key-value metadata that make every shard describe itself.
META_FORMAT_VERSION = b"rlpipe.format_version"
META_OBSERVATION_SPACE = b"rlpipe.observation_space"
META_ACTION_SPACE = b"rlpipe.action_space"
META_TABLE = b"rlpipe.table"

_SEGMENT_RE = re.compile(r"^(?P<table>[a-z]+)-(?P<seq>\d{8})\.(?P<kind>arrows|rows)$")


def shard_name(writer_id: str, seq: int) -> str:
    return f"part-{writer_id}-{seq:08d}.parquet"


def app_id(writer_id: str, segment: str) -> str:
    """The Delta app transaction id under which a writer commits the shards of one kind of log
    segment (``arrows`` or ``rows``, a segment name's suffix). A table's two kinds take numbers
    from one counter but roll independently, so only within a kind do commits come in order,
    which is what the transaction version (the highest number committed) needs."""
    return f"{writer_id}.{segment.lstrip('.')}"


def segment_name(table: str, seq: int, rows: bool = False) -> str:
    """An Arrow IPC segment, or with ``rows`` one of JSON lines (:mod:`pipeline.dataset.rowlog`)."""
    return f"{table}-{seq:08d}.{'rows' if rows else 'arrows'}"


def parse_segment_name(name: str) -> tuple[str, int] | None:
    match = _SEGMENT_RE.match(name)
    return (match["table"], int(match["seq"])) if match else None


def segments(directory: Path) -> list[Path]:
    """The log segments of both kinds in a writer's log directory, in name order."""
    return sorted(p for p in directory.glob("*") if parse_segment_name(p.name))


def wal_root(state_dir: str | Path) -> Path:
    """The log lives on local disk only: it needs fsync and file locks, which object stores lack."""
    return Path(state_dir) / WAL

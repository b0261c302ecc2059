"""Where things live in a dataset directory, and which format version this code writes.

Every path rule of the on-disk format is here and nowhere else (``docs/format.md`` is the prose
version). A dataset looks like::

    DATASET/
      manifest.json                                  format version, spaces, env id
      steps/date=2026-11-22/part-<writer>-<seq>.parquet
      episodes/date=2026-11-22/part-<writer>-<seq>.parquet
      _wal/<writer>/<table>-<seq>.arrows             write-ahead log of uncommitted rows
      _wal/<writer>/<table>-<seq>.rows               the same, as JSON lines (server steps)
      _quarantine/<stamp>/...                        damaged files moved aside, and report.json
      _journal/<writer>/journal-<n>.jsonl            a server's open episodes (server.journal)

Names starting with ``_`` or ``.`` are invisible to ``pyarrow.dataset`` discovery, which is how
readers never see the log or a shard still being written.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow.fs as pafs

FORMAT_NAME = "rlpipe"
FORMAT_VERSION = 1

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


def partition_dir(root: str, table: str, date: str) -> str:
    return f"{root}/{table}/{PARTITION_KEY}={date}"


def segment_name(table: str, seq: int, rows: bool = False) -> str:
    """An Arrow IPC segment, or with ``rows`` one of JSON lines (:mod:`pipeline.dataset.rowlog`)."""
    return f"{table}-{seq:08d}.{'rows' if rows else 'arrows'}"


def parse_segment_name(name: str) -> tuple[str, int] | None:
    match = _SEGMENT_RE.match(name)
    return (match["table"], int(match["seq"])) if match else None


def segments(directory: Path) -> list[Path]:
    """The log segments of both kinds in a writer's log directory, in name order."""
    return sorted(p for p in directory.glob("*") if parse_segment_name(p.name))


def wal_root(root: str) -> Path:
    """The log lives on local disk only: it needs fsync and file locks, which object stores lack."""
    return Path(root) / WAL


def resolve(path: str | Path) -> tuple[pafs.FileSystem, str]:
    """A filesystem and a path inside it, for a local path or a URI such as ``s3://bucket/ds``."""
    text = str(path)
    if "://" in text:
        filesystem, inner = pafs.FileSystem.from_uri(text)
        return filesystem, inner.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(text)  # links kept: errors name what was given

"""Recovery: turning the logs of writers that died into shards.

A writer holds an exclusive ``flock`` on ``_wal/<writer>/LOCK`` for as long as it lives; the kernel
drops it when the process dies, however it dies. So a log directory whose lock can be taken belongs
to a dead writer, and its segments hold acknowledged rows that never became shards. Each segment is
committed under the dead writer's own id and sequence number, the app transaction of its Delta
commit (one per kind of segment: ``layout.app_id``), which makes recovery idempotent: a segment
whose number the table's transaction version for that writer already reaches (the writer died
between commit and delete) is just deleted, and one whose file was written but never committed
(a kill in between) is written again and committed once.
The log lives in the dataset's local state directory (:class:`Location.state_dir`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.dataset import rowlog
from pipeline.dataset.delta import Table
from pipeline.dataset.location import Location, locate
from pipeline.dataset.records import LogRead
from pipeline.dataset.shard import first_date, write_shard
from pipeline.dataset.wal import read_segment
from pipeline.errors import RlpipeWarning
from pipeline.format import layout

_RECOVERY_ROW_GROUP = 131_072


@dataclass(frozen=True)
class Recovered:
    """One segment brought back: which writer and table, and how many rows it held; for a
    damaged one, what is wrong and its quarantine report entries (the rows it lost)."""

    writer_id: str
    table: str
    seq: int
    rows: int
    problems: tuple[str, ...] = ()
    entries: tuple[dict[str, Any], ...] = ()


def recover(
    path: str | Path | Location,
    storage_options: dict[str, str] | None = None,
    state_dir: str | Path | None = None,
) -> list[Recovered]:
    """Commit the logs of every dead writer of a dataset; live writers' logs are left alone."""
    location = locate(path, storage_options, state_dir)
    base = layout.wal_root(location.state_dir)
    if not base.is_dir():
        return []
    recovered: list[Recovered] = []
    for directory in sorted(base.iterdir()):
        # (a ".new-" directory of a writer that died claiming it: wal.claim_log_dir sweeps it)
        if directory.is_dir() and not directory.name.startswith("."):
            recovered += _recover_dir(location, directory)
    return recovered


def pending_segments(location: Location) -> list[Path]:
    """Log segments not yet committed (of live or dead writers); ``rlpipe inspect`` reports them."""
    base = layout.wal_root(location.state_dir)
    if not base.is_dir():
        return []
    return [
        segment
        for directory in sorted(base.iterdir())
        if directory.is_dir()
        for segment in layout.segments(directory)
    ]


def take_dead_lock(directory: Path) -> int | None:
    """The descriptor of ``directory``'s lock, taken, when its owner is dead; None while it
    lives (or another process recovers it), or when the lock is gone (recovered already)."""
    try:
        fd = os.open(directory / layout.WAL_LOCK, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _recover_dir(location: Location, directory: Path) -> list[Recovered]:
    fd = take_dead_lock(directory)
    if fd is None:
        return []
    try:
        writer_id = directory.name
        tables = {name: Table(location, name) for name in layout.TABLES}
        recovered = [
            _recover_segment(location, tables, writer_id, segment)
            for segment in layout.segments(directory)
        ]
        _remove_dir(directory)
        return [item for item in recovered if item is not None]
    finally:
        os.close(fd)


def _recover_segment(
    location: Location, tables: dict[str, Table], writer_id: str, segment: Path
) -> Recovered | None:
    parsed = layout.parse_segment_name(segment.name)
    if parsed is None:
        return None
    table, seq = parsed
    app = layout.app_id(writer_id, segment.suffix)
    committed = tables[table].committed_seq(app)
    if committed is not None and committed >= seq:
        segment.unlink()
        return None
    found = rowlog.read_rows(segment) if segment.suffix == ".rows" else read_segment(segment)
    batches = [batch for batch in found.batches if batch.num_rows]
    rows = sum(batch.num_rows for batch in batches)
    if rows:
        date = first_date(batches[0])
        _, action = write_shard(location, table, writer_id, seq, date, batches, _RECOVERY_ROW_GROUP)
        # a segment holds the table's full schema (section 8 of docs/format.md)
        tables[table].commit(batches[0].schema, action, app, seq)
    if found.problems:  # its sound records are committed; the file is kept for whoever looks
        return _quarantined(location.state_dir, writer_id, segment, found, rows)
    segment.unlink()
    return Recovered(writer_id, table, seq, rows) if rows else None


def _quarantined(root: Path, writer_id: str, segment: Path, found: LogRead, rows: int) -> Recovered:
    """Move a damaged segment into quarantine, and warn with the file and what is wrong."""
    from pipeline.dataset.quarantine import Quarantine

    lost: dict[str, Any] = {"rows": None, "episodes": [], "unknown": "; ".join(found.lost)}
    entry = Quarantine(root).move(segment, "; ".join(found.problems), lost)
    warnings.warn(
        f"{segment}: damaged: {entry['problem']}; its {rows} sound rows were committed, the "
        f"rest lost ({entry['lost']['unknown'] or 'rows unknown'}); the file is kept as "
        f"{root}/{entry['moved_to']}",
        RlpipeWarning,
        stacklevel=4,
    )
    table, seq = layout.parse_segment_name(segment.name) or ("", 0)
    return Recovered(writer_id, table, seq, rows, tuple(found.problems), (entry,))


def _remove_dir(directory: Path) -> None:
    try:
        children = list(directory.iterdir())
    except FileNotFoundError:
        return  # another recovering process removed it first
    for child in children:
        child.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # another recovering process got there first
        directory.rmdir()

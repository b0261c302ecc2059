"""Upkeep of a dataset's Delta tables: compaction, log checkpoints and vacuum.

Every commit of a writer adds one small file, so a live dataset gathers many; ``deltalake``'s
own OPTIMIZE merges them (:func:`upkeep`). Its commit removes the small files and adds the
merged ones with ``dataChange`` false: the rows are the same, so a following reader, which reads
only what data-changing commits add (``delta.Snapshot.advance``), reads none of them again, and
a reader that opens the table later reads the merged files instead of the small ones. The
commit is an ordinary Delta commit: a writer appending meanwhile does not conflict with it (an
append reads nothing), so writers and compaction run at the same time.

The removed files stay on storage until a vacuum deletes those removed longer than the retention
period ago: until then, a follower behind the compaction and a reader pinned to an older version
still read them. :func:`check_retention` refuses a retention shorter than the table's own
(``delta.deletedFileRetentionDuration``, 7 days by default) unless forced.

The merged files are written by delta-rs, not pyarrow, with the writer properties closest to
rlpipe's own shards that delta-rs takes (:func:`writer_properties`): zstd, byte-stream-split
floats, delta-packed ``t``. delta-rs takes per-column settings only for top-level columns and a
column cannot both use a dictionary and name its fallback encoding, so flat non-float columns are
written plain (zstd takes their repeats) and a nested column's leaves take the default.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import unquote

from deltalake import ColumnProperties, DeltaTable, WriterProperties
from deltalake.exceptions import DeltaError

from pipeline.dataset.delta import FileEntry, Table
from pipeline.dataset.lease import UpkeepBusy, upkeep_lease
from pipeline.dataset.location import Location, storage_failure
from pipeline.errors import ConfigError, RlpipeError
from pipeline.format import layout

DEFAULT_RETENTION_HOURS = 168  # Delta's default delta.deletedFileRetentionDuration: 7 days
DEFAULT_TARGET_BYTES = 100_000_000  # deltalake's own default target for a merged file
# A background pass's tiers (_tiered): the target and a hundredth of it. Measured at a smaller
# scale (4 MB target, 37 KB committed between 120 passes): storage held 4.1x the live bytes,
# shards included, against 55x merging every file under the target at every pass; with three
# tiers a tenth apart, 5.7x.
TIER_RATIO, TIERS, MIN_FILES = 100, 2, 50
ROW_GROUP_ROWS = 131_072  # as rlpipe's own shards (WriterConfig.row_group_rows)
_FLOATS = ("float", "double")
_UNITS_HOURS = {"hour": 1.0, "day": 24.0, "week": 168.0, "minute": 1 / 60, "second": 1 / 3600}


@dataclass(frozen=True)
class TableUpkeep:
    """What upkeep did to one table: its files, bytes and rows before and after, versions, and
    how many removed files the vacuum deleted."""

    table: str
    files_before: int
    bytes_before: int
    files_after: int
    bytes_after: int
    rows: int
    version_before: int | None
    version_after: int | None
    vacuumed: int

    def describe(self) -> str:
        per_row = f", {self.bytes_after / self.rows:.1f} B/row" if self.rows else ""
        return (
            f"{self.table}: {self.files_before} files ({self.bytes_before} B) -> "
            f"{self.files_after} files ({self.bytes_after} B){per_row}; version "
            f"{self.version_before} -> {self.version_after}; {self.vacuumed} removed files deleted"
        )


def writer_properties(delta: DeltaTable) -> WriterProperties:
    """Parquet writer properties for the merged files of ``delta``, as close to rlpipe's own
    shards as delta-rs allows (see the module's docstring)."""
    columns: dict[str, ColumnProperties] = {}
    nested: set[str] = set()
    for field in delta.schema().fields:
        kinds = _leaf_types(field.type)
        if getattr(field.type, "type", None) not in kinds:  # a list or struct: leaves nested
            nested.update(kinds)
        elif kinds[0] in _FLOATS:
            columns[field.name] = ColumnProperties(False, encoding="BYTE_STREAM_SPLIT")
        elif kinds[0] == "binary":  # frames: no min and max of 21 KB values, as rlpipe writes
            columns[field.name] = ColumnProperties(
                False, statistics_enabled="NONE", encoding="PLAIN"
            )
        elif field.name == "t":
            columns[field.name] = ColumnProperties(False, encoding="DELTA_BINARY_PACKED")
        else:
            columns[field.name] = ColumnProperties(False, encoding="PLAIN")
    default = None
    if nested and nested <= set(_FLOATS):  # observations of Boxes: split every leaf
        default = ColumnProperties(False, encoding="BYTE_STREAM_SPLIT")
    return WriterProperties(
        compression="ZSTD",
        max_row_group_size=ROW_GROUP_ROWS,
        default_column_properties=default,
        column_properties=columns,
    )


def _leaf_types(kind: Any) -> list[str]:
    if hasattr(kind, "element_type"):
        return _leaf_types(kind.element_type)
    if hasattr(kind, "fields"):
        return [leaf for field in kind.fields for leaf in _leaf_types(field.type)]
    return [str(getattr(kind, "type", kind))]


def retention_hours_of(delta: DeltaTable) -> float:
    """The table's ``delta.deletedFileRetentionDuration`` in hours (Delta's default: 168)."""
    text = delta.metadata().configuration.get("delta.deletedFileRetentionDuration") or ""
    match = re.fullmatch(r"\s*interval\s+(\d+)\s+(\w+?)s?\s*", text, re.I)
    if match is None or match.group(2).lower() not in _UNITS_HOURS:
        return float(DEFAULT_RETENTION_HOURS)
    return int(match.group(1)) * _UNITS_HOURS[match.group(2).lower()]


def check_retention(location: Location, hours: float, force: bool) -> None:
    """Refuse a vacuum retention shorter than the tables' own, unless ``force`` (ConfigError)."""
    if not hours >= 0:
        raise ConfigError("compact", "retention_hours", "hours >= 0", hours)
    if force:
        return
    for name in (layout.STEPS, layout.EPISODES):
        delta = Table(location, name).open()
        if delta is None:
            continue
        needed = retention_hours_of(delta)
        if hours < needed:
            raise ConfigError(
                "compact",
                "retention_hours",
                f"at least the {name} table's retention of {needed:g} hours (a follower behind "
                "the compaction, a reader or training run pinned to an older version, and a "
                "writer about to commit a shard it just wrote may still read files removed "
                "since; --force vacuums anyway)",
                hours,
            )


def upkeep(
    location: Location,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    *,
    force: bool = False,
    vacuum: bool = True,
    target_bytes: int | None = None,
    tiered: bool = False,
) -> list[TableUpkeep]:
    """Compact each table of the dataset, checkpoint its log, drop log entries past the log
    retention, and (``vacuum``) delete files removed longer than ``retention_hours`` ago.

    ``tiered`` (a background pass) merges only files that have enough company (:func:`_tiered`)
    rather than every file under the target at every pass.

    One upkeep runs at a time on a dataset, whatever process or machine runs it: it holds the
    dataset's upkeep lease (:mod:`pipeline.dataset.lease`), since two compactions at once
    would each commit a copy of the same rows.

    Raises:
        ConfigError: a retention shorter than the tables' own without ``force``.
        UpkeepBusy: another upkeep of the dataset is running.
        DatasetError: the store failed, naming the URI and the cause.
    """
    if vacuum:
        check_retention(location, retention_hours, force)
    done = []
    with upkeep_lease(location):
        for name in (layout.STEPS, layout.EPISODES):
            table = Table(location, name)  # opened after the claim: any earlier pass is in it
            delta = table.open()
            if delta is not None:
                done.append(
                    _upkeep_table(table, delta, retention_hours, vacuum, target_bytes, tiered)
                )
    return done


def _upkeep_table(
    table: Table,
    delta: DeltaTable,
    retention_hours: float,
    vacuum: bool,
    target_bytes: int | None,
    tiered: bool,
) -> TableUpkeep:
    before = table.files()
    version_before = table.version
    name = table.name
    merges = _merges(before, target_bytes, tiered)
    properties = writer_properties(delta) if merges else None
    for date, size in merges:  # the partition's files under ``size``
        where = [(layout.PARTITION_KEY, "=", date)] if date else None
        compact = partial(delta.optimize.compact, where, size, writer_properties=properties)
        table.call(f"compacting {name}", compact)
        table.call(f"reading the log {name}", delta.update_incremental)
    table.call(f"checkpointing the log {name}", delta.create_checkpoint)
    table.call(f"cleaning up the log {name}", delta.cleanup_metadata)
    deleted: list[str] = []
    if vacuum:
        deleted = table.call(
            f"vacuuming {name}",
            lambda: delta.vacuum(
                retention_hours=int(retention_hours),
                dry_run=False,
                enforce_retention_duration=False,  # check_retention decided
            ),
        )
    after = table.files()
    return TableUpkeep(
        name,
        len(before),
        sum(entry.size for entry in before),
        len(after),
        sum(entry.size for entry in after),
        sum(entry.rows or 0 for entry in after),
        version_before,
        table.version,
        len(deleted),
    )


def _merges(
    files: list[FileEntry], target_bytes: int | None, tiered: bool
) -> list[tuple[str, int | None]]:
    """(partition, size) for each merge: one of the whole table (``""``) under the target for
    a manual compaction, the tiers' for a background pass."""
    if tiered:
        return _tiered(files, target_bytes or DEFAULT_TARGET_BYTES)
    return [("", target_bytes)] if len(files) > 1 else []


def _tiered(files: list[FileEntry], target_bytes: int) -> list[tuple[str, int | None]]:
    """The merges of a background pass: (partition, size) for each tier of each partition
    whose files under half that size hold a whole file of it between them; in the newest
    partition, the smallest tier's also once MIN_FILES wait; in older ones, which take no new
    shards, all of their files under half the target at once. (deltalake then merges every
    file under the size it is given, packing the largest first, and leaves a file alone where
    nothing fits beside it.)

    Merging every file under the target at every pass, as a manual compaction does, rewrites
    the partition's growing merged file each time a few new shards come: with 2 MB coming
    between passes, 100 MB were rewritten 50 times over (25x the data), and the removed copies
    stay on storage until a vacuum, 7 days later. Here a file is rewritten when as much again
    has come to its tier, so a byte is written about once per tier."""
    merges: list[tuple[str, int | None]] = []
    dates = list(dict.fromkeys(entry.date for entry in files))
    latest = max(dates, default="")
    for date in dates:
        sizes = [entry.size for entry in files if entry.date == date]
        newest = date == latest
        for tier in range(TIERS - 1, -1, -1):
            size = max(1, target_bytes // TIER_RATIO**tier)
            below = [s for s in sizes if s < size / 2]  # a file half full or more waits
            crowded = newest and tier == TIERS - 1 and len(below) >= MIN_FILES
            full = sum(below) >= size or (not newest and tier == 0)
            if len(below) > 1 and (full or crowded):
                merges.append((date, size))
                sizes = [s for s in sizes if s >= size / 2] + [sum(below)]  # about what it makes
    return merges


def removed_paths(location: Location, table: str) -> set[str]:
    """Paths (under ``table``) that a commit removed and a vacuum has not deleted yet, as far as
    the log still says: the ``remove`` actions of its commit files and its checkpoints. Such a
    file on storage is no stray (``rlpipe inspect``): followers may still read it."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    filesystem = location.filesystem
    log = location.path(table, "_delta_log")
    selector = pafs.FileSelector(log, allow_not_found=True)
    removed: set[str] = set()
    try:
        for info in filesystem.get_file_info(selector):
            if info.path.endswith(".json"):
                with filesystem.open_input_stream(info.path) as stream:
                    lines = stream.read().decode("utf-8").splitlines()
                actions = [json.loads(line) for line in lines if '"remove"' in line]
                removed.update(unquote(a["remove"]["path"]) for a in actions if "remove" in a)
            elif info.path.endswith(".checkpoint.parquet"):
                with filesystem.open_input_file(info.path) as file:
                    column = pq.read_table(file, columns=["remove"]).column("remove")
                removed.update(unquote(r["path"]) for r in column.to_pylist() if r)
    except OSError as error:
        raise storage_failure(location, f"reading the {table} table's log", error) from None
    return removed


def _to_stderr(line: str) -> None:
    print(f"rlpipe serve: {line}", file=sys.stderr, flush=True)


def compact_once(location: Location, report: Callable[[str], None] = _to_stderr) -> None:
    """One upkeep pass, reported through ``report``: a pass skipped because another upkeep of
    the dataset is running (another server's), or that meets a store error, is reported and
    raises nothing, so the next pass tries again and the server goes on."""
    try:
        done = upkeep(location, DEFAULT_RETENTION_HOURS, tiered=True)
    except UpkeepBusy as busy:  # another server's pass: this one's turn comes later
        report(f"compaction skipped: {busy}")
        return
    except (RlpipeError, DeltaError, OSError) as error:
        report(f"compaction failed, trying again at the next pass: {error}")
        return
    for entry in done:
        report(f"compacted {entry.describe()}")

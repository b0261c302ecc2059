"""The step and episode tables as Delta tables: committing shards, and reading what is committed.

rlpipe writes each shard itself (pyarrow, with the encodings of :mod:`pipeline.dataset.shard`)
and ``deltalake`` commits it: one Add action per shard, carrying an app transaction
``(writer id and log kind, shard number)`` (``layout.app_id``). A shard whose number is at most
the recorded transaction version is committed already, which is what makes recovery commit a
dead writer's shards exactly once. The first commit creates the table; writers that race to
create it all end up appending.

Delta has no fixed-size list, unsigned integer or half float, so columns are stored in the types
of :mod:`pipeline.dataset.storage_types`, and readers cast them back to the step schema, whose
field metadata keeps the shape and the space (``docs/format.md``).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    PostCommitHookProperties,
    Transaction,
    create_table_with_add_actions,
)

from pipeline.dataset import commits
from pipeline.dataset.location import Location, storage_failure
from pipeline.dataset.storage_types import storage_schema
from pipeline.errors import DatasetError
from pipeline.format import layout

_COMMIT_ATTEMPTS = 8  # a race to create the table, or a commit that lost to another writer's
# After a commit, deltalake checkpoints at the table's interval but does not clean up old log
# entries: that lists the whole log, a request per commit that grows with it; `rlpipe compact`
# cleans up instead.
_HOOKS = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
# On a local disk, a checkpoint every 10 commits (Delta's own default; deltalake's is 100):
# reading the log and committing replay every commit since the last checkpoint, so a live server
# committing every 50 ms spent twice as long a commit at 100 (14 ms against 7 ms over 500
# commits). On object storage deltalake's 100: there a checkpoint costs some 25 requests, and a
# commit 9 whatever its distance from the last (test_delta.py).
_LOCAL_CONFIGURATION = {"delta.checkpointInterval": "10"}


def _delta_schema(table_schema: pa.Schema) -> Schema:
    stored = storage_schema(table_schema)
    return Schema.from_arrow(stored.append(pa.field(layout.PARTITION_KEY, pa.string())))


@dataclass(frozen=True)
class FileEntry:
    """A data file of a table's snapshot: its path relative to the table, and what Delta says."""

    path: str
    size: int
    modified_ms: int
    rows: int | None
    date: str


class Table:
    """One Delta table of a dataset (``steps`` or ``episodes``), opened lazily, pinned to
    ``version`` (a reader's ``version=N``) or, with None, following the latest."""

    def __init__(self, location: Location, name: str, version: int | None = None) -> None:
        self.location = location
        self.name = name
        self.uri = location.table_uri(name)
        self._pinned = version
        self._table: DeltaTable | None = None
        # app id -> its transaction version as this object last learned it: from the table
        # once, then from its own commits (an app commits through one object: its writer, or
        # the recovery that holds its log's lock)
        self._known: dict[str, int | None] = {}

    def open(self) -> DeltaTable | None:
        """The table at its pinned or latest version; None while nobody has committed to it."""
        if self._table is not None:
            if self._pinned is None:
                self.call("reading the table's log", self._table.update_incremental)
            return self._table
        try:
            table = DeltaTable(
                self.uri,
                version=self._pinned,
                storage_options=dict(self.location.storage_options) or None,
            )
        except TableNotFoundError:
            if self._pinned is not None:
                raise storage_failure(
                    self.location,
                    f"opening {self.name} at version {self._pinned}",
                    ValueError("no such table version"),
                ) from None
            return None
        except (DeltaError, OSError) as error:
            raise storage_failure(self.location, f"opening the {self.name} table", error) from None
        # kept only once checked: a caller that opens again after the error checks again
        commits.check_replayed(self.location, self.name, table.version())
        self._table = table
        return table

    @property
    def version(self) -> int | None:
        """The version last opened, None before a first commit."""
        return None if self._table is None else self._table.version()

    def files(self) -> list[FileEntry]:
        """The data files of the snapshot, oldest partition first, then by path."""
        table = self.open()
        if table is None:
            return []
        actions = pa.table(self.call("listing the table's files", table.get_add_actions, True))
        columns = {name: actions.column(name).to_pylist() for name in actions.column_names}
        dates = columns.get(f"partition.{layout.PARTITION_KEY}", [""] * actions.num_rows)
        entries = [
            FileEntry(path, size, modified, rows, date or "")
            for path, size, modified, rows, date in zip(
                columns["path"],
                columns["size_bytes"],
                columns["modification_time"],
                columns["num_records"],
                dates,
                strict=True,
            )
        ]
        return sorted(entries, key=lambda entry: (entry.date, entry.path))

    def forget_missing(self) -> list[str]:
        """Commit the removal of every file the snapshot names that is no longer there (Delta's
        FSCK: after ``rlpipe inspect --repair`` moved damaged files aside); returns them."""
        table = self.open()
        if table is None:
            return []
        report = self.call("removing missing files from the log", table.repair)
        return list(report.get("files_removed", []))

    def committed_seq(self, app_id: str) -> int | None:
        """The highest shard number committed under ``app_id`` (``layout.app_id``), if any.
        The table is asked once per app: deltalake answers by replaying the log since its last
        checkpoint, a read per commit file, which on object storage is a request each."""
        if app_id in self._known:
            return self._known[app_id]
        table = self.open()
        version: int | None = None if table is None else table.transaction_version(app_id)
        self._known[app_id] = version
        return version

    def commit(self, table_schema: pa.Schema, action: AddAction, app_id: str, seq: int) -> bool:
        """Commit one shard (an Add action) as ``(app_id, seq)``, once: False when the app's
        transaction version says it is committed already."""
        settings: dict[str, Any] = {
            "mode": "append",
            "partition_by": [layout.PARTITION_KEY],
            "commit_properties": CommitProperties(app_transactions=[Transaction(app_id, seq)]),
            "post_commithook_properties": _HOOKS,
        }
        schema = _delta_schema(table_schema)
        for attempt in range(_COMMIT_ATTEMPTS):
            try:
                committed = self.committed_seq(app_id)
                if committed is not None and committed >= seq:
                    return False
                table = self.open()  # at the latest version: the commit reads no older one
                if table is None:
                    options = dict(self.location.storage_options) or None
                    create_table_with_add_actions(
                        self.uri,
                        schema,
                        [action],
                        configuration=_LOCAL_CONFIGURATION if self.location.local else None,
                        storage_options=options,
                        **settings,
                    )
                else:
                    table.create_write_transaction([action], schema=schema, **settings)
                self._known[app_id] = seq
                return True
            except (CommitFailedError, DeltaError, OSError, DatasetError) as error:
                self._known.pop(app_id, None)  # it may have committed: ask the table again
                if attempt == _COMMIT_ATTEMPTS - 1 or not _is_race(error):
                    raise self._refused(error) from None
                time.sleep(0.01 * 2**attempt)  # lost a race: look again
        return False  # not reached

    def _refused(self, error: BaseException) -> OSError:
        """A failed commit as an OSError, which the writer retries with a backoff as it retries
        a full disk: with the OS's error number when deltalake names one (``os error 28``)."""
        failure = str(storage_failure(self.location, f"committing to {self.name}", error))
        code = re.search(r"\(os error (\d+)\)", str(error))
        if code is None:
            return OSError(failure)
        number = int(code[1])
        return OSError(number, os.strerror(number), self.uri)

    def call(self, doing: str, method: Any, *args: Any) -> Any:
        """``method(*args)``; a store error is raised naming the URI and what was being done."""
        try:
            return method(*args)
        except (DeltaError, OSError) as error:
            raise storage_failure(self.location, doing, error) from None


def _is_race(error: BaseException) -> bool:
    text = str(error)
    return isinstance(error, CommitFailedError) or any(
        words in text for words in ("not allowed for create", "already exists", "Version mismatch")
    )


class Snapshot:
    """The data files of a table at a version, advanced by replaying the commits after it.

    The first state comes from deltalake (:meth:`Table.files`); :meth:`advance` then reads each
    later commit file of the Delta log (``_delta_log/<version>.json``, one JSON action a line)
    with pyarrow's filesystem, applying its ``add`` and ``remove`` actions. Following this way
    costs one read a poll, and works in a process forked after deltalake started its runtime
    (a DataLoader worker), where deltalake refuses to run.
    """

    def __init__(self, table: Table) -> None:
        self.table = table
        self.files = {entry.path: entry for entry in table.files()}  # opens the table once
        self.version = table.version
        self.rearranged: list[str] = []  # what the last advance's compactions added

    def sizes(self, paths: list[str]) -> list[int | None]:
        """The sizes of files under the table, as their commits give them (None: not known)."""
        return [entry.size if (entry := self.files.get(path)) else None for path in paths]

    def paths(self) -> list[str]:
        """The files' paths under the table, oldest partition first, then by path."""
        return [e.path for e in sorted(self.files.values(), key=lambda e: (e.date, e.path))]

    def advance(self) -> list[str]:
        """Apply every commit after :attr:`version`; returns the paths that data-changing
        commits added (a compaction's rewritten files, ``dataChange`` false, are left out: they
        go to :attr:`rearranged`)."""
        added: list[str] = []
        self.rearranged = []
        while True:
            following = 0 if self.version is None else self.version + 1
            actions = commits.read_commit(self.table.location, self.table.name, following)
            if actions is None:
                return added
            for action in actions:
                if "add" in action:
                    add = action["add"]
                    entry = _entry_of(add)
                    self.files[entry.path] = entry
                    if add.get("dataChange", True):
                        added.append(entry.path)
                    else:
                        self.rearranged.append(entry.path)
                elif "remove" in action:
                    self.files.pop(unquote(action["remove"]["path"]), None)
            self.version = following


def _entry_of(add: dict[str, Any]) -> FileEntry:
    stats = json.loads(add.get("stats") or "{}")
    date = (add.get("partitionValues") or {}).get(layout.PARTITION_KEY) or ""
    return FileEntry(
        unquote(add["path"]), add["size"], add["modificationTime"], stats.get("numRecords"), date
    )


def add_action(
    relative: str, size: int, date: str, metadata: pq.FileMetaData, modified_ms: int | None = None
) -> AddAction:
    """The Add action of a shard at ``relative`` (under its table), with the statistics Delta
    readers skip files by: row count, and each flat numeric column's min, max and null count,
    taken from the footer rlpipe just wrote."""
    stats: dict[str, Any] = {"numRecords": metadata.num_rows}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for index in range(metadata.num_columns):
        column = metadata.schema.column(index)
        name = column.path
        if "." in name:
            continue  # nested: no statistics (readers then read the file)
        _footer_stats(metadata, index, column.physical_type, name, low, high, nulls)
    stats.update(minValues=low, maxValues=high, nullCount=nulls)
    when = modified_ms if modified_ms is not None else int(time.time() * 1000)
    return AddAction(
        relative, size, {layout.PARTITION_KEY: date}, when, True, json.dumps(stats, default=str)
    )


def _footer_stats(
    metadata: pq.FileMetaData,
    index: int,
    physical: str,
    name: str,
    low: dict[str, Any],
    high: dict[str, Any],
    nulls: dict[str, int],
) -> None:
    """Fold the row groups' statistics of one column into the file's."""
    numeric = physical in ("INT32", "INT64", "FLOAT", "DOUBLE")
    logical = str(metadata.schema.column(index).logical_type)
    plain = numeric and "Timestamp" not in logical
    count = 0
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(index).statistics
        if statistics is None:
            return
        count += statistics.null_count or 0
        if plain and statistics.has_min_max:
            lo, hi = statistics.min, statistics.max
            if lo != lo or hi != hi:  # NaN: no usable bound
                plain = False
                continue
            low[name] = lo if name not in low else min(low[name], lo)
            high[name] = hi if name not in high else max(high[name], hi)
    if not plain:
        low.pop(name, None)
        high.pop(name, None)
    nulls[name] = count

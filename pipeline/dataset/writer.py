"""The dataset writer: validated rows in, durable acknowledgements out, shards committed behind.

Durability contract: once ``append`` returns, its rows survive a ``kill -9``; readers never see a
partial file; reopening the dataset recovers every acknowledged row and drops torn tails; many
writer processes can share one directory because each names its files with its own writer id. An
append is validated, written to the write-ahead log (:mod:`pipeline.dataset.wal`) and fsynced; a
background thread rolls the log segment into a Parquet shard, commits it to the table's Delta log
(:mod:`pipeline.dataset.delta`) under the app transaction (writer id, shard number), then deletes
the segment. The dataset may be a local path or a URI (``s3://bucket/prefix``); the log stays on
local disk (the dataset's own directory, or :attr:`Location.state_dir` for a remote one).

A disk that refuses a write (full, over quota, an I/O error) never stops the writer for good
(:mod:`pipeline.dataset.storage`): the append raises :class:`~pipeline.errors.StorageError`,
nothing of it acknowledged, and a later one tries again; a refused shard is retried.
"""

from __future__ import annotations

import functools
import itertools
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias, cast

import gymnasium as gym
import pyarrow as pa

from pipeline.dataset import rowlog, storage
from pipeline.dataset.delta import Table
from pipeline.dataset.location import locate
from pipeline.dataset.recovery import Recovered, recover
from pipeline.dataset.shard import date_of, first_date, write_shard
from pipeline.dataset.table_log import TableLog
from pipeline.dataset.wal import Segment, claim_log_dir, release_log_dir
from pipeline.dataset.writer_config import WriterConfig
from pipeline.errors import DatasetError, StorageError
from pipeline.format import checks, layout, schema
from pipeline.format.manifest import open_manifest

Columns: TypeAlias = Mapping[str, Any] | pa.RecordBatch | pa.Table


# A test hook: with this variable set, the writer kills its own process (SIGKILL) right after
# writing a shard's file and before committing it, the moment recovery must commit exactly once.
KILL_AFTER_SHARD_WRITE = "RLPIPE_TEST_KILL_AFTER_SHARD_WRITE"


# Appends of at most this many rows go to the log as a JSON line when their table fits one: past a
# few hundred rows, Arrow is the cheaper log (docs/format.md section 8 has the figures).
LINE_MAX_ROWS = 256


def _as_columns(data: Columns) -> Mapping[str, Any]:
    if isinstance(data, pa.Table | pa.RecordBatch):
        return {name: data.column(name) for name in data.schema.names}
    return data


class DatasetWriter:
    """Appends steps and episodes to a dataset directory, durably.

    Args:
        path: the dataset: a local directory or a URI (``s3://bucket/prefix``, ``gs://...``).
        observation_space: required when creating a dataset; checked against the manifest otherwise.
        action_space: as ``observation_space``.
        env_id: the gymnasium id, recorded so replay and evaluation can rebuild the env.
        config: when shards roll.
        storage_options: endpoint and credentials for a URI (deltalake's keys, such as
            ``AWS_ENDPOINT_URL``); they override the environment's.
        state_dir: the local directory of the log for a remote dataset (default
            ``$XDG_STATE_HOME/rlpipe/<hash of the URI>``).
    """

    def __init__(
        self,
        path: str | Path,
        observation_space: gym.Space[Any] | None = None,
        action_space: gym.Space[Any] | None = None,
        *,
        env_id: str | None = None,
        config: WriterConfig | None = None,
        storage_options: Mapping[str, str] | None = None,
        state_dir: str | Path | None = None,
    ) -> None:
        self.location = locate(
            Path(path).resolve() if "://" not in str(path) else path, storage_options, state_dir
        )
        self.root = self.location.uri
        self.config = config or WriterConfig()
        self.manifest = open_manifest(self.location, observation_space, action_space, env_id)
        step_schema = schema.step_schema(
            self.manifest.observation_space, self.manifest.action_space
        )
        self.writer_id = secrets.token_hex(6)
        self.recovered = self._recover()
        self._lock_fd, wal_dir = claim_log_dir(
            layout.wal_root(self.location.state_dir), self.writer_id
        )
        self._delta = {name: Table(self.location, name) for name in layout.TABLES}
        schemas = {layout.STEPS: step_schema, layout.EPISODES: schema.EPISODE_SCHEMA}
        seqs = {name: itertools.count() for name in schemas}
        self._tables = {  # (name, lines): an Arrow segment per table, and lines where they fit
            (name, lines): TableLog(name, table_schema, wal_dir, seqs[name], lines)
            for name, table_schema in schemas.items()
            for lines in (False, True)
            if not lines or rowlog.fits(table_schema)
        }
        self._wal_dir = wal_dir
        self._pending: queue.Queue[tuple[TableLog, Segment, str] | None] = queue.Queue(
            self.config.max_pending_shards
        )
        self._taken = threading.Condition()  # notified as the committer takes a shard
        self._failure: BaseException | None = None
        self.disk = storage.Disk()  # why the disk refuses writes, while it does
        self._abandoned = False  # a shard left in the log at close, for recovery
        self._closing = threading.Event()
        self._closed = threading.Event()
        self._rolling = threading.Lock()
        self._gate = threading.Condition(threading.Lock())  # guards _closed against appends
        self._appending = 0  # appends under way
        self.rows_acknowledged = 0
        self.shards_committed = 0
        self.last_commit_seconds = 0.0
        self.last_committed_at: float | None = None  # unix time of the last shard commit
        self._committer = threading.Thread(
            target=self._commit_loop, daemon=True, name="rlpipe-commit"
        )
        self._ticker = threading.Thread(target=self._tick_loop, daemon=True, name="rlpipe-roll")
        self._committer.start()
        self._ticker.start()

    def _recover(self) -> list[Recovered]:
        """Commit dead writers' logs first; a disk that refuses (full, say) leaves them as they
        are, and says so."""
        try:
            return recover(self.location)
        except OSError as error:
            where = str(error.filename or self.location.uri)
            note = (
                "; committing the logs of writers that died before: they are kept, and a "
                "writer opened once the disk takes writes again commits them"
            )
            raise StorageError(where, error, time.time(), note) from error

    @property
    def step_schema(self) -> pa.Schema:
        return self._tables[layout.STEPS, False].schema

    @property
    def backlog(self) -> int:
        """Rolled shards waiting to be written; a request finding it full waits, then gets 503."""
        return self._pending.qsize()

    def wait_backlog(self, below: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the backlog to fall below ``below``; whether it has."""
        with self._taken:
            return self._taken.wait_for(lambda: self._pending.qsize() < below, timeout_s)

    def append(self, steps: Columns) -> int:
        """Validate ``steps`` and make them durable; returns how many rows were acknowledged.

        ``steps`` is a mapping of column name to per-row values (numpy arrays, lists), or an Arrow
        batch or table; rows (mappings) become columns through
        :func:`~pipeline.format.schema.rows_to_columns`. Optional columns (agent_id, action_logp,
        policy_version, training_enabled, info, client_id, logged_at) take their defaults when
        absent.

        Raises:
            SchemaError: naming every bad row and field; nothing of this call is written.
            StorageError: the disk refused the rows (full, say); nothing of this call is
                acknowledged, and a later call tries again.
        """
        manifest = self.manifest
        return self._append(
            layout.STEPS,
            steps,
            lambda columns: schema.steps_from_columns(
                self.step_schema, columns, manifest.observation_space, manifest.action_space
            ),
        )

    def append_episodes(self, episodes: Columns) -> int:
        """Record ended episodes (one row each) in the episodes table; columns as for
        :meth:`append`."""
        return self._append(layout.EPISODES, episodes, schema.episodes_from_columns)

    def flush(self) -> None:
        """Commit everything appended so far into shards, so that readers can see it.

        Raises:
            StorageError: the disk refused a shard; its rows stay safe in the log, and the
                shard is retried in the background.
        """
        failures = self.disk.failures
        for table in self._tables.values():
            self._roll(table)
        storage.wait_committed(self._pending, self.disk, failures)
        self._raise_if_failed()

    def close(self) -> None:
        """Flush, stop the background threads and release the log. Safe to call twice. Appends
        under way in other threads are committed with the rest; later ones raise DatasetError.
        A shard the disk refuses now is tried once and left in the log, for the next writer to
        recover."""
        if self._closed.is_set():
            return
        self._closing.set()
        with self._gate:
            self._closed.set()  # no append starts from here; those under way finish
            self._gate.wait_for(lambda: not self._appending)
        try:
            self.flush()
        finally:
            self._ticker.join()  # before the committer's end: a last roll is still committed
            self._pending.put(None)
            self._committer.join()
            keep = self._failure is not None or self._abandoned
            release_log_dir(self._lock_fd, self._wal_dir, keep=keep)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(
        self, name: str, data: Columns, build: Callable[[Mapping[str, Any]], pa.RecordBatch]
    ) -> int:
        if isinstance(data, Mapping):
            written = self._append_line(name, data)
            if written is not None:
                return written
        batch = build(_as_columns(data))
        date = first_date(batch) if batch.num_rows else ""
        return self._write(
            self._tables[name, False], date, batch.num_rows, batch.serialize(), batch
        )

    def _append_line(self, name: str, given: Mapping[str, Any]) -> int | None:
        """Log a small append as one line (:mod:`pipeline.dataset.rowlog`); None when its table
        does not fit the form, or its values are not plainly valid: the caller then takes the
        Arrow path, whose checks name the problem."""
        table = self._tables.get((name, True))
        try:
            rows = len(next(iter(given.values()), ()))
        except TypeError:
            return None  # not a column of values: the full validation names it
        if table is None or not 0 < rows <= LINE_MAX_ROWS or not given.keys() <= table.given:
            return None  # also an unknown column, or logged_at given: the caller's clock
        columns = {**given, **{k: [v] * rows for k, v in table.defaults.items() if k not in given}}
        now = time.time_ns() // 1000
        try:
            checked, line = cast(rowlog.RowEncoder, table.encoder).encode(columns, now)
        except (ValueError, TypeError, KeyError):
            return None
        manifest = self.manifest
        if not (
            checks.episode_values_fit(columns)
            if name == layout.EPISODES
            else checks.step_values_fit(columns, manifest.observation_space, manifest.action_space)
        ):
            return None
        return self._write(table, date_of(now), rows, line, checked)

    def _write(self, table: TableLog, date: str, rows: int, message: Any, kept: Any) -> int:
        """One append, admitted only while the writer is open: close() waits for those under
        way before its flush, so none is acknowledged after the flush and then dropped."""
        with self._gate:
            if self._closed.is_set():
                raise DatasetError("this DatasetWriter is closed; open a new one")
            self._appending += 1
        try:
            return self._write_segment(table, date, rows, message, kept)
        finally:
            with self._gate:
                self._appending -= 1
                if not self._appending:
                    self._gate.notify_all()

    def _write_segment(self, table: TableLog, date: str, rows: int, message: Any, kept: Any) -> int:
        """One append to the table's open segment (rolled first if its date has passed)."""
        self._raise_if_failed()
        if rows == 0:
            return 0
        rolled = None
        try:
            with table.lock:
                if table.segment is not None and (table.date != date or table.segment.broken):
                    rolled = (table.detach(), table.date)  # a broken one: its written rows commit
                segment = table.segment or table.open_segment(date)
                mine = segment.write(message, rows, kept)
                if segment.rows >= self.config.max_rows or segment.bytes >= self.config.max_bytes:
                    rolled = rolled or (table.detach(), date)
            if self.config.sync == "always":
                segment.sync(mine, undo=True)  # refused: what it covered is taken back
        except OSError as error:  # the disk refused: nothing of this append is acknowledged
            raise self.disk.refused(storage.APPENDS, error, self._wal_dir) from error
        finally:
            if rolled and rolled[0] is not None:
                self._submit(table, rolled[0], rolled[1])
        if self.disk.refusals:
            self.disk.taken(storage.APPENDS)
        self.rows_acknowledged += rows if table.name == layout.STEPS else 0
        return rows

    def _roll(self, table: TableLog, max_age: float | None = None) -> None:
        # one roll at a time: a flush that finds the segment detached by the ticker waits here
        # until the ticker has queued it, so the flush then waits for its commit too
        with self._rolling:
            with table.lock:
                if table.segment is None:
                    return
                young = max_age is not None and time.monotonic() - table.rolled < max_age
                if young and not table.segment.broken:
                    return
                segment, date = table.detach(), table.date
            if segment is not None:
                self._submit(table, segment, date)

    def _submit(self, table: TableLog, segment: Segment, date: str) -> None:
        try:
            segment.close()
        except OSError as error:  # its rows are in memory: the shard is what makes them durable
            self.disk.refused(storage.APPENDS, error, segment.path)
        self._pending.put((table, segment, date))

    def _commit_loop(self) -> None:
        while (item := self._take()) is not None:
            try:
                if self._failure is None and not self._abandoned:  # in order, or not at all
                    commit = functools.partial(self._commit, *item)
                    folder = self.location.table_uri(item[0].name)
                    self._abandoned |= not storage.commit_retrying(
                        commit, self.disk, folder, self._closing
                    )
            except BaseException as error:  # surfaced on the next append or flush
                self._failure = error
            finally:
                self._pending.task_done()
        self._pending.task_done()

    def _take(self) -> tuple[TableLog, Segment, str] | None:
        item = self._pending.get()
        with self._taken:
            self._taken.notify_all()
        return item

    def _commit(self, table: TableLog, segment: Segment, date: str) -> None:
        if segment.rows:
            started = time.perf_counter()
            _, action = write_shard(
                self.location,
                table.name,
                self.writer_id,
                segment.seq,
                date,
                segment.batches,
                self.config.row_group_rows,
                self.config.row_group_bytes,
            )
            if os.environ.get(KILL_AFTER_SHARD_WRITE):  # tests: die between file and commit
                os.kill(os.getpid(), 9)
            app = layout.app_id(self.writer_id, segment.path.suffix)
            self._delta[table.name].commit(table.schema, action, app, segment.seq)
            self.last_commit_seconds = time.perf_counter() - started
            self.last_committed_at = time.time()
            self.shards_committed += 1  # last: who sees the count sees its commit's time
        segment.path.unlink()

    def _tick_loop(self) -> None:
        """Roll segments by age and, with ``sync="background"``, fsync the open ones."""
        period = min(self.config.max_age_s / 4, 0.25)
        background = self.config.sync == "background"
        if background:
            period = min(period, self.config.sync_interval_s)
        while not self._closed.wait(period):
            for table in self._tables.values():
                try:
                    segment = table.segment
                    if background and segment is not None and not segment.broken:
                        segment.sync(segment.written)  # a failure breaks it: rolled next tick
                    if not self._pending.full():  # shards refused by a full disk wait in line
                        self._roll(table, self.config.roll_age(table.name))
                except OSError as error:
                    self.disk.refused(storage.APPENDS, error, self._wal_dir)
                except BaseException as error:
                    self._failure = error
            self.disk.probe(self._wal_dir)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise DatasetError(
                f"{self.root}: committing a shard failed ({self._failure!r}); acknowledged rows "
                "are safe in the log and a new writer on this directory will recover them"
            ) from self._failure

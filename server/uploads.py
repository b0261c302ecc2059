"""Batch uploads from local-inference clients, stored exactly once however often they are retried.

A client names itself (``client_id``) and numbers its uploads (``seq``). While the server runs it
remembers which numbers each client has delivered, so a retry of an acknowledged upload is
answered without writing again. After a restart that memory is gone, so a client's uploads are
checked against the rows already in the dataset: rows whose key (episode, agent, ``t``; episode
and agent for the episodes table) is stored are dropped. Every acknowledged row is in the dataset
by then, because a new writer recovers the log of a dead one. The checks stop once an upload of
the client is stored in which no row was stored before: a client sends its spooled batches
oldest first, a split batch's parts where the batch stood (``pipeline.client.spool``), so by
then every batch the last server may have stored without answering has come again. Until then
each upload is checked: a batch that server stored whole may come back in halves.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.dataset import discovery
from pipeline.dataset.writer import DatasetWriter
from pipeline.errors import SchemaError
from pipeline.format import layout, schema
from pipeline.recording.episode import episode_id_of
from server.errors import ApiError, bad_request

_KEYS = {layout.STEPS: ["episode_id", "agent_id", "t"], layout.EPISODES: ["episode_id", "agent_id"]}
_TIMES = {layout.STEPS: "logged_at", layout.EPISODES: "ended_at"}  # set by the client, kept
_REMEMBER = 100_000  # upload numbers kept per client


def read_arrow(body: bytes) -> pa.Table:
    """An Arrow IPC stream body as a table (Arrow IPC carries data only: nothing to execute)."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(body)) as reader:  # zero-copy: no second 10 MB
            return reader.read_all()
    except (pa.ArrowInvalid, OSError) as error:
        raise ApiError(
            400, f"body: expected an Arrow IPC stream, got unreadable bytes ({error})"
        ) from None


class UploadLedger:
    """Which (client, upload number) pairs are stored; writes each upload once."""

    def __init__(self, writer: DatasetWriter) -> None:
        self._writer = writer
        self._seen: dict[str, set[int]] = defaultdict(set)
        self._caught_up: set[str] = set()  # clients whose uploads are no longer checked
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._lock = threading.Lock()
        self._clients: dict[str, set[str]] = {}  # table -> client ids stored before this run
        self._partial: dict[tuple[str, int], dict[str, int]] = {}  # tables of a failed upload

    def store(
        self,
        client_id: str,
        seq: int,
        tables: dict[str, pa.Table],
        steps_timed: bool = True,
    ) -> dict[str, Any]:
        """Write an upload's tables unless this (client, seq) was stored; returns what happened.
        ``steps_timed``: the client gave its steps' ``logged_at`` (else the server's clock set
        it, and a retry will not carry the same times)."""
        with self._lock:
            lock = self._locks[client_id]
        with lock:
            if seq in self._seen.get(client_id, ()):
                return {"stored": {name: 0 for name in tables}, "duplicate": True}
            checked = client_id not in self._caught_up
            stored_before = False  # rows of this upload the dataset held already
            stored = self._partial.pop((client_id, seq), {})  # a retry: these are in already
            for name, table in tables.items():
                if name in stored:
                    continue
                # the server, not the rows, says which client sent them: the ledger's keys
                table = _with_text(table, "agent_id", layout.DEFAULT_AGENT_ID, replace=False)
                table = _with_text(table, "client_id", client_id)
                if checked:
                    given = table.num_rows
                    table = self._unstored(
                        name, table, client_id, steps_timed or name != layout.STEPS
                    )
                    stored_before = stored_before or table.num_rows < given
                writer = self._writer
                append = writer.append if name == layout.STEPS else writer.append_episodes
                try:
                    stored[name] = append(table)
                except BaseException:  # a full disk, say: the retry skips the tables stored
                    if stored:
                        self._partial[(client_id, seq)] = stored
                    raise
            seen = self._seen[client_id]
            seen.add(seq)
            if len(seen) > _REMEMBER:
                seen.discard(min(seen))
            if checked and not stored_before:
                self._caught_up.add(client_id)
            return {"stored": stored, "duplicate": False}

    def _unstored(self, name: str, table: pa.Table, client_id: str, timed: bool) -> pa.Table:
        """The rows of ``table`` not yet in the dataset (while the client's uploads are checked).

        A retry carries the times the client gave its rows, and stored rows keep them, so only
        row groups whose time statistics overlap the upload's are read: the check costs what
        the upload's own time span holds, not the whole table (about 2 s and 150 MB of memory
        per client at a million rows, before). Unlike the reader's filters, this one trusts the
        footers' statistics (they have no checksum): a changed time statistic could let a
        retried row in twice."""
        if table.num_rows == 0 or (not timed and client_id not in self._stored_clients(name)):
            return table
        dataset = self._dataset(name)
        if dataset is None:
            return table
        keys = _KEYS[name]
        episode_ids = pc.unique(table.column("episode_id"))
        where = (ds.field("client_id") == client_id) & ds.field("episode_id").isin(episode_ids)
        if timed:
            times, column = table.column(_TIMES[name]), ds.field(_TIMES[name])
            where &= (column >= pc.min(times)) & (column <= pc.max(times))
        stored = dataset.to_table(columns=keys, filter=where)
        stored = stored.cast(table.select(keys).schema)  # ids are read as dictionaries
        if stored.num_rows == 0:
            return table
        mine = table.select(keys).append_column("_row", pa.array(range(table.num_rows)))
        marked = stored.append_column("_stored", pa.array([True] * stored.num_rows))
        joined = mine.join(marked, keys)  # left outer: unmatched rows have a null mark
        fresh = pc.filter(joined.column("_row"), pc.is_null(joined.column("_stored")))
        return table.take(np.unique(fresh.to_numpy()))

    def _dataset(self, name: str) -> ds.Dataset | None:
        """The committed files of table ``name`` as one dataset; None before the first."""
        table_schema = self._writer.step_schema if name == layout.STEPS else schema.EPISODE_SCHEMA
        return discovery.committed(self._writer.location, name, table_schema)

    def _stored_clients(self, name: str) -> set[str]:
        """The client ids a table held when the server first looked (once per table per run):
        a client not among them has nothing stored from before this run, so the first upload
        of each new client skips the scan of the whole table for its keys."""
        with self._lock:
            known = self._clients.get(name)
            if known is None:
                known = set()
                dataset = self._dataset(name)
                if dataset is not None:
                    column = dataset.to_table(columns=["client_id"]).column("client_id")
                    known = set(pc.unique(column).cast(pa.string()).to_pylist())
                self._clients[name] = known
            return known


def _with_text(table: pa.Table, name: str, value: str, replace: bool = True) -> pa.Table:
    """``table`` with ``value`` in the text column ``name`` of every row (``replace=False``: only
    when it has no such column)."""
    column = pa.repeat(pa.scalar(value, pa.string()), table.num_rows)
    if name not in table.column_names:
        return table.append_column(pa.field(name, pa.string(), nullable=False), column)
    if not replace:
        return table
    index = table.column_names.index(name)
    return table.set_column(index, table.schema.field(index).with_type(pa.string()), column)


def check_ids(tables: dict[str, pa.Table]) -> None:
    """An upload's episode and agent ids as the step verbs take them (:func:`episode_id_of`; an
    agent id is a non-empty string), so that every stored episode can be named in a URL; a
    SchemaError names the first row that breaks them. Each distinct id is checked once."""
    for table in tables.values():
        ids = _text_column(table, "episode_id")
        for value in [] if ids is None else pc.unique(ids).drop_null().to_pylist():
            try:
                episode_id_of(value)
            except SchemaError as error:
                found, row = error.problems[0], pc.index(ids, value).as_py()
                raise SchemaError.single(found.field, found.expected, found.got, row) from None
        agents = _text_column(table, "agent_id")
        if agents is not None and "" in pc.unique(agents).to_pylist():
            row = pc.index(agents, "").as_py()
            raise SchemaError.single("agent_id", "a non-empty string or null", "''", row)


def _text_column(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    """A string column of ``table``; None when it has none by that name (or of another type,
    which the writer names)."""
    if name not in table.column_names:
        return None
    kind = table.schema.field(name).type
    return (
        table.column(name) if pa.types.is_string(kind) or pa.types.is_large_string(kind) else None
    )


def json_table(writer: DatasetWriter, name: str, rows: Any) -> pa.Table:
    """A JSON upload's rows (a list of objects) checked against the table's schema."""
    if not isinstance(rows, list):
        raise bad_request(name, "a list of row objects", type(rows).__name__)
    if not all(isinstance(row, dict) for row in rows):
        raise bad_request(name, "a list of row objects", "a list with other values")
    columns = schema.rows_to_columns(rows)
    if name == layout.EPISODES:
        for key in ("started_at", "ended_at"):
            if key in columns:
                columns[key] = [_timestamp(value, f"{name}.{key}") for value in columns[key]]
        batch = schema.episodes_from_columns(columns)
    else:
        manifest = writer.manifest
        batch = schema.steps_from_columns(
            writer.step_schema, columns, manifest.observation_space, manifest.action_space
        )
    return pa.Table.from_batches([batch])


def _timestamp(value: Any, name: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise bad_request(name, "an ISO 8601 time with its zone", repr(value)) from None
    if moment.tzinfo is None:
        raise bad_request(name, "an ISO 8601 time with its zone", repr(value))
    return moment


def parse_seq(value: str | None) -> int:
    try:
        seq = int(value) if value is not None else -1
    except ValueError:
        seq = -1
    if seq < 0:
        raise bad_request("X-Rlpipe-Upload", "the upload's number, an integer >= 0", repr(value))
    return seq

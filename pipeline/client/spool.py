"""Local-inference uploads: steps buffered in memory, sent in numbered batches, spooled to disk
while the server cannot take them.

A batch is one Arrow IPC stream (the exact body of ``POST /v1/uploads``), numbered when it is made
and sent straight from memory. Only if the server does not take it (no answer, 503, a refusal) is
it written to the spool directory (dot-tmp, fsync, rename, so a crash never leaves half a file),
and retried later, oldest first, under its own client id and number; the server stores each
(client, number) once, so a batch that was stored but whose answer was lost is not stored twice.
A simulator never waits for the server.

Batches are bounded however long the server was away: each holds at most ``BATCH_ROWS`` rows and
about ``BATCH_BYTES`` bytes, far under the server's body limit (64 MiB by default), so an outage
leaves many small files, never one the server cannot take. A server configured with a smaller
limit answers 413; the batch is then split in halves, each spooled under a number of its own
derived from its parent's (``_halves``), and sent in turn. The numbers are fixed by the parent's,
so a client that crashes part way through a split and a later client that splits the same file
again make the same halves, which the server stores once.

What this guarantees: a batch the server acknowledged is durable on the server; one it did not
is never dropped while the client lives, and once spooled it survives a crash of the client too
(a later client on the same spool delivers it). Rows not yet uploaded (at most ``interval_s``
or ``max_rows`` of them, plus the batch in flight) live in memory only, and a crash of the
client process loses them. Writing every batch to disk first, with an fsync each, would narrow
that window only by the send, and cost a disk flush per batch even when the server is healthy.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from pipeline.errors import RequestRejected

BATCH_ROWS = 16_384
BATCH_BYTES = 4 * 2**20
_SPLIT_BASE = 1 << 40  # numbers from here on name the parts of batches split after a 413
_PARTS = 1 << 10  # numbers per split batch: it can be halved 9 times, into 512 parts

_log = logging.getLogger("rlpipe.client")
_NAME_RE = re.compile(r"^(?P<client>[A-Za-z0-9_-]+)-(?P<seq>\d{10,19})-(?P<table>[a-z]+)\.arrows$")

# send(client_id, seq, table, body) -> None when stored, else seconds to wait before retrying;
# it raises for a batch the server refuses (a bug to surface, not to retry).
Send = Callable[[str, int, str, bytes], float | None]


class Rows(Protocol):
    """Where complete rows wait: how many, the batches of them (taken once built), and the
    seconds until the oldest is due. ``drain(everything=False)``, the upload thread's cycle,
    leaves rows that are not yet due to their owner, which builds them in its own thread."""

    @property
    def ready(self) -> int: ...

    def drain(self, everything: bool) -> list[tuple[str, pa.RecordBatch]]: ...

    def due_in(self) -> float: ...


def to_ipc(rows: pa.RecordBatch | pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write(rows)
    return sink.getvalue()


def bounded(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch`` in slices of at most ``BATCH_ROWS`` rows and about ``BATCH_BYTES`` bytes."""
    row_bytes = max(1, batch.nbytes // max(1, batch.num_rows))
    rows = max(1, min(BATCH_ROWS, BATCH_BYTES // row_bytes))
    return [batch.slice(start, rows) for start in range(0, batch.num_rows, rows)]


def _part_of(seq: int) -> tuple[int, int]:
    """Batch ``seq`` as (its first ancestor's number, its part of that batch): the halves of
    part ``p`` are ``2p`` and ``2p + 1``, and a batch never split is its own part 1."""
    return (seq, 1) if seq < _SPLIT_BASE else divmod(seq - _SPLIT_BASE, _PARTS)


def _halves(seq: int) -> tuple[int, int] | None:
    """The numbers of the two halves of batch ``seq``; None when it was split too often."""
    block, part = _part_of(seq)
    if 2 * part + 1 >= _PARTS:
        return None
    first = _SPLIT_BASE + block * _PARTS + 2 * part
    return first, first + 1


def _place(seq: int) -> tuple[int, int]:
    """Where batch ``seq`` stands among the batches: its first ancestor's number, then where its
    rows begin in that batch's, in 1024ths."""
    block, part = _part_of(seq)
    depth = part.bit_length() - 1
    return block, (part - (1 << depth)) << (_PARTS.bit_length() - 1 - depth)


class Spool:
    """A directory of batches waiting for the server, named ``{client}-{seq}-{table}.arrows``."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def put(self, client_id: str, seq: int, table: str, body: bytes) -> Path:
        path = self.directory / f"{client_id}-{seq:010d}-{table}.arrows"
        tmp = self.directory / f".{path.name}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        return path

    def pending(self) -> list[tuple[Path, str, int, str]]:
        """Spooled batches, oldest first: (path, client id, seq, table). A split batch's parts
        stand where the batch stood, in the order of its rows: the batch the server may have
        stored without answering is the oldest, and must go first (the server checks a client's
        first uploads after a restart against what it stored; ``server.uploads``)."""
        found = []
        for path in self.directory.iterdir():
            match = _NAME_RE.match(path.name)
            if match:
                found.append((path, match["client"], int(match["seq"]), match["table"]))
        return sorted(found, key=lambda item: (*_place(item[2]), item[1]))


class Uploader:
    """Delivers the rows waiting in ``rows`` from a background thread, at least every
    ``interval_s`` (sooner when woken), as batches numbered under ``client_id``; ``on_tick`` runs
    in that thread each cycle (weights refresh)."""

    def __init__(
        self,
        client_id: str,
        rows: Rows,
        send: Send,
        spool: Spool,
        interval_s: float,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self.client_id = client_id
        self._rows, self._send, self._spool = rows, send, spool
        self._interval = interval_s
        self._on_tick = on_tick
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._busy = False
        self._seq = itertools.count()
        self._not_before = 0.0
        self._flushing = False
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rlpipe-upload")
        self._thread.start()

    def wake(self) -> None:
        """Upload now rather than at the end of the interval (enough rows are waiting)."""
        self._wake.set()

    def flush(self, timeout_s: float) -> bool:
        """Try to deliver everything now; True when nothing is left in memory or on disk."""
        deadline = time.monotonic() + timeout_s
        self._not_before = 0.0
        self._flushing = True
        try:
            while time.monotonic() < deadline and self.failure is None:
                self._wake.set()
                with self._lock:
                    self._idle.wait_for(lambda: not self._busy, timeout=0.05)
                    empty = not self._busy and not self._rows.ready
                if empty and not self._spool.pending():
                    return True
                time.sleep(0.02)
            return False
        finally:
            self._flushing = False

    def close(self, timeout_s: float) -> bool:
        delivered = self.flush(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join()
        try:
            # what is still in memory goes to disk, for a later client
            self._put(self._number(everything=True))
        except Exception as error:  # rows that cannot be built stay unsent: say so
            self.failure = self.failure or error
            _log.error("steps kept in memory could not be spooled: %s", error)
            return False
        return delivered and self.failure is None

    def _loop(self) -> None:
        while not self._stop.is_set():
            # woken by the rows' owner once it built a batch; else once the oldest row is due
            # (and a little after: an owner still calling builds it itself)
            due = max(0.0, self._rows.due_in()) + self._interval / 20
            self._wake.wait(min(self._interval, due))
            self._wake.clear()
            with self._lock:
                self._busy = True
            try:
                if self._on_tick is not None:
                    self._on_tick()
                self._cycle()
            except BaseException as error:  # surfaced to the simulator on its next call
                self.failure = error
                _log.error("upload failed: %s", error)
            finally:
                with self._lock:
                    self._busy = False
                    self._idle.notify_all()

    def _cycle(self) -> None:
        fresh = self._number(everything=self._flushing)
        if time.monotonic() < self._not_before or self._spool.pending():
            self._put(fresh)  # behind what already waits, and not before the server is ready
            fresh = []
        if time.monotonic() < self._not_before or not self._send_spooled():
            return
        for index, (seq, table, body) in enumerate(fresh):
            try:
                wait = self._send(self.client_id, seq, table, body)
            except BaseException as error:
                self._put(fresh[index:])  # a refused batch is kept, not dropped
                if not (isinstance(error, RequestRejected) and error.status == 413):
                    raise
                self._wake.set()  # too large: split from the spool in the next cycle
                return
            if wait is not None:
                self._not_before = time.monotonic() + wait
                self._put(fresh[index:])
                return

    def _send_spooled(self) -> bool:
        """Send the spooled batches, oldest first; False when the server asks to wait, or when
        a batch was split (its parts go first, in the next cycle)."""
        for path, client_id, seq, table in self._spool.pending():
            try:
                body = path.read_bytes()
            except FileNotFoundError:  # another client sharing the spool delivered it
                continue
            try:
                wait = self._send(client_id, seq, table, body)
            except RequestRejected as error:
                self._split(error, client_id, seq, table, body)
                path.unlink(missing_ok=True)
                return False
            if wait is not None:
                self._not_before = time.monotonic() + wait
                return False
            path.unlink(missing_ok=True)
        return True

    def _split(
        self, error: RequestRejected, client_id: str, seq: int, table: str, body: bytes
    ) -> None:
        """Spool the halves of a batch the server refused as too large (413), to be sent next;
        any other refusal, or a batch that cannot be halved, is raised (kept where it is)."""
        halves = _halves(seq)
        with pa.ipc.open_stream(pa.py_buffer(body)) as reader:
            rows = reader.read_all()
        if error.status != 413 or halves is None or rows.num_rows < 2:
            raise error
        middle = rows.num_rows // 2
        for number, half in zip(halves, (rows.slice(0, middle), rows.slice(middle)), strict=True):
            self._spool.put(client_id, number, table, to_ipc(half))
        self._wake.set()  # the halves go out in the next cycle, not an interval later

    def _number(self, everything: bool) -> list[tuple[int, str, bytes]]:
        """Turn waiting rows into numbered batches: a batch keeps its number for life, whether
        it is sent from memory now or from the spool by a later client instance."""
        return [
            (next(self._seq), table, to_ipc(part))
            for table, batch in self._rows.drain(everything)
            for part in bounded(batch)
        ]

    def _put(self, batches: list[tuple[int, str, bytes]]) -> None:
        for seq, table, body in batches:
            self._spool.put(self.client_id, seq, table, body)

"""Local-inference uploads: steps buffered in memory, sent in numbered batches, spooled to disk
while the server cannot take them.

A batch is one Arrow IPC stream (the exact body of ``POST /v1/uploads``), numbered when it is made
and sent straight from memory. Only if the server does not take it (no answer, 503, a refusal) is
it written to the spool directory (dot-tmp, fsync, rename, so a crash never leaves half a file),
and retried later, oldest first, under its own client id and number; the server stores each
(client, number) once, so a batch that was stored but whose answer was lost is not stored twice.
A simulator never waits for the server.

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

_log = logging.getLogger("rlpipe.client")
_NAME_RE = re.compile(r"^(?P<client>[A-Za-z0-9_-]+)-(?P<seq>\d{10})-(?P<table>[a-z]+)\.arrows$")

# send(client_id, seq, table, body) -> None when stored, else seconds to wait before retrying;
# it raises for a batch the server refuses (a bug to surface, not to retry).
Send = Callable[[str, int, str, bytes], float | None]


class Rows(Protocol):
    """Where complete rows wait: how many, and the batches of them (taken once built)."""

    @property
    def ready(self) -> int: ...

    def drain(self) -> list[tuple[str, pa.RecordBatch]]: ...


def to_ipc(batch: pa.RecordBatch) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


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
        """Spooled batches, oldest number first: (path, client id, seq, table)."""
        found = []
        for path in self.directory.iterdir():
            match = _NAME_RE.match(path.name)
            if match:
                found.append((path, match["client"], int(match["seq"]), match["table"]))
        return sorted(found, key=lambda item: (item[2], item[1]))


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
        while time.monotonic() < deadline and self.failure is None:
            self._wake.set()
            with self._lock:
                self._idle.wait_for(lambda: not self._busy, timeout=0.05)
                empty = not self._busy and not self._rows.ready
            if empty and not self._spool.pending():
                return True
            time.sleep(0.02)
        return False

    def close(self, timeout_s: float) -> bool:
        delivered = self.flush(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join()
        try:
            self._put(self._number())  # what is still in memory goes to disk, for a later client
        except Exception as error:  # rows that cannot be built stay unsent: say so
            self.failure = self.failure or error
            _log.error("steps kept in memory could not be spooled: %s", error)
            return False
        return delivered and self.failure is None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
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
        fresh = self._number()
        if time.monotonic() < self._not_before or self._spool.pending():
            self._put(fresh)  # behind what already waits, and not before the server is ready
            fresh = []
        if time.monotonic() < self._not_before:
            return
        for path, client_id, seq, table in self._spool.pending():
            try:
                body = path.read_bytes()
            except FileNotFoundError:  # another client sharing the spool delivered it
                continue
            wait = self._send(client_id, seq, table, body)
            if wait is not None:
                self._not_before = time.monotonic() + wait
                return
            path.unlink(missing_ok=True)
        for index, (seq, table, body) in enumerate(fresh):
            try:
                wait = self._send(self.client_id, seq, table, body)
            except BaseException:
                self._put(fresh[index:])  # a refused batch is kept, not dropped
                raise
            if wait is not None:
                self._not_before = time.monotonic() + wait
                self._put(fresh[index:])
                return

    def _number(self) -> list[tuple[int, str, bytes]]:
        """Turn waiting rows into numbered batches: a batch keeps its number for life, whether
        it is sent from memory now or from the spool by a later client instance."""
        return [(next(self._seq), table, to_ipc(batch)) for table, batch in self._rows.drain()]

    def _put(self, batches: list[tuple[int, str, bytes]]) -> None:
        for seq, table, body in batches:
            self._spool.put(self.client_id, seq, table, body)

"""The write-ahead log: how an append becomes durable before its shard exists.

A segment holds Arrow IPC messages (the schema, then one record batch per append), each framed
with its checksums (:mod:`pipeline.dataset.records`), written with one ``write`` per append and made
durable with ``fsync``. Appends from many threads
share fsyncs (group commit): a thread whose bytes were covered by another thread's fsync returns
without its own. After a crash, a segment is read back up to its last complete message; a torn tail
is what an unacknowledged append left behind, and is dropped; a record whose checksum fails is
damage, named in what :func:`read_segment` returns. Small appends of tables of scalars
and short lists (the server's steps) go to segments of JSON lines instead
(:mod:`pipeline.dataset.rowlog`), which share this class's writing and syncing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from pipeline.dataset import records
from pipeline.format import layout


class _Point(NamedTuple):
    """Where a segment stood: messages and bytes written, rows kept in memory."""

    written: int
    offset: int
    kept: tuple[int, ...]  # lengths of what the segment keeps for its shard; () nothing
    rows: int
    bytes: int


class Segment:
    """One open log segment: the rows of one future shard, in memory and durable on disk.

    ``write`` then ``sync`` is an acknowledged append. They are split so that the caller can
    release its own lock between them, which is what lets concurrent appends share one fsync.
    """

    def __init__(
        self, path: Path, schema: pa.Schema, seq: int, header: bytes | None = None
    ) -> None:
        self.path = path
        self.schema = schema
        self.seq = seq
        self.rows = 0
        self.bytes = 0
        self._batches: list[pa.RecordBatch] = []
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self.written = 0  # messages written: sync(written) makes all of them durable
        self.broken = False  # a write or sync failed: this file takes no more messages
        self.sync_failure: OSError | None = None  # once an fsync fails, none is trusted after
        self._synced = 0  # messages known durable
        self._offset = 0  # bytes written to the file
        self._durable = _Point(0, 0, (), 0, 0)  # where the file stood at the last good fsync
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            self.write_message(schema.serialize() if header is None else header)
            fsync_path(path.parent)  # the segment's directory entry must be durable before any ack
        except BaseException:  # a full disk, say: no segment, and no descriptor left open
            os.close(self._fd)
            path.unlink(missing_ok=True)
            raise

    def write(self, message: pa.Buffer | bytes, rows: int, kept: Any) -> int:
        """Write one append's message (it survives whole or not at all) and keep its rows for
        the shard (``kept``: what :meth:`_keep` takes); returns the message's number."""
        with self._write_lock:
            number = self.write_message(message)
            self._keep(kept)
            self.rows += rows
            self.bytes += len(memoryview(message))
        return number

    def _keep(self, kept: Any) -> None:
        self._batches.append(kept)

    @property
    def batches(self) -> list[pa.RecordBatch]:
        """Everything written, for the shard: kept in memory, so a commit reads no log."""
        return self._batches

    def sync(self, upto: int, undo: bool = False) -> None:
        """Return once message ``upto`` is durable, sharing an fsync with other threads.

        A failed fsync raises here and in every later call: Linux reports a lost write-back
        once and then marks the pages clean, so a second fsync's success proves nothing
        (PostgreSQL's "fsyncgate"). The segment takes no more messages. With ``undo`` (the
        caller refuses every append the failed fsync covered), those appends are taken back:
        the file is cut to its last durable byte and their rows are dropped, so that a retried
        append is stored once.
        """
        with self._sync_lock:
            if self.sync_failure is not None:
                raise OSError(self.sync_failure.errno, f"{self.path}: an fsync failed before")
            if self._synced >= upto:
                return  # another thread's fsync covered these bytes
            with self._write_lock:
                point = self._point()
                if self._fd < 0:
                    return  # closed, and close() synced everything
            try:
                os.fsync(self._fd)
            except OSError as error:
                self.sync_failure, self.broken = error, True
                if undo:
                    self._take_back()
                raise
            self._synced, self._durable = point.written, point

    def _point(self) -> _Point:
        return _Point(self.written, self._offset, self._kept(), self.rows, self.bytes)

    def _take_back(self) -> None:
        """Forget every message after the last durable one: cut the file there (best effort:
        the disk is failing), and drop their rows from memory."""
        with self._write_lock:
            point = self._durable
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, point.offset)
            self.written, self._offset, self.rows, self.bytes = (
                point.written,
                point.offset,
                point.rows,
                point.bytes,
            )
            self._drop(point.kept)

    def _kept(self) -> tuple[int, ...]:
        return (len(self._batches),)

    def _drop(self, kept: tuple[int, ...]) -> None:
        del self._batches[sum(kept) :]

    def close(self) -> None:
        """Make everything written durable and close; later ``sync`` calls return at once."""
        with self._write_lock:
            last = self.written
        try:
            self.sync(last)
        finally:  # closed even when the sync fails (an I/O error): the descriptor is not leaked
            with self._sync_lock, self._write_lock:
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1

    def write_message(self, buffer: pa.Buffer | bytes) -> int:
        """Append one message. After a failed write (a full disk) the file ends in part of a
        message, a torn tail that only an end of file may hold: no more go after it."""
        if self.broken:
            raise OSError(f"{self.path}: an earlier write failed part way; roll the segment")
        try:
            for part in self._record(buffer):  # a frame's header, then the message: no copy
                view = memoryview(part)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                    self._offset += written
        except BaseException:
            self.broken = True
            raise
        self.written += 1
        return self.written

    def _record(self, buffer: pa.Buffer | bytes) -> list[pa.Buffer | bytes]:
        """A message as the segment stores it, in pieces: a checksummed frame (a line
        segment's lines carry their own checksum)."""
        return records.frame(buffer, first=self.written == 0)


def claim_log_dir(base: Path, writer_id: str) -> tuple[int, Path]:
    """Lock a fresh log directory for a writer: (the lock's descriptor, the directory). A
    recovering writer tells a live writer's log by its lock (docs/format.md section 8)."""
    base.mkdir(parents=True, exist_ok=True)
    _sweep_staging(base)
    staging = base / f".new-{writer_id}"
    staging.mkdir()
    fd = os.open(staging / layout.WAL_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    final = base / writer_id
    staging.rename(final)
    fsync_path(base)  # the rename must survive a power cut, not just a kill
    return fd, final


# A claim takes microseconds; a staging directory this old belongs to a writer that died in it.
STAGING_STALE_S = 60.0


def _sweep_staging(base: Path) -> None:
    """Remove the staging directories of writers that died while claiming (they hold only a
    lock file: no rows ever reach one), unless a live writer holds its lock."""
    for staging in base.glob(".new-*"):
        try:
            if time.time() - staging.stat().st_mtime < STAGING_STALE_S:
                continue
            fd = os.open(staging / layout.WAL_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue  # gone already, or not ours to touch
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(staging, ignore_errors=True)
        except BlockingIOError:
            pass  # a live writer's
        finally:
            os.close(fd)


def release_log_dir(fd: int, directory: Path, keep: bool) -> None:
    """Remove a log after a clean flush; after a failed commit (``keep``), leave it for recovery.

    Closing the lock's descriptor drops the ``flock`` either way, which is what tells the next
    writer (or ``recover``) that these segments belong to nobody and must be committed.
    """
    if not keep:
        for leftover in layout.segments(directory):
            leftover.unlink()  # only empty segments remain after a clean flush
        (directory / layout.WAL_LOCK).unlink(missing_ok=True)
        directory.rmdir()
    os.close(fd)


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory by path; a directory's fsync makes a rename in it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_IPC_START = b"\xff\xff\xff\xff"  # how a segment written before frames starts


def read_segment(path: Path) -> records.LogRead:
    """Every sound batch of a segment, dropping a torn tail and naming damaged frames; no schema
    if the schema's frame is torn or damaged."""
    data = path.read_bytes()
    problems: list[str] = []
    if data.startswith(records.MAGIC):
        payloads, problems = records.read_frames(data)
        data = b"".join(payloads)
    elif not (records.MAGIC.startswith(data[:8]) or _IPC_START.startswith(data[:4])):
        problems = ["it starts neither as a framed segment nor as an Arrow IPC stream"]
    try:
        reader = pa.ipc.open_stream(pa.py_buffer(data))
    except (pa.ArrowInvalid, OSError):
        lost = ["every row: the schema cannot be read"] if problems else []
        return records.LogRead(None, [], problems, lost)
    found = records.LogRead(reader.schema, [], problems)
    while True:
        try:
            found.batches.append(reader.read_next_batch())
        except StopIteration:
            break
        except (pa.ArrowInvalid, OSError):
            break  # a torn tail (of a segment written before frames): never acknowledged
    return found

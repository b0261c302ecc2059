"""A disk that refuses writes: what the writer does while its dataset's disk is full.

A full disk (``ENOSPC``), a used-up quota (``EDQUOT``) or an I/O error (``EIO``) surfaces as an
``OSError`` from a log write, a segment's creation, an fsync or a shard commit. None of them
stops the writer for good: the append that could not be made durable raises
:class:`~pipeline.errors.StorageError` and a later one tries again; a shard the disk refuses keeps
its segment (its rows are acknowledged and safe in the log) and is tried again with a backoff
until the disk takes it. :class:`Disk` remembers why and since when the disk refuses, for the
server's health, metrics and 503 answers.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import StorageError

APPENDS = "appends"
SHARDS = "shards"

# A shard the disk refused is tried again after these many seconds, doubling up to the most.
RETRY_FIRST_S = 0.05
RETRY_MOST_S = 2.0
_PROBE_BYTES = 64 * 1024  # what a probe writes to see whether the disk takes appends again


class Disk:
    """Whether the dataset's disk takes writes: the latest refusal of appends and of shards."""

    def __init__(self) -> None:
        self.refusals: dict[str, StorageError] = {}  # APPENDS or SHARDS -> the latest refusal
        self.failures = 0  # writes the disk refused, of any kind

    @property
    def error(self) -> StorageError | None:
        """Why the disk refuses writes now (the older of the two kinds first), or None."""
        refusals = list(self.refusals.values())  # one step: other threads add and remove
        return min(refusals, key=lambda error: error.since, default=None)

    def refused(self, kind: str, error: OSError, path: str | Path) -> StorageError:
        """Count a write the disk refused; failing ``since`` the first of a run of them."""
        self.failures += 1
        previous = self.refusals.get(kind)
        since = time.time() if previous is None else previous.since
        self.refusals[kind] = refusal = StorageError(str(error.filename or path), error, since)
        return refusal

    def taken(self, kind: str) -> None:
        """A write of ``kind`` went through: the disk takes them again."""
        self.refusals.pop(kind, None)

    def probe(self, directory: Path) -> None:
        """While appends are refused and none come to find out, try the disk with a small file,
        so that the refusal clears once space is freed."""
        if APPENDS not in self.refusals:
            return
        probe = directory / ".probe"
        try:
            probe.write_bytes(bytes(_PROBE_BYTES))
        except OSError:
            return
        finally:
            probe.unlink(missing_ok=True)
        self.taken(APPENDS)


def commit_retrying(
    commit: Callable[[], None], disk: Disk, folder: str, closing: threading.Event
) -> bool:
    """Run ``commit`` until the disk takes it, waiting longer after each refusal; False when the
    writer began closing meanwhile (the segment stays in the log, for recovery)."""
    delay = RETRY_FIRST_S
    while True:
        try:
            commit()
        except OSError as error:
            disk.refused(SHARDS, error, folder)
            if closing.wait(delay):
                return False
            delay = min(2 * delay, RETRY_MOST_S)
        else:
            disk.taken(SHARDS)
            return True


def wait_committed(pending: queue.Queue[Any], disk: Disk, failures: int) -> None:
    """Wait until the commit thread has done every task of ``pending``.

    Raises:
        StorageError: the disk refused a shard since it had refused ``failures`` writes (the
            shard is retried in the background, or left in the log when closing).
    """
    with pending.all_tasks_done:
        while True:
            refused = disk.refusals.get(SHARDS)
            if refused is not None and disk.failures != failures:
                raise refused.noting(
                    "; acknowledged rows are safe in the log, and become a shard once the disk "
                    "takes it (or when a new writer on this directory recovers them)"
                )
            if not pending.unfinished_tasks:
                return
            pending.all_tasks_done.wait(0.05)

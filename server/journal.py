"""The journal of open episodes: what a server restarted after a ``kill -9`` needs to carry on.

Open episodes live in the server's memory (:mod:`server.episodes`); their rows are durable in
the dataset's log, but their pending steps, accrued rewards and retry memory are not. The
journal makes them as durable as the rows: each server appends JSON lines
(:mod:`server.records`) to ``DATASET/_journal/<writer>/journal-<n>.jsonl``:

- ``start`` (an episode started on its own), ``drop`` (a refused request withdrew an episode
  a record holds) and ``returns`` (log_returns), each written before its answer;
- ``pass``: a step pass's requests, with the starts of the episodes a batch opens (so a
  batch writes one record, not one more per episode it opens), and its actions, written
  *before* its rows (an intent), and ``close`` (an idle or shut-down episode closed),
  likewise; ``abort`` after one whose write failed. Records are written in order under one
  lock, and a pass holds it from its intent until its episodes have advanced, so only the
  journal's last record can be an intent whose rows may not have landed:
  :mod:`server.revival` looks for them in the dataset.

Under ``--sync always`` each record is fsynced before the rows or the answer that depend on it;
under ``background`` a thread fsyncs the journal every ``sync_interval_s``, as the writer does
its log. When a file's records after its snapshot pass ``max_bytes`` the journal rolls: the new
file starts with a snapshot of every open episode (and the answers of recently ended ones), and
the old one is deleted once the new one is fsynced. The directory is claimed under a ``flock``
like the writer's log (:func:`pipeline.dataset.wal.claim_log_dir`), so a server that finds the
lock free knows its owner is dead and adopts its episodes. A clean shutdown closes every episode and
removes the journal.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from pipeline.dataset import storage
from pipeline.dataset.wal import claim_log_dir, fsync_path, release_log_dir
from pipeline.format import layout
from pipeline.recording.episode import Episode, Returns
from server import records
from server.episodes import EpisodeBook
from server.errors import ApiError, storage_refused
from server.stepper import Request

MAX_BYTES = 4 * 2**20  # a restart replays at most this much (about a second)
REMEMBER_ENDED = 1024  # ended episodes a snapshot keeps answers for (a retry comes in seconds)


def journal_root(state_dir: str | Path) -> Path:
    """The journals of a dataset's servers, in its local state directory (the dataset itself
    when it is local: ``Location.state_dir``)."""
    return Path(state_dir) / layout.JOURNAL


def journal_files(directory: Path) -> list[Path]:
    """A journal directory's files, oldest first."""
    return sorted(directory.glob("journal-*.jsonl"))


class Journal:
    """One server's journal of the open episodes of ``book``, in the dataset's local state
    directory ``root``, under its writer id; ``sync`` and ``sync_interval_s`` are the writer's,
    and a write ``disk`` refuses is answered 503 with ``retry_after_s``, as a refused row is."""

    def __init__(
        self,
        root: str | Path,
        journal_id: str,
        book: EpisodeBook,
        sync: str,
        sync_interval_s: float,
        disk: storage.Disk,
        retry_after_s: int,
    ) -> None:
        self._book = book
        self._disk = disk
        self._retry_after = retry_after_s
        self._always = sync == "always"
        self.lock = threading.Lock()
        self._lock_fd, self.directory = claim_log_dir(journal_root(root), journal_id)
        self._fd = -1
        self._path = self.directory
        self._number = 0
        self._size = 0
        self._dirty = False
        self._broken = False  # a write failed part way: the next one rolls
        self._retired: list[Path] = []  # rolled-over files, deleted once the new one is durable
        self._roll()
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        if not self._always:
            self._syncer = threading.Thread(
                target=self._sync_loop, args=(sync_interval_s,), daemon=True, name="rlpipe-journal"
            )
            self._syncer.start()

    # --- what the server records ---------------------------------------------------------------

    def start(self, episode: Episode, record: bool = True) -> tuple[Episode, bool]:
        """:meth:`EpisodeBook.start`, recorded when it opens the episode; a batch's start
        (``record`` False) is recorded with the batch's pass (:meth:`stepping`), so a request
        that starts episodes writes one record, and waits for no pass under way."""
        if not record:
            episode.recorded = False
            return self._book.start(episode)
        with self.lock:
            episode, created = self._book.start(episode)
            if not created:
                return episode, False
            try:
                self._record_start(episode)
                return episode, True
            except ApiError as error:
                failed = error
        self._book.withdraw(episode)  # not recorded, so not opened (outside the journal's lock)
        raise failed

    def withdraw(self, episode: Episode) -> None:
        """:meth:`EpisodeBook.withdraw`, recorded if its start was (a replay withdraws it on
        the same terms)."""
        self._book.withdraw(episode)
        if not episode.recorded:
            return
        with self.lock, contextlib.suppress(ApiError):  # then the next write's roll drops it
            self._write({"k": "drop", "id": episode.episode_id})

    def add_returns(self, episode: Episode, returns: Returns) -> None:
        """log_returns (the caller holds the episode's lock): recorded first, so that a
        snapshot never holds it twice; one it refuses is refused again on replay."""
        doc = [returns.rewards, returns.infos, returns.dones]
        with self.lock:
            if not episode.recorded:  # a batch opened it, and its pass has not run yet
                self._record_start(episode)
            self._write({"k": "returns", "id": episode.episode_id, "r": doc})
            episode.add_returns(returns)

    def _record_start(self, episode: Episode) -> None:
        """An episode's start record (the caller holds the lock): snapshots hold it from now."""
        self._write({"k": "start", "e": records.start_doc(episode)})
        episode.recorded = True

    def stepping(
        self, requests: list[Request], actions: list[Any], logp: list[Any], version: int | None
    ) -> AbstractContextManager[None]:
        """Record a step pass, with the starts of the episodes it opens, before its rows are
        written; the body writes them and advances the episodes, under the journal's lock."""
        doc = {
            "k": "pass",
            "at": time.time(),
            "q": [records.request_doc(request) for request in requests],
            "a": actions,
            "l": logp,
            "v": version,
        }
        opened = [e for request in requests for e in request.steps.touched if not e.recorded]
        return self._intent(doc, opened)

    def closing(self, episode: Episode, reason: str) -> AbstractContextManager[None]:
        """Record that an episode is closed, before its rows are written (as :meth:`stepping`)."""
        doc = {"k": "close", "at": time.time(), "id": episode.episode_id, "why": reason}
        return self._intent(doc)

    @contextmanager
    def _intent(self, doc: dict[str, Any], opened: Sequence[Episode] = ()) -> Iterator[None]:
        with self.lock:
            self._write(doc)
            try:
                yield
            except BaseException:
                with contextlib.suppress(ApiError):  # failed: the next write rolls past it
                    self._write({"k": "abort"})  # the rows were refused: nothing of it holds
                raise
            for episode in opened:  # its start held: snapshots hold the episode from now on
                episode.recorded = True

    # --- files -----------------------------------------------------------------------------------

    def _write(self, doc: dict[str, Any]) -> None:
        """Append one record. After a failed write (a full disk) the file may end in part of
        a line, which only an end of file may hold: the next write rolls to a new file, whose
        snapshot also supersedes an intent whose ``abort`` could not be written."""
        line = records.dumps(doc)
        try:
            if self._broken or self._size + len(line) > MAX_BYTES:
                self._broken = True
                self._roll()
                self._broken = False
            _write_all(self._fd, line)
            self._size += len(line)
            if self._always:
                os.fsync(self._fd)
        except OSError as error:  # a full disk: 503, as for a refused row
            self._broken = True
            refused = self._disk.refused(storage.APPENDS, error, self.directory)
            raise storage_refused(refused, self._retry_after) from error
        self._dirty = not self._always

    def _roll(self) -> None:
        """A new file that starts with every open episode; the old one goes once the new one
        is durable: at once under ``always``, after the next background fsync otherwise (a
        pass does not wait for the disk)."""
        self._number += 1
        path = self.directory / f"journal-{self._number:08d}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        snapshot = {  # not the episodes a batch opened before its pass has recorded them
            "k": "snapshot",
            "episodes": [records.episode_doc(e) for e in self._book.all_open() if e.recorded],
            "ended": self._book.recently_ended(REMEMBER_ENDED),
        }
        line = records.dumps(snapshot)
        try:
            _write_all(fd, line)
        except BaseException:
            os.close(fd)
            path.unlink()
            raise
        # the records after the snapshot count towards the next roll, not the snapshot: many
        # open episodes of frames make a snapshot as large as the limit, and each record
        # after it would roll again
        old, self._fd, self._size, self._dirty = self._fd, fd, 0, True
        if old >= 0:
            os.close(old)
            self._retired.append(self._path)
        self._path = path
        if self._always:
            self._sync(fd, self._retired)
            self._retired, self._dirty = [], False

    def _sync(self, fd: int, retired: list[Path]) -> None:
        """fsync the current file; then the files it supersedes can go."""
        os.fsync(fd)
        if retired:
            fsync_path(self.directory)  # the new file's name is durable before the old go
            for path in retired:
                path.unlink()

    def _sync_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            with self.lock:
                if not self._dirty or self._fd < 0:
                    continue
                fd, self._dirty = os.dup(self._fd), False  # fsync outside the lock
                retired, self._retired = self._retired, []
            try:
                self._sync(fd, retired)
            finally:
                os.close(fd)

    def close(self, remove: bool) -> None:
        """Stop; with ``remove`` (every episode closed) delete the journal, else leave it to
        the next server to adopt. Safe to call twice."""
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join()
        with self.lock:
            if self._fd < 0:
                return
            self._sync(self._fd, self._retired)
            os.close(self._fd)
            self._fd = -1
            if remove:
                for path in journal_files(self.directory):
                    path.unlink()
            release_log_dir(self._lock_fd, self.directory, keep=not remove)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]

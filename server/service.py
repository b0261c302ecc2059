"""What the server holds, without HTTP: the writer, the open episodes, the policy, the counters.

Step requests take :class:`~server.stepper.Stepper`'s pass (the handlers of
:mod:`server.handlers` hand them over); what "durable" means follows the writer's ``sync`` mode
(see :class:`~server.config.ServerConfig`). Episodes a client abandons are closed here: by the
reaper once idle, and all of them at shutdown.

While the dataset's disk refuses writes (full), a step or upload the writer could not make durable
is answered 503 with the cause (:func:`server.errors.storage_refused`) and changes nothing, so the
client's retry works once space is back. An episode's summary row is written after its steps: if
the disk refuses it alone, the steps stand, and the summary is kept here and written as soon as
the disk takes it (before any later step, and by the reaper meanwhile).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pipeline.dataset.writer import DatasetWriter
from pipeline.errors import DatasetError, SchemaError, StorageError
from pipeline.format.schema import rows_to_columns
from pipeline.recording import recorder
from pipeline.recording.episode import Episode
from pipeline.recording.recorder import CLOSED
from server.config import ServerConfig
from server.episodes import EpisodeBook
from server.errors import ApiError, storage_refused
from server.inference import PolicyRunner
from server.metrics import Metrics
from server.revival import open_journal
from server.stats import Stats
from server.stepper import Stepper
from server.uploads import UploadLedger

_log = logging.getLogger("rlpipe.server")


class Service:
    """The server's state: the writer, the open episodes, the policy and the counters."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.writer = DatasetWriter(
            config.data,
            config.observation_space,
            config.action_space,
            env_id=config.env_id,
            config=config.writer,
            storage_options=config.storage_options,
        )
        manifest = self.writer.manifest
        self.observation_space = manifest.observation_space
        self.action_space = manifest.action_space
        self.env_id = manifest.env_id
        self.episodes = EpisodeBook()
        self.metrics = Metrics()
        self.stats = Stats()
        self.runner = PolicyRunner(
            # checkpoints are local files: a dataset on object storage has none of its own
            config.policy or (None if isinstance(config.data, str) else config.data),
            self.observation_space,
            self.action_space,
            config.policy_poll_s,
            config.seed,
        )
        self.uploads = UploadLedger(self.writer)
        self.stepper = Stepper(self)
        self._owed: list[dict[str, Any]] = []  # summaries of ended episodes the disk refused
        self._owed_lock = threading.Lock()
        self.journal = open_journal(self)  # a dead server's open episodes, adopted
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, daemon=True, name="rlpipe-reaper")
        self._reaper.start()

    def check_backlog(self) -> None:
        """503 with Retry-After when the writer stays behind: better a client waits than data is
        dropped. A request that finds ``max_backlog`` shards waiting first waits up to
        ``backlog_wait_s`` for the writer to catch up, so a moment's queue (a slow commit) is a
        slower answer, not a client asleep for all of Retry-After; a refusing disk is answered
        at once."""
        config, writer = self.config, self.writer
        if writer.backlog < config.max_backlog:
            return
        if writer.disk.error is None and writer.wait_backlog(
            config.max_backlog, config.backlog_wait_s
        ):
            return
        refused = writer.disk.error
        if refused is not None:
            raise storage_refused(refused, config.retry_after_s)
        raise ApiError(
            503,
            f"the server is {writer.backlog} shards behind in writing; retry after "
            f"{config.retry_after_s} s",
            retry_after=config.retry_after_s,
        )

    def close_episode(self, episode: Episode, end_reason: str = CLOSED) -> None:
        """Write what an abandoned episode holds: its pending steps as truncated, its summary."""
        with episode.lock:
            if episode.ended:
                return
            done = recorder.close(episode, end_reason)
            with self.journal.closing(episode, end_reason):
                self.write_rows(done.columns, done.summaries)
                recorder.settle(done)
                self.episodes.finish(episode)

    def close(self) -> None:
        """Close every open episode as truncated, then the writer. Safe to call twice."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._reaper.join()
        for episode in self.episodes.all_open():
            try:
                self.close_episode(episode)
            except ApiError as error:  # the disk refuses: its acknowledged steps are in the log
                _log.error("episode %s left open: %s", episode.episode_id, error.message)
            except Exception:  # keep closing the rest; the writer close below must happen
                _log.exception("closing episode %s failed", episode.episode_id)
        try:
            self.write_owed()
        except StorageError as error:
            _log.error("episode summaries lost, the disk refuses them: %s %s", error, self._owed)
        try:
            self.writer.close()
        except StorageError as error:  # what is acknowledged stays in the log, for the restart
            _log.error("shut down with shards not written: %s", error)
        finally:  # kept for the next server while an episode is still open
            self.journal.close(remove=len(self.episodes) == 0)

    def write_rows(self, columns: dict[str, list[Any]], summaries: list[dict[str, Any]]) -> None:
        """Make step rows (as columns) and episode summaries durable, in that order (the
        writer checks what its line route needs; the step core checked the rest)."""
        started = time.perf_counter()
        count = len(columns["episode_id"])
        try:
            if self._owed:
                self.write_owed()
            if count:
                self.writer.append(columns)
            if summaries:
                self._append_summaries(summaries, owe=count > 0)
        except StorageError as error:  # nothing of this call is written
            raise storage_refused(error, self.config.retry_after_s) from error
        if count or summaries:  # a step that completed no row appended nothing
            self.metrics.accepted(count, time.perf_counter() - started)
        if summaries:  # once per ended episode, never per step
            self.metrics.ended(len(summaries))
            self.stats.ended(summaries, self.runner.version)

    def _append_summaries(self, summaries: list[dict[str, Any]], owe: bool) -> None:
        """Summaries after their steps; ``owe``: the steps are written, so summaries the disk
        refuses are kept for :meth:`write_owed` rather than refused (a retry would write the
        steps twice)."""
        try:
            self.writer.append_episodes(rows_to_columns(summaries))
        except SchemaError as error:  # the steps are written: this must not be retried
            raise DatasetError(f"writing episode summaries failed: {error}") from error
        except StorageError as error:
            if not owe:
                raise
            _log.warning("episode summaries kept until the disk takes them: %s", error)
            with self._owed_lock:
                self._owed += summaries

    def write_owed(self) -> None:
        """Write the summaries the disk refused before (it raises StorageError while it does)."""
        with self._owed_lock:
            if self._owed:
                self.writer.append_episodes(rows_to_columns(self._owed))
                self._owed = []

    def _reap_loop(self) -> None:
        period = min(self.config.idle_timeout_s / 4, 1.0)
        while not self._stop.wait(period):
            try:
                self.write_owed()
            except StorageError:
                continue  # the disk refuses still: idle episodes are closed once it takes them
            for episode in self.episodes.idle(self.config.idle_timeout_s):
                try:
                    self.close_episode(episode)
                except Exception:
                    _log.exception("closing idle episode %s failed", episode.episode_id)

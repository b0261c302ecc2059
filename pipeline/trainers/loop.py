"""The training loops behind ``rlpipe train``: offline from history, online from a live dataset.

Offline (:mod:`pipeline.trainers.offline`, on one rank or several), the dataset is read once and
minibatches are sampled from it; this module holds what both share (:class:`Run`).

Online (``follow``), checkpoints go to ``DATASET/checkpoints`` (``RUN/checkpoints`` for a dataset
on object storage), where the server and the clients pick up the newest; the first before any
update, so clients have a policy to act with. An :class:`~pipeline.trainers.trainer.OnPolicy`
trainer (PPO) trains on the newest rows of its own versions (:func:`_online_rollouts`), any other
samples a replay buffer of everything read (:func:`_online_transitions`).

Rows of ``training_enabled=False`` episodes are stored and marked, and no loop reads them unless
``include_untrained`` (RLlib's promise: such an episode produces no training batches). The
InputReader's own filter does this, so ``rlpipe inspect`` and ``rlpipe replay`` see every row.

Both save the trainer's state (``RUN/trainer-state.npz``) with each evaluation, at least every
``STATE_EVERY_S`` seconds and when they stop, with the run's progress (``state.Progress``); a
run started again with the same ``--run-dir`` resumes from it: weights, update and version
counters, and where it was in the data. Online that is the shards whose rows the trainer holds
(in its replay buffer, or trained on): the resumed reader skips them and reads every later shard
once; rows read after the save are read again. Offline it is the minibatch sampler.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.dataset.batch import Batch
from pipeline.dataset.reader import InputReader
from pipeline.errors import ConfigError
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from pipeline.trainers import state, validation
from pipeline.trainers.buffer import ReplayBuffer
from pipeline.trainers.distributed import SINGLE, Group
from pipeline.trainers.episode_returns import EpisodeReturns
from pipeline.trainers.evaluation import evaluate as evaluate_policy
from pipeline.trainers.runlog import RunLog
from pipeline.trainers.trainer import OnPolicy, Trainer

STATE_EVERY_S = 10.0  # online PPO publishes several versions a second; its state needn't follow
POLL_S = 0.02  # how often a follower lists the dataset: a small part of an update
SCORE_EPISODES = 20  # the online score: mean return of this many most recent episodes
MAX_BATCHES = 2  # online PPO trains on at most this many batch sizes of the newest rows
MAX_UPDATES_PER_READ = 50  # off-policy updates between looks at the dataset
PUBLISH_UPDATES = 50  # off-policy versions published this often, evaluated every eval_every
_ALL_NEW_ROWS = 1 << 30  # a reader batch size no look at a live dataset fills


@dataclass(frozen=True)
class LoopSettings:
    """When to evaluate, publish and stop; see ``rlpipe train --help``."""

    data: Path | str  # a directory, or a URI (s3://bucket/prefix) for offline training
    run_dir: Path
    env_id: str | None = None
    follow: bool = False
    stop_return: float | None = None
    max_seconds: float | None = None
    max_updates: int | None = None
    batch_size: int = 256
    eval_every: int = 500
    eval_episodes: int = 5
    replay_ratio: float = 1.0
    timeout_s: float = 60.0
    seed: int = 0
    include_untrained: bool = False
    data_version: int | None = None
    storage_options: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        validation.counts(self, "batch_size", "eval_every", "eval_episodes", owner="train")
        if self.max_updates is not None:
            validation.counts(self, "max_updates", owner="train")
        given = ("max_seconds", "timeout_s", "replay_ratio")
        validation.positive(
            self, *(n for n in given if getattr(self, n) is not None), owner="train"
        )
        if self.env_id is not None:
            try:  # fail now, not at the first evaluation minutes into a run
                module, _, name = self.env_id.rpartition(":")
                if module:  # "package.module:Env-v0", as gym.make takes it: the module registers
                    importlib.import_module(module)
                gym.spec(name)
            except (gym.error.Error, ImportError) as error:
                raise ConfigError(
                    "train", "env", "a registered gymnasium id", f"{self.env_id} ({error})"
                ) from None
        version = self.data_version
        if version is not None and (not isinstance(version, int) or version < 0):
            raise ConfigError("train", "data_version", "a table version >= 0", version)
        if not isinstance(self.include_untrained, bool):
            raise ConfigError("train", "include_untrained", "a bool", self.include_untrained)

    @property
    def training_enabled(self) -> bool | None:
        """The readers' filter: rows of training_enabled episodes, or every row."""
        return None if self.include_untrained else True


class Run:
    """What both loops share: the clock, the version counter, checkpoints, state and the log."""

    def __init__(
        self, trainer: Trainer, settings: LoopSettings, log: RunLog | None, group: Group = SINGLE
    ) -> None:
        self.trainer, self.settings, self.log, self.group = trainer, settings, log, group
        # online on a local dataset, where the server looks; else (offline, or a dataset on
        # object storage: serve it with --policy RUN/checkpoints) the run's own directory
        local = "://" not in str(settings.data)
        published = Path(settings.data) if settings.follow and local else settings.run_dir
        self.publish_dir = published / "checkpoints"
        self.progress = state.Progress()
        state_file = settings.run_dir / state.STATE_FILE
        if state_file.exists():
            arrays = state.load_state(state_file)
            self.progress = state.Progress.pop(arrays, state_file)
            trainer.load_state_dict(arrays)
        latest = latest_checkpoint(self.publish_dir)
        # the state may lag the newest version; a version lost in a crash is never reused either
        self.version = max(load_checkpoint(latest).version if latest else 0, self.progress.version)
        self.updates = self.progress.updates
        if settings.max_updates is not None and self.updates >= settings.max_updates:
            raise ConfigError(
                "train",
                "max_updates",
                f"more than the {self.updates} updates {state_file} has made",
                settings.max_updates,
            )
        self.rng = np.random.default_rng(settings.seed)  # offline's minibatch sampler
        if self.progress.sampler is not None:
            self.rng.bit_generator.state = self.progress.sampler
        if group.world_size > 1:
            self._join(group)
        self._delivered = self.progress.shards  # shards the reader has yielded all rows of
        self._data_version = self.progress.data_version  # the table version they were read at
        self.start = self.saved = time.monotonic()
        # checkpoints are written off the training thread: most of a write is its two fsyncs,
        # a few ms of each online PPO update otherwise (more when other processes write)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish")
        self._written: Future[Path] | None = None
        self.last_written: Path | None = None  # the newest checkpoint written

    def _join(self, group: Group) -> None:
        """Start every rank from rank 0's weights and counters (its state file, when resumed,
        need not be on the others' disks); each other rank samples from its own seed."""
        arrays, self.updates, self.version = group.from_main(
            (self.trainer.state_dict(), self.updates, self.version) if group.main else None
        )
        if not group.main:
            self.trainer.load_state_dict(arrays)
            self.rng = np.random.default_rng([self.settings.seed, group.rank, self.updates])

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self._writer.shutdown(wait=True)
        self.wait_written()

    def publish(self, metrics: dict[str, Any], evaluate: bool = True) -> dict[str, Any]:
        """Export the next version and start saving it; with ``evaluate``, evaluate it; log.

        Versions are written one at a time, in order, each atomically as before; the next
        publish, a state save and the end of the run wait for the write and raise its error.
        The trainer's state is saved with each evaluation and at least every STATE_EVERY_S."""
        self.version += 1
        checkpoint = self.trainer.checkpoint(self.version)
        self.wait_written()
        self._written = self._writer.submit(save_checkpoint, self.publish_dir, checkpoint)
        if evaluate or time.monotonic() - self.saved >= STATE_EVERY_S:
            self.save_state()
        values: dict[str, Any] = {"update": self.updates, "version": self.version, **metrics}
        if evaluate and self.settings.env_id is not None and self.updates:
            values["eval_return"] = evaluate_policy(
                checkpoint, self.settings.env_id, self.settings.eval_episodes, self.settings.seed
            )
        return self.log.record(**values) if self.log is not None else values

    def wait_written(self) -> Path | None:
        """Wait for the checkpoint being written, raise its error; its path."""
        written, self._written = self._written, None
        if written is not None:
            self.last_written = written.result()
        return self.last_written

    def save_state(self) -> None:
        """Save the trainer's state with the run's progress: its updates, version, sampler and
        (online) the read position last :meth:`reached`."""
        self.wait_written()  # a saved state's version is never ahead of the published ones
        progress = dataclasses.replace(
            self.progress,
            updates=self.updates,
            version=self.version,
            sampler=None if self.settings.follow else self.rng.bit_generator.state,
            data_version=self._data_version,
        )
        arrays = {**self.trainer.state_dict(), state.PROGRESS: progress.to_array()}
        state.save_state(self.settings.run_dir, arrays)
        self.saved = time.monotonic()

    def reached(self, env_steps: int, trained_rows: int = 0) -> None:
        """Online: every row read so far is in the trainer (its buffer, or trained on), so a
        state saved now resumes after them."""
        self.progress = dataclasses.replace(
            self.progress,
            shards=self._delivered,
            data_version=self._data_version,
            env_steps=env_steps,
            trained_rows=trained_rows,
        )

    def follow(self, **filters: Any) -> Iterator[Batch]:
        """The live dataset as it is committed, one batch per look: everything new since the
        last (``training_enabled`` rows only, unless the run includes the others), after the
        shards of the saved read position (read at its table version, from which the reader
        follows on). Each batch's shards and table version go to the run's read log."""
        s = self.settings
        resumed = bool(self.progress.shards)
        reader = InputReader(
            s.data,
            batch_size=_ALL_NEW_ROWS,
            follow=True,
            timeout_s=s.timeout_s,
            poll_interval_s=POLL_S,
            training_enabled=s.training_enabled,
            skip_shards=tuple(self.progress.shards),
            version=self.progress.data_version if resumed else s.data_version,
            storage_options=reader_options(s),
            **filters,
        )
        for batch in reader:
            delivered = reader.shards_read
            if self.log is not None:
                self.log.read(sorted(delivered - self._delivered), len(batch), reader.version)
            self._delivered, self._data_version = delivered, reader.version
            yield batch

    def finished(self, score: float | None) -> bool:
        s = self.settings
        return (
            (s.stop_return is not None and score is not None and score >= s.stop_return)
            or (s.max_updates is not None and self.updates >= s.max_updates)
            or (s.max_seconds is not None and time.monotonic() - self.start >= s.max_seconds)
        )


def reader_options(settings: LoopSettings) -> dict[str, str] | None:
    return dict(settings.storage_options) if settings.storage_options else None


def train_online(trainer: Trainer, settings: LoopSettings, log: RunLog) -> dict[str, Any]:
    with Run(trainer, settings, log) as run:
        entry = run.publish({}, evaluate=False)  # a version for clients to act with at once
        try:
            if isinstance(trainer, OnPolicy):
                return _online_rollouts(run, trainer, entry)
            return _online_transitions(run, entry)
        finally:
            run.save_state()


def _online_rollouts(run: Run, trainer: OnPolicy, entry: dict[str, Any]) -> dict[str, Any]:
    """On-policy (PPO): an update on the rows acted by this run's versions since the last
    update, as soon as there are ``batch_size`` of them (the newest ``MAX_BATCHES * batch_size``
    when more came), and a version published after each, since the next rows should come from it.

    Rows too stale for the policy loss are read (their returns count) but not trained on, so the
    trainer stays at the front of the log however fast the clients play; and a larger batch
    costs a small network little more per gradient step than a small one, so rows the clients
    made are used, not dropped, up to that cap. The score is the mean return of the last
    SCORE_EPISODES episodes the clients played, summed from the rows read: what the clients got,
    at no cost; gymnasium evaluates only every ``eval_every`` updates."""
    s, progress = run.settings, run.progress
    if progress.min_policy_version is None:  # not resumed: this run's versions start here
        run.progress = dataclasses.replace(progress, min_policy_version=run.version)
    reader = run.follow(min_policy_version=run.progress.min_policy_version)
    returns = EpisodeReturns(SCORE_EPISODES)
    pending: list[Batch] = []
    rows, env_steps, trained = 0, progress.env_steps, progress.trained_rows
    for batch in reader:
        env_steps += len(batch)
        returns.add(batch)
        if not trainer.fresh(batch).any():
            if not pending:
                run.reached(env_steps, trained)
            continue  # all too stale for the policy loss: read past the backlog
        pending.append(batch)
        rows += len(batch)
        if rows < s.batch_size:
            continue
        newest = _by_episode(Batch.concat(pending)[max(0, rows - MAX_BATCHES * s.batch_size) :])
        metrics = trainer.update(newest)
        pending, rows, run.updates, trained = [], 0, run.updates + 1, trained + len(newest)
        run.reached(env_steps, trained)
        score = returns.mean() if returns.full else None  # a mean of 20, or none yet
        entry = run.publish(
            {
                "env_steps": env_steps,
                "rows": len(newest),
                "skipped_rows": env_steps - trained,
                "episodes": returns.count,
                "episode_return": score,
                **metrics,
            },
            evaluate=run.updates % s.eval_every == 0,
        )
        if run.finished(score):
            break
    return entry


def _by_episode(batch: Batch) -> Batch:
    """The rows grouped by episode, in ``t`` order within each, as PPO's GAE needs them: a
    client that runs several simulators uploads their steps interleaved."""
    return batch[np.lexsort((np.asarray(batch.ts), np.asarray(batch.episode_ids)))]


def _online_transitions(run: Run, entry: dict[str, Any]) -> dict[str, Any]:
    """Off-policy (and BC-like) trainers: a replay buffer of everything read, sampled.

    Each look at the dataset adds every row committed since the last one, then makes
    ``replay_ratio`` updates per new row (SB3's SAC: one gradient step per env step), at most
    MAX_UPDATES_PER_READ: clients faster than the trainer then lower the ratio, instead of
    leaving the trainer minutes behind on a backlog read oldest first. A version is published
    every PUBLISH_UPDATES updates, so clients act with a recent policy, and evaluated every
    ``eval_every``."""
    s = run.settings
    reader = run.follow()
    buffer = ReplayBuffer(seed=s.seed)
    env_steps, since_eval, since_publish = run.progress.env_steps, 0, 0
    for batch in reader:
        buffer.add(batch)
        env_steps += len(batch)
        run.reached(env_steps)
        if len(buffer) < s.batch_size:
            continue
        for _ in range(min(max(1, round(len(batch) * s.replay_ratio)), MAX_UPDATES_PER_READ)):
            metrics = run.trainer.update(buffer.sample(s.batch_size))
            run.updates += 1
            since_eval, since_publish = since_eval + 1, since_publish + 1
            evaluate = since_eval >= s.eval_every or run.finished(None)
            if not evaluate and since_publish < PUBLISH_UPDATES:
                continue
            since_eval, since_publish = (0 if evaluate else since_eval), 0
            entry = run.publish({"env_steps": env_steps, **metrics}, evaluate)
            if run.finished(entry.get("eval_return")):
                return entry
    return entry

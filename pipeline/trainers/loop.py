"""The training loops behind ``rlpipe train``: offline from history, online from a live dataset.

Offline, the whole dataset is read once (as whole episodes, through the InputReader) into memory
and minibatches are sampled from it; every ``eval_every`` updates a checkpoint goes to
``RUN/checkpoints`` (never into the dataset, which may be a shipped one) and, when the env is
known, is evaluated in gymnasium.

Online (``follow``), the reader follows the dataset ``rlpipe serve`` writes, and every checkpoint is
published into ``DATASET/checkpoints``, where the server and the clients pick up the newest. The
first one is published before any update, so clients have a policy to act with. PPO waits for
``batch_size`` rows of whole episodes logged with this run's versions, updates, publishes the
next version; episodes with no row fresh enough for PPO's policy loss (see
:mod:`pipeline.trainers.ppo`) are skipped, so a trainer that fell behind its clients catches up
with the log instead of training on its backlog. The others sample minibatches from a replay
buffer of everything read so far.

Both save the trainer's state (``RUN/trainer-state.npz``) with each checkpoint; a run started
again with the same ``--run-dir`` resumes from it.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import policy
from pipeline.batch import Batch
from pipeline.errors import ConfigError, DatasetError
from pipeline.reader import InputReader
from pipeline.trainers import state
from pipeline.trainers.buffer import ReplayBuffer
from pipeline.trainers.evaluation import evaluate
from pipeline.trainers.runlog import RunLog


@dataclass(frozen=True)
class LoopSettings:
    """When to evaluate, publish and stop; see ``rlpipe train --help``."""

    data: Path
    run_dir: Path
    env_id: str | None = None
    follow: bool = False
    stop_return: float | None = None
    max_seconds: float | None = None
    max_updates: int | None = None
    batch_size: int = 256
    eval_every: int = 500
    eval_episodes: int = 5
    replay_ratio: float = 0.25
    timeout_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch_size", "eval_every", "eval_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("train", name, "an integer >= 1", value)
        if self.max_updates is not None and self.max_updates < 1:
            raise ConfigError("train", "max_updates", "an integer >= 1", self.max_updates)
        for name in ("max_seconds", "timeout_s", "replay_ratio"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError("train", name, "a number > 0", value)


class _Run:
    """What both loops share: the clock, the version counter, checkpoints, state and the log."""

    def __init__(self, trainer: Any, settings: LoopSettings, log: RunLog) -> None:
        self.trainer, self.settings, self.log = trainer, settings, log
        self.publish_dir = (settings.data if settings.follow else settings.run_dir) / "checkpoints"
        latest = policy.latest_checkpoint(self.publish_dir)
        self.version = policy.load_checkpoint(latest).version if latest else 0
        state_file = settings.run_dir / state.STATE_FILE
        if state_file.exists():
            trainer.load_state_dict(state.load_state(state_file))
        self.start = time.monotonic()
        self.updates = 0

    def publish(self, **metrics: Any) -> dict[str, Any]:
        """Export the next version, save it and the trainer state, evaluate, log."""
        self.version += 1
        checkpoint = self.trainer.checkpoint(self.version)
        policy.save_checkpoint(self.publish_dir, checkpoint)
        state.save_state(self.settings.run_dir, self.trainer.state_dict())
        values: dict[str, Any] = {"update": self.updates, "version": self.version, **metrics}
        if self.settings.env_id is not None and self.updates:
            values["eval_return"] = evaluate(
                checkpoint, self.settings.env_id, self.settings.eval_episodes, self.settings.seed
            )
        return self.log.record(**values)

    def finished(self, score: float | None) -> bool:
        s = self.settings
        return (
            (s.stop_return is not None and score is not None and score >= s.stop_return)
            or (s.max_updates is not None and self.updates >= s.max_updates)
            or (s.max_seconds is not None and time.monotonic() - self.start >= s.max_seconds)
        )


def train_offline(trainer: Any, settings: LoopSettings, log: RunLog) -> dict[str, Any]:
    run = _Run(trainer, settings, log)
    data = Batch.concat(InputReader(settings.data, episodes=True))
    if not len(data):
        raise DatasetError(f"{settings.data}: no rows to train on")
    buffer = ReplayBuffer(capacity=max(1, len(data)), seed=settings.seed)
    buffer.add(data)
    metrics: dict[str, float] = {}
    while True:
        if trainer.algorithm == "marwil" and run.updates % settings.eval_every == 0:
            # returns bootstrap truncations from V: refresh them as V learns
            buffer.replace_rows(data.replace(extras={"returns": trainer.returns(data)}))
        metrics = trainer.update(buffer.sample(settings.batch_size))
        run.updates += 1
        if run.updates % settings.eval_every == 0 or run.finished(None):
            entry = run.publish(rows=len(data), **metrics)
            if run.finished(entry.get("eval_return")):
                return entry


def train_online(trainer: Any, settings: LoopSettings, log: RunLog) -> dict[str, Any]:
    run = _Run(trainer, settings, log)
    entry = run.publish()  # version for clients to act with before the first update
    if trainer.algorithm == "ppo":
        return _online_episodes(run, entry)
    return _online_transitions(run, entry)


def _online_episodes(run: _Run, entry: dict[str, Any]) -> dict[str, Any]:
    """PPO: rollouts of whole episodes acted by this run's versions, one update per batch."""
    s = run.settings
    reader = InputReader(s.data, episodes=True, follow=True, timeout_s=s.timeout_s,
                         min_policy_version=run.version)  # fmt: skip
    pending: list[Batch] = []
    returns: collections.deque[float] = collections.deque(maxlen=20)
    env_steps = skipped = 0
    for episode in reader:
        env_steps += len(episode)
        if bool(episode.terminateds[-1]) or bool(episode.truncateds[-1]):
            returns.append(float(np.sum(episode.rewards)))
        if not run.trainer.fresh(episode).any():
            # all too stale for the policy loss: skip the backlog rather than train on it
            skipped += len(episode)
            continue
        pending.append(episode)
        if sum(len(part) for part in pending) < s.batch_size:
            continue
        metrics = run.trainer.update(Batch.concat(pending))
        pending, run.updates = [], run.updates + 1
        score = float(np.mean(returns)) if returns else None
        entry = run.publish(
            env_steps=env_steps, skipped_rows=skipped, episode_return=score, **metrics
        )
        if run.finished(score):
            break
    return entry


def _online_transitions(run: _Run, entry: dict[str, Any]) -> dict[str, Any]:
    """Off-policy (and BC-like) trainers: a replay buffer of everything read, sampled."""
    s = run.settings
    reader = InputReader(s.data, batch_size=s.batch_size, follow=True, timeout_s=s.timeout_s)
    buffer = ReplayBuffer(seed=s.seed)
    env_steps, since_publish = 0, 0
    for batch in reader:
        buffer.add(batch)
        env_steps += len(batch)
        if len(buffer) < s.batch_size:
            continue
        for _ in range(max(1, round(len(batch) * s.replay_ratio))):
            metrics = run.trainer.update(buffer.sample(s.batch_size))
            run.updates += 1
            since_publish += 1
        if since_publish >= s.eval_every or run.finished(None):
            since_publish = 0
            entry = run.publish(env_steps=env_steps, **metrics)
            if run.finished(entry.get("eval_return")):
                break
    return entry

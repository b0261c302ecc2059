"""Remote inference: the newest published checkpoint, run on many requests' observations at once.

Requests that arrive while a pass runs queue up, and the next pass (:mod:`server.stepper`)
runs all of them with one call of :meth:`PolicyRunner.act`, so under load one matrix product
serves many clients, and a lone client never waits for company. Until a trainer publishes a
checkpoint the server samples actions uniformly, and says so in health.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.dataset.batch import length
from pipeline.errors import DatasetError
from pipeline.format import codec, samples
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy, policy_for

_log = logging.getLogger("rlpipe.server")


class PolicyRunner:
    """Holds the current policy, looks for a newer checkpoint in ``source`` (a checkpoint file,
    checkpoints directory, or dataset/run directory) every ``poll_s``, and batches forward
    passes; ``seed`` seeds the random actions. With no ``source`` (a dataset on object storage
    served without ``--policy``) it acts at random, the way every server does until a first
    checkpoint appears."""

    def __init__(
        self,
        source: Path | None,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        poll_s: float = 0.2,
        seed: int = 0,
    ) -> None:
        self.source = source
        self.observation_space = observation_space
        self.action_space = action_space
        self.policy: NumpyPolicy | None = None
        self.checkpoint_path: Path | None = None
        self.loaded_at: float | None = None  # unix time the served checkpoint was loaded
        self._skipped: Path | None = None
        self.refused: str | None = None  # why the newest checkpoint is not served (health)
        self._poll_s = poll_s
        self._checked = 0.0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.forward_passes = 0
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Load the newest checkpoint if one newer than the current has appeared."""
        now = time.monotonic()
        if not force and now - self._checked < self._poll_s:
            return
        self._checked = now
        path = None if self.source is None else latest_checkpoint(self.source)
        if path is None or path in (self.checkpoint_path, self._skipped):
            return
        try:
            policy = policy_for(load_checkpoint(path), self.observation_space, self.action_space)
        except DatasetError as error:  # a bad file must not take the server down
            _log.warning("ignoring checkpoint %s: %s", path, error)
            self._skipped, self.refused = path, f"{path.name}: {error}"
            return
        self.policy, self.checkpoint_path, self.refused = policy, path, None
        self.loaded_at = time.time()
        _log.info("serving policy version %d from %s", policy.version, path)

    @property
    def version(self) -> int | None:
        return self.policy.version if self.policy is not None else None

    def act(self, batch: Any) -> tuple[list[Any], list[float | None], int | None]:
        """Actions (JSON-ready), their log-probabilities and the policy version for a batch of
        validated observations (the space's layout: an array for a Box): one forward pass (or
        uniform draws), under a lock (the rng is shared)."""
        n = length(batch)
        if not n:
            return [], [], self.version
        discrete = isinstance(self.action_space, gym.spaces.Discrete)
        with self._lock:
            self.refresh()
            self.forward_passes += 1
            policy = self.policy
            logp: list[float | None] = [None] * n
            if policy is None:
                actions = samples.sample_batch(self.action_space, n, int(self._rng.integers(2**63)))
            elif n == 1 and discrete and isinstance(batch, np.ndarray):
                # one row: the policy's vector path costs a fraction of a batch's
                action, logp[0] = policy.act_one(batch[0], self._rng)
                return [int(action)], logp, policy.version
            else:
                actions, logp_array = policy.act(batch, self._rng)
                logp = logp_array.tolist()
        version = None if policy is None else policy.version
        if discrete:
            return np.asarray(actions, np.int64).tolist(), logp, version
        # exactly what the column will hold (and refuses a NaN a bad network made)
        column = codec.to_arrow(self.action_space, actions, field="action")
        return codec.to_json_rows(self.action_space, column), logp, version

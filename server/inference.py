"""Remote inference: the newest published checkpoint, run on many requests' observations at once.

Requests that arrive while a forward pass runs queue up, and the next pass runs all of them
together (:mod:`server.combiner`; single-agent steps of a Box space queue in the columnar step
pass of :mod:`server.columns`, others here), so under load one matrix product serves many
clients, and a lone client never waits for company. Until a trainer publishes a checkpoint the
server samples actions uniformly, and says so in health.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.errors import DatasetError
from pipeline.format import codec
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy, policy_for
from server.combiner import Combiner

_log = logging.getLogger("rlpipe.server")


@dataclass
class Actions:
    """Actions for one request's observations, as JSON-ready values."""

    actions: list[Any]
    action_logp: list[float | None]
    policy_version: int | None


class PolicyRunner:
    """Holds the current policy, reloads newer checkpoints, and batches forward passes.

    Args:
        source: checkpoint file, checkpoints directory, or dataset/run directory.
        observation_space: what the observations are validated against.
        action_space: what random actions are drawn from.
        poll_s: how often to look for a newer checkpoint.
        seed: seeds action sampling.
    """

    def __init__(
        self,
        source: Path,
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
        self._skipped: Path | None = None
        self.refused: str | None = None  # why the newest checkpoint is not served (health)
        self._poll_s = poll_s
        self._checked = 0.0
        self._rng = np.random.default_rng(seed)
        self._combiner: Combiner[pa.Array, Actions] = Combiner(self._run)
        self._lock = threading.Lock()
        self.forward_passes = 0
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        """Load the newest checkpoint if one newer than the current has appeared."""
        now = time.monotonic()
        if not force and now - self._checked < self._poll_s:
            return
        self._checked = now
        path = latest_checkpoint(self.source)
        if path is None or path in (self.checkpoint_path, self._skipped):
            return
        try:
            policy = policy_for(load_checkpoint(path), self.observation_space, self.action_space)
        except DatasetError as error:  # a bad file must not take the server down
            _log.warning("ignoring checkpoint %s: %s", path, error)
            self._skipped, self.refused = path, f"{path.name}: {error}"
            return
        self.policy, self.checkpoint_path, self.refused = policy, path, None
        _log.info("serving policy version %d from %s", policy.version, path)

    @property
    def version(self) -> int | None:
        return self.policy.version if self.policy is not None else None

    def act(self, observations: pa.Array) -> Actions:
        """Actions for validated observations (an Arrow column), batched with concurrent calls."""
        return self._combiner.submit(observations)

    def act_array(self, batch: np.ndarray) -> tuple[list[Any], list[float | None], int | None]:
        """Actions (JSON-ready), their log-probabilities and the policy version for a numpy
        batch of validated Box observations: the columnar step path's one forward pass."""
        if not len(batch):
            return [], [], self.version
        if len(batch) == 1 and isinstance(self.action_space, gym.spaces.Discrete):
            with self._lock:  # one row: the policy's vector path costs a fraction of a batch's
                self.refresh()
                policy = self.policy
                if policy is not None:
                    self.forward_passes += 1
                    action, logp = policy.act_one(batch[0], self._rng)
                    return [int(action)], [logp], policy.version
        actions, logp_list, version = self._forward(batch)
        return self._values(actions), logp_list, version

    def _run(self, batch: list[pa.Array]) -> list[Actions]:
        column = pa.concat_arrays(batch)
        space = self.observation_space
        if isinstance(space, gym.spaces.Box) and pa.types.is_fixed_size_list(column.type):
            flat = column.flatten().to_numpy(zero_copy_only=False)  # validated: no nulls
            observations = flat.reshape((len(column), *space.shape))
        else:
            observations = codec.from_arrow(space, column, field="observation")
        actions, logp, version = self._forward(observations)
        values = self._values(actions)
        results, start = [], 0
        for part in batch:
            end = start + len(part)
            results.append(Actions(values[start:end], logp[start:end], version))
            start = end
        return results

    def _values(self, actions: Any) -> list[Any]:
        if isinstance(self.action_space, gym.spaces.Discrete):
            values: list[Any] = np.asarray(actions, np.int64).tolist()  # in range by construction
            return values
        # exactly what the column will hold (and refuses a NaN a bad network made)
        return codec.to_arrow(self.action_space, actions, field="action").to_pylist()

    def _forward(self, observations: Any) -> tuple[Any, list[float | None], int | None]:
        """One forward pass (or uniform draws), under a lock: the policy's ``rng`` is shared
        by the columnar path and the general one."""
        with self._lock:
            self.refresh()
            self.forward_passes += 1
            policy = self.policy
            n = len(observations) if not isinstance(observations, dict | tuple) else None
            if policy is None:
                n = n if n is not None else _length(observations)
                seed = int(self._rng.integers(2**63))
                return codec.sample_batch(self.action_space, n, seed), [None] * n, None
            actions, logp = policy.act(observations, self._rng)
            return actions, logp.tolist(), policy.version


def _length(batch: Any) -> int:
    """Rows in a batch of a Dict or Tuple space (a dict or tuple of batches)."""
    first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return _length(first) if isinstance(first, dict | tuple) else len(first)

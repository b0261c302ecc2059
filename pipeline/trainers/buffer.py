"""Rows held in memory for trainers that sample them more than once (offline data, SAC's replay)."""

from __future__ import annotations

import numpy as np

from pipeline.dataset.batch import Batch
from pipeline.errors import ConfigError


class ReplayBuffer:
    """The newest ``capacity`` rows; ``sample(n)`` draws n of them uniformly, with replacement."""

    def __init__(self, capacity: int = 1_000_000, seed: int = 0) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError("ReplayBuffer", "capacity", "an integer >= 1", capacity)
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self._pending: list[Batch] = []
        self._rows = Batch()

    def __len__(self) -> int:
        return len(self._rows) + sum(len(batch) for batch in self._pending)

    def add(self, batch: Batch) -> None:
        if len(batch):
            self._pending.append(batch)

    @property
    def rows(self) -> Batch:
        """Everything held, as one Batch (joined lazily: adding is cheap, sampling joins once)."""
        if self._pending:
            joined = Batch.concat(
                [self._rows, *self._pending] if len(self._rows) else self._pending
            )
            self._pending = []
            self._rows = joined[max(0, len(joined) - self.capacity) :]
        return self._rows

    def sample(self, n: int) -> Batch:
        rows = self.rows
        return rows[self.rng.integers(len(rows), size=n)]

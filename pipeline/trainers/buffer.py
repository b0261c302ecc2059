"""Rows held in memory for trainers that sample them more than once (offline data, SAC's replay).

Batches arrive from the :class:`~pipeline.reader.InputReader` (episodes, shuffled or live
transitions); the buffer joins them into one Batch and hands out seeded random minibatches. It
keeps the newest ``capacity`` rows, as a replay buffer does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pipeline.batch import Batch
from pipeline.errors import ConfigError


def concat(batches: Iterable[Batch]) -> Batch:
    """One Batch with the rows of all, in order; a field missing from any batch is dropped."""
    parts = list(batches)
    if not parts:
        return Batch()
    fields = {
        name: _join([getattr(part, name) for part in parts])
        for name in Batch.__dataclass_fields__
        if name != "extras" and all(getattr(part, name) is not None for part in parts)
    }
    shared = set.intersection(*(set(part.extras) for part in parts))
    extras = {key: _join([part.extras[key] for part in parts]) for key in sorted(shared)}
    return Batch(**fields, extras=extras)


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
            joined = concat([self._rows, *self._pending] if len(self._rows) else self._pending)
            self._pending = []
            self._rows = joined[max(0, len(joined) - self.capacity) :]
        return self._rows

    def replace_rows(self, rows: Batch) -> None:
        """Swap in the same rows with new extras (MARWIL's returns, recomputed)."""
        self._pending, self._rows = [], rows

    def sample(self, n: int) -> Batch:
        rows = self.rows
        return rows[self.rng.integers(len(rows), size=n)]


def _join(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, Mapping):
        return {key: _join([value[key] for value in values]) for key in first}
    if isinstance(first, tuple):
        return tuple(_join([value[i] for value in values]) for i in range(len(first)))
    return np.concatenate([np.asarray(value) for value in values])

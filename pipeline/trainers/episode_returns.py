"""The score of an online run: returns of the episodes the clients played, as their rows arrive."""

from __future__ import annotations

import collections

import numpy as np

from pipeline.dataset.batch import Batch


class EpisodeReturns:
    """Returns of the episodes the clients played, summed from their rows as they are read.

    Rows of an episode may come in any number of batches, in any order; an episode counts once all
    its rows have come (``t`` = 0 .. its terminal row's), so a score never includes half an
    episode. An episode whose first rows were filtered out (acted before this run's first
    version) never completes, and never counts."""

    def __init__(self, window: int) -> None:
        self.recent: collections.deque[float] = collections.deque(maxlen=window)
        self.count = 0
        self._open: dict[str, list[float]] = {}  # episode_id -> [return so far, rows, length]

    def add(self, batch: Batch) -> None:
        """Sums by episode with numpy, not by run of rows in Python: clients that step several
        simulators interleave their rows, so runs are single rows (a fifth of the loop's own
        time per update, measured). Episodes complete in the order of their last rows."""
        ids = np.asarray(batch.episode_ids)
        if not len(ids):
            return
        ends = np.asarray(batch.terminateds, bool) | np.asarray(batch.truncateds, bool)
        ts, rewards = np.asarray(batch.ts, np.int64), np.asarray(batch.rewards, np.float64)
        keys, inverse = np.unique(ids, return_inverse=True)
        sums = np.bincount(inverse, weights=rewards, minlength=len(keys))
        counts = np.bincount(inverse, minlength=len(keys))
        lengths = np.full(len(keys), -1, np.int64)
        np.maximum.at(lengths, inverse[ends], ts[ends] + 1)
        last_row = np.zeros(len(keys), np.int64)
        np.maximum.at(last_row, inverse, np.arange(len(ids)))
        for k in np.argsort(last_row):
            key = str(keys[k])
            total = self._open.setdefault(key, [0.0, 0, -1])
            total[0] += float(sums[k])
            total[1] += int(counts[k])
            if lengths[k] >= 0:
                total[2] = int(lengths[k])
            if total[1] == total[2]:
                del self._open[key]
                self.recent.append(total[0])
                self.count += 1

    @property
    def full(self) -> bool:
        return len(self.recent) == self.recent.maxlen

    def mean(self) -> float | None:
        return float(np.mean(self.recent)) if self.recent else None

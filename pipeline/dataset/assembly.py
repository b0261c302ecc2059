"""Assembling whole episodes from step rows that arrive in any order, across any number of shards.

An episode (one agent's, in multi-agent logs) is complete when its last row (terminated or
truncated) has arrived and so have all the rows before it: ``t`` runs 0..T without gaps. The format
guarantees every episode ends on such a row: the server writes the last step of an episode it closes
as truncated. Episodes still incomplete when the data ends (a dataset cut mid-episode) come out
last.

Work is per chunk, not per row or per episode: a chunk is grouped by (episode, agent) with one
hash factorization and one gather, so each episode costs a few array slices. (Grouping rows one
Arrow ``take`` per episode cost ~1.4 ms an episode, which starved an online PPO trainer.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipeline.dataset.batch import Batch


@dataclass
class _Partial:
    pieces: list[Batch] = field(default_factory=list)
    rows: int = 0
    last_t: int | None = None  # t of the terminal row, once seen


class EpisodeAssembler:
    """Feed it Batches of step rows; it hands back each episode as a Batch sorted by ``t``, once.

    The Batches need ``episode_ids``, ``agent_ids``, ``ts``, ``terminateds`` and ``truncateds``.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[str, str], _Partial] = {}

    def add(self, batch: Batch) -> Iterator[Batch]:
        keys, groups = _group(batch.episode_ids, batch.agent_ids)
        order = np.argsort(groups, kind="stable")
        bounds = np.searchsorted(groups[order], np.arange(len(keys) + 1))
        grouped = batch[order]
        ends = np.asarray(grouped.terminateds) | np.asarray(grouped.truncateds)
        ts = np.asarray(grouped.ts)
        for index, key in enumerate(keys):
            start, stop = int(bounds[index]), int(bounds[index + 1])
            partial = self._open.setdefault(key, _Partial())
            partial.pieces.append(grouped[start:stop])
            partial.rows += stop - start
            terminal = ts[start:stop][ends[start:stop]]
            if len(terminal):
                partial.last_t = int(terminal.max())
            if partial.last_t is not None and partial.rows >= partial.last_t + 1:
                del self._open[key]
                yield _sorted(partial)

    def remaining(self) -> Iterator[Batch]:
        """Episodes that never completed, in first-seen order; the assembler is empty afterwards."""
        partials, self._open = self._open, {}
        for partial in partials.values():
            yield _sorted(partial)


def _group(
    episode_ids: np.ndarray, agent_ids: np.ndarray
) -> tuple[list[tuple[str, str]], np.ndarray]:
    """The distinct (episode, agent) pairs of a chunk, and each row's index into them."""
    episode_codes, episodes = pd.factorize(episode_ids)
    agent_codes, agents = pd.factorize(agent_ids)
    combined = episode_codes.astype(np.int64) * len(agents) + agent_codes
    pairs, groups = np.unique(combined, return_inverse=True)
    keys = [(str(episodes[p // len(agents)]), str(agents[p % len(agents)])) for p in pairs]
    return keys, groups.ravel()


def _sorted(partial: _Partial) -> Batch:
    episode = Batch.concat(partial.pieces)
    ts = np.asarray(episode.ts)
    if len(ts) > 1 and not bool(np.all(ts[1:] > ts[:-1])):
        episode = episode[np.argsort(ts, kind="stable")]
    return episode

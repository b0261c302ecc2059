"""Where a foreign format's episodes begin and end: rows grouped by episode key (and agent) in
order of first appearance, source order kept inside each group, and a group cut after every row
that ends an episode. How each ended follows gymnasium's distinction (``gymnasium/core.py``,
``Env.step``): explicit ``terminated``/``truncated`` columns are taken as they are; an old-style
``done`` (RLlib's ``dones``, D4RL's ``terminals`` without ``timeouts``) is ``truncated`` when the
episode reached the env's time limit and ``terminated`` otherwise; an episode whose rows simply
stop (the key changes, or the data ends) is ``truncated``, because nothing says the env ended it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.format import layout

if TYPE_CHECKING:
    from pipeline.importers.transitions import SourceSteps


@dataclass(frozen=True)
class Boundaries:
    """The source rows regrouped into episodes: per-row arrays in ``order``, per-episode lists."""

    order: np.ndarray
    episode_ids: np.ndarray
    agent_ids: np.ndarray
    ts: np.ndarray
    terminateds: np.ndarray
    truncateds: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def split(steps: SourceSteps, max_episode_steps: int | None) -> Boundaries:
    """Group rows into episodes and decide how each ended (see the module docstring)."""
    n = len(steps.episode_keys)
    keys = steps.episode_keys.astype(str)
    agents = (
        steps.agent_ids.astype(str)
        if steps.agent_ids is not None
        else np.full(n, layout.DEFAULT_AGENT_ID)
    )
    _, first, inverse = np.unique(
        np.char.add(np.char.add(keys, "\x00"), agents), return_index=True, return_inverse=True
    )
    group = np.argsort(np.argsort(first))[inverse.ravel()]  # groups numbered by first appearance
    order = np.argsort(group, kind="stable")
    ended = _ended(steps)[order]
    group = group[order]
    boundary = np.ones(n, dtype=bool)  # True where a row is the last of its episode
    if n:
        boundary[:-1] = ended[:-1] | (group[1:] != group[:-1])
    ends = np.flatnonzero(boundary) + 1
    starts = np.r_[0, ends[:-1]] if n else np.zeros(0, dtype=np.int64)
    lengths = ends - starts
    episode_of_row = np.repeat(np.arange(len(starts)), lengths)
    ts = np.arange(n) - np.repeat(starts, lengths)
    terminateds, truncateds = _end_flags(steps, order, starts, ends, max_episode_steps)
    return Boundaries(
        order=order,
        episode_ids=_episode_ids(keys[order], group, starts, episode_of_row),
        agent_ids=agents[order],
        ts=ts,
        terminateds=terminateds,
        truncateds=truncateds,
        starts=starts,
        ends=ends,
    )


def _ended(steps: SourceSteps) -> np.ndarray:
    n = len(steps.episode_keys)
    if steps.terminateds is not None or steps.truncateds is not None:
        return _flag(steps.terminateds, n) | _flag(steps.truncateds, n)
    return _flag(steps.dones, n)


def _flag(values: np.ndarray | None, n: int) -> np.ndarray:
    return np.zeros(n, dtype=bool) if values is None else np.asarray(values, dtype=bool)


def _end_flags(
    steps: SourceSteps, order: np.ndarray, starts: np.ndarray, ends: np.ndarray, limit: int | None
) -> tuple[np.ndarray, np.ndarray]:
    n = len(order)
    last = ends - 1
    explicit = steps.terminateds is not None or steps.truncateds is not None
    if explicit:
        terminateds = _flag(steps.terminateds, n)[order]
        truncateds = _flag(steps.truncateds, n)[order]
    else:
        terminateds, truncateds = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        done = _flag(steps.dones, n)[order][last]
        reached = np.zeros(len(last), dtype=bool)
        if limit is not None:
            source_t = steps.ts[order][last] if steps.ts is not None else last - starts
            reached = source_t + 1 >= limit
        terminateds[last] = done & ~reached
        truncateds[last] = done & reached
    cut = ~(terminateds[last] | truncateds[last])  # rows stop with no end flag: the data was cut
    truncateds[last[cut]] = True
    return terminateds, truncateds


def _episode_ids(
    keys: np.ndarray, group: np.ndarray, starts: np.ndarray, episode_of_row: np.ndarray
) -> np.ndarray:
    """The source's key; a key that holds several episodes gets ``-1``, ``-2`` on the later ones."""
    first_of_group = np.r_[True, group[starts][1:] != group[starts][:-1]] if len(starts) else []
    index_in_group = np.arange(len(starts)) - np.maximum.accumulate(
        np.where(first_of_group, np.arange(len(starts)), 0)
    )
    names = keys[starts].astype(object)
    later = index_in_group > 0
    pairs = zip(names[later], index_in_group[later], strict=True)
    names[later] = [f"{key}-{i}" for key, i in pairs]
    return names.astype(str)[episode_of_row] if len(starts) else keys

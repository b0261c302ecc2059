"""Discounted returns and generalized advantage estimation, over rows of whole episodes.

Rows come in time order, each episode's rows contiguous (as ``InputReader(episodes=True)`` yields
them, concatenated). An episode's last row in the batch is where it *ends*: a terminated row, a
truncated row, the row before another ``episode_id`` starts, or the batch's last row. What follows
an end depends on why it ended (Gymnasium's ``Env.step`` contract; Pardo et al. 2018, "Time Limits
in Reinforcement Learning"):

- terminated: the state is absorbing, so nothing follows it: the return is the reward;
- anything else (truncated by a time limit, cut by the end of the batch or of the log): the episode
  would have gone on, so the return bootstraps from ``V(next_observation)`` of that row.

This is why the functions take ``next_values`` (``V(next_observation)`` for every row) rather than
one value per episode: the value of a truncated row's next observation is the only correct
bootstrap, and it is a different observation from the next episode's first one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import ConfigError


def episode_ends(
    terminateds: Any, truncateds: Any, episode_ids: Any = None, ts: Any = None
) -> np.ndarray:
    """True on each episode's last row in the batch (see the module docstring); with ``ts``, also
    before a gap or jump in ``t`` (fragments of one episode that arrived apart)."""
    terminated = np.asarray(terminateds, dtype=bool)
    ends = terminated | np.asarray(truncateds, dtype=bool)
    if episode_ids is not None:
        ids = np.asarray(episode_ids)
        ends[:-1] |= ids[:-1] != ids[1:]
        if ts is not None:
            t = np.asarray(ts, np.int64)
            ends[:-1] |= t[1:] != t[:-1] + 1
    if len(ends):
        ends[-1] = True
    return ends


def discounted_returns(
    rewards: Any,
    terminateds: Any,
    truncateds: Any,
    gamma: float,
    *,
    next_values: Any = None,
    episode_ids: Any = None,
) -> np.ndarray:
    """Monte Carlo returns ``G_t = r_t + gamma * G_{t+1}``, per episode.

    An episode that ends without terminating bootstraps from ``next_values`` at its last row
    (zero when ``next_values`` is None, which is plain Monte Carlo over what was logged).
    """
    _check_gamma("gamma", gamma)
    reward = np.asarray(rewards, dtype=np.float64)
    terminated = np.asarray(terminateds, dtype=bool)
    ends = episode_ends(terminated, truncateds, episode_ids)
    bootstrap = (
        np.zeros_like(reward) if next_values is None else np.asarray(next_values, np.float64)
    )
    out = np.zeros_like(reward)
    following = 0.0
    for t in range(len(reward) - 1, -1, -1):
        if ends[t]:
            following = 0.0 if terminated[t] else bootstrap[t]
        following = reward[t] + gamma * following
        out[t] = following
    return out


def gae(
    rewards: Any,
    values: Any,
    next_values: Any,
    terminateds: Any,
    truncateds: Any,
    gamma: float,
    gae_lambda: float,
    *,
    episode_ids: Any = None,
    ts: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and value targets by GAE (Schulman et al. 2016, eq. 16).

    ``delta_t = r_t + gamma * (1 - terminated_t) * V(next_observation_t) - V(observation_t)``,
    ``A_t = delta_t + gamma * lambda * A_{t+1}`` within an episode, restarting at each end.

    Returns:
        (advantages, returns) where returns = advantages + values (the value targets).
    """
    _check_gamma("gamma", gamma)
    _check_gamma("gae_lambda", gae_lambda)
    reward = np.asarray(rewards, dtype=np.float64)
    value = np.asarray(values, dtype=np.float64)
    next_value = np.asarray(next_values, dtype=np.float64)
    terminated = np.asarray(terminateds, dtype=bool)
    ends = episode_ends(terminated, truncateds, episode_ids, ts)
    deltas = reward + gamma * np.where(terminated, 0.0, next_value) - value
    advantages = np.zeros_like(reward)
    following = 0.0
    for t in range(len(reward) - 1, -1, -1):
        if ends[t]:
            following = 0.0
        following = deltas[t] + gamma * gae_lambda * following
        advantages[t] = following
    return advantages, advantages + value


def _check_gamma(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ConfigError("returns", name, "a number in [0, 1]", value)

"""Evaluating a checkpoint in gymnasium, with the same numpy policy the clients act with.

Evaluating through :class:`pipeline.policy.NumpyPolicy` rather than the trainer's torch networks
also checks the export: a checkpoint that evaluates well is one that clients can use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.policy.checkpoint import Checkpoint
from pipeline.policy.network import NumpyPolicy


def evaluate(checkpoint: Checkpoint, env_id: str, episodes: int = 5, seed: int = 0) -> float:
    """Mean undiscounted return of ``episodes`` greedy episodes (``explore=False``)."""
    policy = NumpyPolicy(checkpoint)
    rng = np.random.default_rng(seed)
    return greedy_return(lambda x: policy.act_one(x, rng, explore=False)[0], env_id, episodes, seed)


def greedy_return(act: Callable[[Any], Any], env_id: str, episodes: int, seed: int) -> float:
    """Mean undiscounted return of ``episodes`` episodes of ``act`` (observation -> action),
    reset with seeds ``seed``, ``seed + 1``, ...: the same start states every time."""
    env = gym.make(env_id)
    total = 0.0
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode)
            ended = False
            while not ended:
                observation, reward, terminated, truncated, _ = env.step(act(observation))
                total += float(reward)
                ended = terminated or truncated
    finally:
        env.close()
    return total / episodes

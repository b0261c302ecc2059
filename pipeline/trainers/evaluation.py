"""Evaluating a checkpoint in gymnasium, with the same numpy policy the clients act with.

Evaluating through :class:`pipeline.policy.NumpyPolicy` rather than the trainer's torch networks
also checks the export: a checkpoint that evaluates well is one that clients can use.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from pipeline.policy.checkpoint import Checkpoint
from pipeline.policy.network import NumpyPolicy


def evaluate(checkpoint: Checkpoint, env_id: str, episodes: int = 5, seed: int = 0) -> float:
    """Mean undiscounted return of ``episodes`` greedy episodes (``explore=False``)."""
    policy = NumpyPolicy(checkpoint)
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    total = 0.0
    try:
        for episode in range(episodes):
            observation, _ = env.reset(seed=seed + episode)
            ended = False
            while not ended:
                action, _ = policy.act_one(observation, rng, explore=False)
                observation, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                ended = terminated or truncated
    finally:
        env.close()
    return total / episodes

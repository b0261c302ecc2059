"""Datasets and checks for the trainer tests: tasks small enough to learn in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from conftest import play

from pipeline import DatasetWriter, InputReader
from pipeline.dataset.batch import Batch


def balance(observation: np.ndarray) -> int:
    """A scripted CartPole controller that holds the pole for the full 500 steps."""
    return int(observation[2] + 0.5 * observation[3] > 0)


def scripted_cartpole(path: Path, steps: int, epsilon: float, seed: int = 0) -> Path:
    """CartPole rows from the scripted controller, taking a random action with prob. epsilon.

    Episodes are cut at 200 steps by gymnasium's TimeLimit, so the data holds truncations; the
    last one is cut where ``steps`` ends, and ends truncated too.
    """
    env = gym.make("CartPole-v1", max_episode_steps=200)
    rng = np.random.default_rng(seed)

    def policy(observation: np.ndarray) -> int:
        return int(rng.integers(2)) if rng.random() < epsilon else balance(observation)

    columns: dict[str, list[Any]] = {}
    while len(columns.get("t", ())) < steps:
        left = steps - len(columns.get("t", ()))
        first = seed if not columns else None
        episode = play(
            env, policy, f"e{len(set(columns.get('episode_id', ())))}", first, max_steps=left
        )
        for key, values in episode.items():
            columns.setdefault(key, []).extend(values)
    with DatasetWriter(path, env.observation_space, env.action_space, env_id="CartPole-v1") as w:
        w.append(columns)
    env.close()
    return path


def bandit(
    path: Path, steps: int, discrete: bool, seed: int = 0, expert: bool = False, untrained: int = 0
) -> Path:
    """One-step episodes with observation s in [-1, 1]; logged actions random, or near the best
    when ``expert``.

    Box actions: reward -(a - s)^2, best a = s. Discrete(2): reward 1 when a == (s > 0).
    ``untrained`` more episodes follow, marked ``training_enabled=False``, whose actions are the
    worst there are: a trainer that learns from them learns the opposite of the expert.
    """
    rng = np.random.default_rng(seed)
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    s = rng.uniform(-1, 1, (steps, 1)).astype(np.float32)
    if discrete:
        action_space: gym.Space[Any] = gym.spaces.Discrete(2)
        actions: np.ndarray = rng.integers(2, size=steps)
        if expert:
            actions = (s[:, 0] > 0).astype(np.int64)
        rewards = (actions == (s[:, 0] > 0)).astype(np.float64)
    else:
        action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        actions = rng.uniform(-1, 1, (steps, 1)).astype(np.float32)
        if expert:
            actions = np.clip(s + 0.1 * rng.standard_normal((steps, 1)), -1, 1).astype(np.float32)
        rewards = -((actions - s) ** 2)[:, 0].astype(np.float64)
    with DatasetWriter(path, observation_space, action_space) as writer:
        writer.append(
            {
                "episode_id": [f"e{i}" for i in range(steps)],
                "t": np.zeros(steps, np.int64),
                "observation": s,
                "action": actions,
                "reward": rewards,
                "next_observation": s,
                "terminated": np.ones(steps, bool),
                "truncated": np.zeros(steps, bool),
            }
        )
        if untrained:
            writer.append(_worst_bandit_rows(untrained, discrete, rng))
    return path


def _worst_bandit_rows(n: int, discrete: bool, rng: np.random.Generator) -> dict[str, Any]:
    s = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    if discrete:
        actions: np.ndarray = (s[:, 0] <= 0).astype(np.int64)
        rewards = np.zeros(n)
    else:
        actions = np.where(s > 0, -1.0, 1.0).astype(np.float32)
        rewards = -((actions - s) ** 2)[:, 0].astype(np.float64)
    return {
        "episode_id": [f"u{i}" for i in range(n)],
        "t": np.zeros(n, np.int64),
        "observation": s,
        "action": actions,
        "reward": rewards,
        "next_observation": s,
        "terminated": np.ones(n, bool),
        "truncated": np.zeros(n, bool),
        "training_enabled": np.zeros(n, bool),
    }


def bandit_reward(actions: np.ndarray, s: np.ndarray, discrete: bool) -> float:
    if discrete:
        return float((actions == (s[:, 0] > 0)).mean())
    return float(-((actions.reshape(-1, 1) - s) ** 2).mean())


def logged_play(path: Path, env_id: str, episodes: int, seed: int = 0) -> Path:
    """Random play of ``env_id`` as clients acting with policy version 1 log it (with an
    ``action_logp``), episodes cut at 50 steps; every second one ``training_enabled=False``."""
    env = gym.make(env_id)
    with DatasetWriter(path, env.observation_space, env.action_space) as writer:
        for episode in range(episodes):
            env.action_space.seed(seed * 1000 + episode)
            columns = play(
                env,
                lambda _: env.action_space.sample(),
                f"e{episode}",
                seed * 1000 + episode,
                max_steps=50,
            )
            n = len(columns["t"])
            writer.append(
                {
                    **columns,
                    "action_logp": [-0.7] * n,
                    "policy_version": [1] * n,
                    "training_enabled": [episode % 2 == 0] * n,
                }
            )
    env.close()
    return path


def count_rows(path: Path, **filters: Any) -> int:
    return sum(len(batch) for batch in InputReader(path, columns=["t"], **filters))


def read_all(path: Path) -> Batch:
    """The whole dataset as one Batch of whole episodes in t order."""
    return Batch.concat(InputReader(path, episodes=True))


def rllib_cartpole(source: Path, path: Path) -> Path:
    """RLlib's recorded CartPole Parquet (old API: ``dones``, 200-step episodes) as a dataset,
    imported as ``rlpipe import rllib-parquet --max-episode-steps 200`` does.

    RLlib's ``dones`` mixes both endings: a done at the 200-step limit is a truncation, any
    earlier one a termination.
    """
    from pipeline.importers.rllib import read_ray_data
    from pipeline.importers.transitions import write_dataset

    write_dataset(
        read_ray_data(source, "parquet"), path, env_id="CartPole-v1", max_episode_steps=200
    )
    return path

"""Factories for spaces, step rows and datasets, shared by the tests."""

from __future__ import annotations

import os

# Tests share 2 cores with servers and clients they start as subprocesses (which inherit this):
# torch's default of one thread per core makes small-network updates ~15x slower here.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from pipeline import DatasetWriter, WriterConfig


def cartpole_rollout(steps: int, seed: int = 0, client_id: str = "c0") -> dict[str, Any]:
    """Real CartPole transitions from a random policy, as step-table columns."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    columns: dict[str, list[Any]] = {
        key: []
        for key in (
            "episode_id", "t", "observation", "action", "reward", "next_observation",
            "terminated", "truncated",
        )
    }  # fmt: skip
    observation, _ = env.reset(seed=seed)
    episode, t = 0, 0
    for _ in range(steps):
        action = int(rng.integers(2))
        next_observation, reward, terminated, truncated, _ = env.step(action)
        row = (f"{client_id}-{seed}-{episode}", t, observation, action, float(reward),
               next_observation, terminated, truncated)  # fmt: skip
        for key, value in zip(columns, row, strict=True):
            columns[key].append(value)
        observation, t = next_observation, t + 1
        if terminated or truncated:
            observation, _ = env.reset()
            episode, t = episode + 1, 0
    env.close()
    out: dict[str, Any] = {key: np.asarray(value) for key, value in columns.items()}
    out["client_id"] = np.full(steps, client_id)
    return out


def cartpole_spaces() -> tuple[gym.Space[Any], gym.Space[Any]]:
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    env.close()
    return spaces


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., Path]:
    """Write ``steps`` CartPole rows (in appends of ``per_append``) and return the directory."""

    def make(
        steps: int = 1000,
        per_append: int = 250,
        name: str = "ds",
        config: WriterConfig | None = None,
        seed: int = 0,
    ) -> Path:
        path = tmp_path / name
        observation_space, action_space = cartpole_spaces()
        rows = cartpole_rollout(steps, seed=seed)
        with DatasetWriter(
            path, observation_space, action_space, env_id="CartPole-v1", config=config
        ) as writer:
            for start in range(0, steps, per_append):
                writer.append(
                    {key: value[start : start + per_append] for key, value in rows.items()}
                )
        return path

    return make

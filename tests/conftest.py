"""Factories for spaces, step rows and datasets, shared by the tests."""

from __future__ import annotations

import os

# Tests share 2 cores with servers and clients they start as subprocesses (which inherit this):
# torch's default of one thread per core makes small-network updates ~15x slower here.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from s3_fixtures import bucket, moto_endpoint  # noqa: F401  (fixtures of every test module)

from pipeline import DatasetWriter, WriterConfig
from pipeline.format import schema

STEP_KEYS = schema.REQUIRED_STEP_COLUMNS  # what every test row holds


def play(
    env: gym.Env[Any, Any],
    policy: Callable[[Any], Any],
    episode_id: str,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_steps: int | None = None,
) -> dict[str, list[Any]]:
    """One episode of ``env`` played by ``policy`` (observation -> action), as step-table
    columns. The episode is cut after ``max_steps``, its last row then marked truncated: the
    one way every test makes its episodes, whatever the env or the policy."""
    columns: dict[str, list[Any]] = {key: [] for key in STEP_KEYS}
    observation, _ = env.reset(seed=seed, options=options)
    terminated = truncated = False
    while not (terminated or truncated):
        t = len(columns["t"])
        action = policy(observation)
        next_observation, reward, terminated, truncated, _ = env.step(action)
        truncated = truncated or (max_steps is not None and t + 1 >= max_steps and not terminated)
        row = (
            episode_id,
            t,
            observation,
            action,
            float(reward),
            next_observation,
            terminated,
            truncated,
        )
        for key, value in zip(STEP_KEYS, row, strict=True):
            columns[key].append(value)
        observation = next_observation
    return columns


def cartpole_rollout(steps: int, seed: int = 0, client_id: str = "c0") -> dict[str, Any]:
    """Real CartPole transitions from a random policy, as step-table columns: ``steps`` rows,
    the last episode cut where they end."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    columns: dict[str, list[Any]] = {key: [] for key in STEP_KEYS}
    episode = 0
    while len(columns["t"]) < steps:
        left = steps - len(columns["t"])
        first = seed if episode == 0 else None
        rows = play(
            env,
            lambda _: int(rng.integers(2)),
            f"{client_id}-{seed}-{episode}",
            first,
            max_steps=None,
        )
        for key in STEP_KEYS:
            columns[key] += rows[key][:left]
        episode += 1
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


def play_client(client: Any, episodes: int, seed: int) -> list[int]:
    """CartPole episodes played through a PolicyClient (the one way the client tests play,
    in any mode); each episode's length."""
    env = gym.make("CartPole-v1")
    lengths = []
    for n in range(episodes):
        episode_id = client.start_episode(seed=seed + n, options={"n": n})
        observation, _ = env.reset(seed=seed + n)
        t = 0
        while True:
            action = client.get_action(episode_id, observation)
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, reward, info={"t": t})
            t += 1
            if terminated or truncated:
                client.end_episode(episode_id, observation, truncated=truncated)
                break
        lengths.append(t)
    env.close()
    return lengths


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray for the whole run, without its dashboard (Ray takes seconds to start): 3
    CPUs, for 2 Ray Train workers and Ray Data's reads."""
    try:
        import ray
        import ray.data
        import ray.train
    except ImportError:
        message = "Ray is not installed (pip install 'rlpipe[ray]'; the test extra has it)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs the test extra: there the test must run
        pytest.skip(message)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    with warnings.catch_warnings():
        # Ray 2.60's DataContext sets fields it has itself deprecated, and warns about them
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="ray.data.context")
        ray.data.DataContext.get_current()  # made once, here; kept for the process
    try:
        yield ray
    finally:
        ray.shutdown()

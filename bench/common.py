"""What the benchmarks (and the tests that start servers) share: CartPole-shaped rows from a real
CartPole rollout, the report, a probe of the machine's speed, and the wait for a server to
answer."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

import gymnasium as gym
import numpy as np


def cartpole_columns(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Real CartPole transitions (a random policy), as step-table columns."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    observations = np.empty((steps, 4), np.float32)
    next_observations = np.empty((steps, 4), np.float32)
    actions = rng.integers(0, 2, steps)
    terminated = np.zeros(steps, bool)
    truncated = np.zeros(steps, bool)
    episode = np.empty(steps, np.int64)
    t = np.empty(steps, np.int64)
    observation, _ = env.reset(seed=seed)
    number, step = 0, 0
    for i in range(steps):
        observations[i], episode[i], t[i] = observation, number, step
        observation, _, terminated[i], truncated[i], _ = env.step(int(actions[i]))
        next_observations[i] = observation
        step += 1
        if terminated[i] or truncated[i]:
            observation, _ = env.reset()
            number, step = number + 1, 0
    return {
        "episode_id": np.char.add(f"s{seed}-", episode.astype(str)).astype(object),
        "t": t,
        "observation": observations,
        "action": actions,
        "reward": np.ones(steps),
        "next_observation": next_observations,
        "terminated": terminated,
        "truncated": truncated,
        "client_id": np.full(steps, "client-0", dtype=object),
    }


def cartpole_spaces() -> tuple[gym.Space[Any], gym.Space[Any]]:
    env = gym.make("CartPole-v1")
    return env.observation_space, env.action_space


def machine_speed() -> float:
    """Seconds a pure-Python loop of 10 million additions takes now: this VM's speed swings by
    ~1.7x from minute to minute (0.36-0.62 s seen), and every figure of a run swings with it."""
    started, total = time.perf_counter(), 0
    for i in range(10_000_000):
        total += i
    return time.perf_counter() - started


def machine() -> str:
    """The machine's load and speed as every benchmark prints them beside its figures."""
    return (
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        f"1e7 Python additions in {machine_speed():.2f} s"
    )


def report(figures: dict[str, float | None]) -> None:
    """The closing JSON line every benchmark ends with: strict JSON, None for a figure not
    reached (never NaN or Infinity, which strict parsers refuse)."""
    rounded = {key: None if value is None else round(value, 4) for key, value in figures.items()}
    print(json.dumps(rounded, allow_nan=False))


def answers(url: str, process: subprocess.Popen[Any], seconds: float, healthy: bool = True) -> bool:
    """Whether ``url`` answered within ``seconds`` (with a 2xx, when ``healthy``) while
    ``process`` ran. A refused connection and a slow answer are waited out alike: a server just
    started, or recovering its log after a kill, on a busy machine, can take longer than the
    one second each look waits (seen under CI: a soak's restarted server)."""
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if requests.get(url, timeout=1).ok or not healthy:
                return True
        except (requests.ConnectionError, requests.Timeout):
            pass
        time.sleep(0.05)
    return False

"""The largest end-to-end path that works today: simulators log to a dataset while a trainer-side
reader follows it live; then the same files are read as history, by rlpipe, pandas and torch.

Run with ``make demo``. Output goes to ``runs/demo/`` (or the directory given as the first
argument).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd

from pipeline import DatasetWriter, InputReader, WriterConfig


def simulate(writer: DatasetWriter, client: str, episodes: int, seed: int) -> None:
    """One simulator: a CartPole env under a simple hand-written policy, logging every step."""
    env = gym.make("CartPole-v1")
    for number in range(episodes):
        observation, _ = env.reset(seed=seed + number)
        columns: dict[str, list] = {key: [] for key in ("t", "observation", "action", "reward",
                                    "next_observation", "terminated", "truncated")}  # fmt: skip
        for t in range(500):
            action = int(observation[2] + 0.5 * observation[3] > 0)
            next_observation, reward, terminated, truncated, _ = env.step(action)
            for key, value in zip(columns, (t, observation, action, reward, next_observation,
                                            terminated, truncated), strict=True):  # fmt: skip
                columns[key].append(value)
            observation = next_observation
            if terminated or truncated:
                break
        n = len(columns["t"])
        writer.append(
            columns | {"episode_id": [f"{client}-{number}"] * n, "client_id": [client] * n}
        )
    env.close()


def main(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    env = gym.make("CartPole-v1")
    writer = DatasetWriter(out, env.observation_space, env.action_space, env_id="CartPole-v1",
                           config=WriterConfig(max_age_s=0.2))  # fmt: skip
    clients = [
        threading.Thread(target=simulate, args=(writer, f"sim{i}", 20, 100 * i)) for i in range(4)
    ]
    started = time.perf_counter()
    for client in clients:
        client.start()
    follower = InputReader(out, batch_size=512, follow=True, timeout_s=1.0, poll_interval_s=0.05)
    live_rows = 0
    closer = threading.Thread(target=lambda: ([c.join() for c in clients], writer.close()))
    closer.start()
    for batch in follower:
        live_rows += len(batch)
        print(f"\rfollowing live: {live_rows:,} transitions read", end="", flush=True)
    closer.join()
    print(f"\nwrote and followed {live_rows:,} transitions in {time.perf_counter() - started:.1f}s")

    episodes = list(InputReader(out, episodes=True))
    returns = [float(e.rewards.sum()) for e in episodes]
    mean, best = np.mean(returns), max(returns)
    print(f"history: {len(episodes)} episodes, mean return {mean:.1f}, max {best:.0f}")
    batch = next(iter(InputReader(out, batch_size=256, shuffle=True, seed=0))).to_torch()
    print(f"a shuffled torch batch: observations {tuple(batch.observations.shape)}, "
          f"actions {batch.actions.dtype}")  # fmt: skip
    frame = pd.read_parquet(out / "steps", columns=["client_id", "episode_id", "reward"])
    print("pandas reads the same files:")
    print(
        frame.groupby("client_id").agg(steps=("reward", "size"), episodes=("episode_id", "nunique"))
    )
    print(f"dataset: {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/demo"))

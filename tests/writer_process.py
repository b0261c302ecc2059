"""A writer process for the durability tests: appends numbered batches (forever, or ``batches``
of them), printing each acknowledgement after ``append`` returns, until it is killed or done."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np

from pipeline import DatasetWriter, WriterConfig


def main(path: str, run: int, batches: int = 1_000_000, sync: str = "always") -> None:
    rng = np.random.default_rng(run)
    config = WriterConfig(max_rows=5_000, max_age_s=0.05, max_pending_shards=2, sync=sync)
    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    with DatasetWriter(path, observation_space, gym.spaces.Discrete(2), config=config) as writer:
        for number in range(batches):
            rows = int(rng.integers(1, 3_000))
            observations = rng.standard_normal((rows, 4)).astype(np.float32)
            writer.append(
                {
                    "episode_id": np.full(rows, f"r{run}-b{number}"),
                    "t": np.arange(rows),
                    "observation": observations,
                    "action": rng.integers(0, 2, rows),
                    "reward": np.ones(rows),
                    "next_observation": observations,
                    "terminated": np.zeros(rows, bool),
                    "truncated": np.zeros(rows, bool),
                }
            )
            print(f"r{run}-b{number} {rows}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

"""Record seeded CartPole episodes, then replay one and check it re-runs exactly.

    python examples/replay_episode.py                      # 3 episodes into runs/replay-example
    python examples/replay_episode.py --episodes 5 --render runs/replay.gif

Each episode's seed goes into the episodes table with it, so replay can rebuild the env from the
manifest's ``env_id``, reset it with that seed and re-execute the recorded actions; a deterministic
env then reproduces every observation and reward. A dataset already in the output directory is
replaced. From the shell: ``rlpipe replay DIR --episode ID [--render FILE.gif]``.
"""

from __future__ import annotations

import argparse
import math
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline import DatasetWriter
from pipeline.commands.replay import replay_episode
from pipeline.format import layout


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("runs/replay-example"))
    parser.add_argument("--episodes", type=int, default=3, help="episodes to record")
    parser.add_argument("--seed", type=int, default=0, help="episode i is reset with seed + i")
    parser.add_argument("--render", type=Path, help="write the replay as an animated GIF")
    return parser.parse_args()


def record(writer: DatasetWriter, env: gym.Env[Any, Any], episode_id: str, seed: int) -> None:
    """One episode under a noisy policy: its steps, then its episodes-table row with the seed."""
    rng = np.random.default_rng(seed)
    started = datetime.now(UTC)
    observation, _ = env.reset(seed=seed)
    steps: dict[str, list[Any]] = {key: [] for key in ("t", "observation", "action", "reward",
                                   "next_observation", "terminated", "truncated")}  # fmt: skip
    t, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        action = int(rng.integers(2))
        next_observation, reward, terminated, truncated, _ = env.step(action)
        for key, value in zip(steps, (t, observation, action, reward, next_observation,
                                      terminated, truncated), strict=True):  # fmt: skip
            steps[key].append(value)
        observation, t = next_observation, t + 1
    writer.append({"episode_id": [episode_id] * t, **steps})
    writer.append_episodes(
        {
            "episode_id": [episode_id],
            "started_at": [started],
            "ended_at": [datetime.now(UTC)],
            "length": [t],
            "return": [math.fsum(steps["reward"])],
            "env_id": ["CartPole-v1"],
            "seed": [seed],
            "end_reason": ["terminated" if terminated else "truncated"],
        }
    )


def main() -> int:
    args = parse_args()
    if (args.data / layout.MANIFEST).exists():
        shutil.rmtree(args.data)  # the last run's recording
    env = gym.make("CartPole-v1")
    ids = [f"episode-{number}" for number in range(args.episodes)]
    with DatasetWriter(args.data, env.observation_space, env.action_space,
                       env_id="CartPole-v1") as writer:  # fmt: skip
        for number, episode_id in enumerate(ids):
            record(writer, env, episode_id, args.seed + number)
    env.close()
    print(f"recorded {len(ids)} episodes into {args.data}")

    result = replay_episode(args.data, ids[-1], render=args.render)
    print(result.describe())
    return 0 if result.exact else 1


if __name__ == "__main__":
    raise SystemExit(main())

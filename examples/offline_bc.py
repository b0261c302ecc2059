"""Offline behaviour cloning: learn CartPole from a dataset of a good controller's episodes.

    python examples/offline_bc.py                          # 10 s of training, about 30 s in all
    python examples/offline_bc.py --max-seconds 30 --run-dir runs/bc

The data is ``datasets/cartpole-expert`` when it is shipped, else a dataset this example records
first with a scripted controller (push right when ``theta + 0.5 * theta_dot > 0``). Training is
``rlpipe train bc --data DIR --env CartPole-v1 --max-seconds S --run-dir RUN``, called in-process;
the policy it exports to ``RUN/checkpoints`` is then run greedily in CartPole with the same numpy
policy a client acts with, and its return is printed beside the data's. Run it again and
training resumes from the state saved in RUN.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline import DatasetWriter, InputReader
from pipeline.commands.cli import main as rlpipe
from pipeline.format import layout
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "datasets" / "cartpole-expert"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="default: datasets/cartpole-expert if shipped")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to record, if recording")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="training wall time")
    parser.add_argument("--max-updates", type=int, default=None, help="stop sooner, after these")
    parser.add_argument("--run-dir", type=Path, default=Path("runs/offline-bc"))
    return parser.parse_args()


def controller(observation: np.ndarray) -> int:
    """Push towards the side the pole falls to, leading by half its angular velocity."""
    return int(observation[2] + 0.5 * observation[3] > 0)


def record_expert(path: Path, episodes: int) -> None:
    """The scripted controller's episodes (seeds 0..episodes-1) as a new dataset."""
    env = gym.make("CartPole-v1")
    with DatasetWriter(path, env.observation_space, env.action_space,
                       env_id="CartPole-v1") as writer:  # fmt: skip
        for number in range(episodes):
            observation, _ = env.reset(seed=number)
            steps: dict[str, list[Any]] = {key: [] for key in ("t", "observation", "action",
                                           "reward", "next_observation", "terminated",
                                           "truncated")}  # fmt: skip
            terminated = truncated = False
            while not (terminated or truncated):
                action = controller(observation)
                next_observation, reward, terminated, truncated, _ = env.step(action)
                row = (len(steps["t"]), observation, action, reward, next_observation, terminated,
                       truncated)  # fmt: skip
                for key, value in zip(steps, row, strict=True):
                    steps[key].append(value)
                observation = next_observation
            writer.append({"episode_id": [f"expert-{number}"] * len(steps["t"]), **steps})
    env.close()


def greedy_return(run_dir: Path, episodes: int = 5) -> float:
    """Mean return of the newest checkpoint in ``run_dir``, acting greedily (seeds 100...)."""
    found = latest_checkpoint(run_dir)
    if found is None:
        raise SystemExit(f"no checkpoint in {run_dir}/checkpoints: did training run?")
    policy = NumpyPolicy(load_checkpoint(found))
    env, rng, total = gym.make("CartPole-v1"), np.random.default_rng(0), 0.0
    for number in range(episodes):
        observation, _ = env.reset(seed=100 + number)
        terminated = truncated = False
        while not (terminated or truncated):
            actions, _ = policy.act(observation[None], rng, explore=False)
            observation, reward, terminated, truncated, _ = env.step(int(actions[0]))
            total += float(reward)
    env.close()
    return total / episodes


def main() -> int:
    args = parse_args()
    data = args.data or (SHIPPED if SHIPPED.exists() else Path("runs/cartpole-scripted"))
    if not (data / layout.MANIFEST).exists():
        record_expert(data, args.episodes)
    returns = [float(episode.rewards.sum()) for episode in InputReader(data, episodes=True)]
    print(f"data: {data}, {len(returns)} episodes, mean return {np.mean(returns):.1f}")

    command = ["train", "bc", "--data", str(data), "--env", "CartPole-v1",
               "--max-seconds", str(args.max_seconds), "--run-dir", str(args.run_dir)]  # fmt: skip
    if args.max_updates is not None:
        command += ["--max-updates", str(args.max_updates)]
    code = rlpipe(command)
    if code != 0:
        return code
    print(f"BC policy: greedy mean return {greedy_return(args.run_dir):.1f} over 5 episodes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

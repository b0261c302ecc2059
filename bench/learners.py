"""Do online learners gain from data parallelism on this machine? CPU and wall time per update of
SAC (Pendulum-v1) and PPO (CartPole-v1) on one rank against two gloo ranks (one torch thread
each) that share the same rows per update (SAC 256: 1 x 256 or 2 x 128; PPO 2048: 1 x 2048 or
2 x 1024), their gradients averaged as ``rlpipe train --workers`` averages them.

Online, every row a learner trains on was stepped by a simulator, acted by the server or a
local-inference client, and written: those take the same cores. Two ranks pay off only if they
finish an update sooner *and* the cores they take are idle. ``cpu_per_update_2_vs_1`` above 1
means two ranks spend more CPU on the same update than one does, CPU taken from the simulators.
Figures are the median of ``--rounds`` timed blocks; CPU time is steadier than wall time when
other processes share the machine. Run: ``python bench/learners.py [--updates N]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gymnasium as gym
import numpy as np
import torch.multiprocessing as mp
from common import report

from pipeline import DatasetWriter, InputReader
from pipeline.dataset.batch import Batch

os.environ.setdefault("OMP_NUM_THREADS", "1")
CASES = {"sac": ("Pendulum-v1", 256), "ppo": ("CartPole-v1", 2048)}


def write_play(path: Path, env_id: str, rows: int) -> Path:
    """Random play logged as clients with policy version 1 log it (``action_logp`` included)."""
    env = gym.make(env_id)
    columns: dict[str, list[Any]] = {}
    episode, t = 0, 0
    observation, _ = env.reset(seed=0)
    for _ in range(rows):
        action = env.action_space.sample()
        after, reward, terminated, truncated, _ = env.step(action)
        row = {
            "episode_id": f"e{episode}",
            "t": t,
            "observation": observation,
            "action": action,
            "reward": float(reward),
            "next_observation": after,
            "terminated": terminated,
            "truncated": truncated,
            "action_logp": -0.7,
            "policy_version": 1,
        }
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
        observation, t = after, t + 1
        if terminated or truncated:
            observation, _ = env.reset()
            episode, t = episode + 1, 0
    with DatasetWriter(path, env.observation_space, env.action_space, env_id=env_id) as writer:
        writer.append(columns)
    return path


def _rank(rank: int, world: int, port: int, algorithm: str, data: str, args: Any, out: Any) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from pipeline.trainers.command import make_trainer
    from pipeline.trainers.distributed import Group
    from pipeline.trainers.loop import _by_episode

    group = Group.from_environment()
    import torch

    torch.set_num_threads(1)
    reader = InputReader(data, batch_size=1 << 20)
    rows = Batch.concat(list(reader))
    trainer = make_trainer(algorithm, reader.observation_space, reader.action_space)
    size = CASES[algorithm][1] // world
    rng = np.random.default_rng(rank)
    start = rng.integers(0, len(rows) - size, 64)
    batches = [rows[int(s) : int(s) + size] for s in start]
    if algorithm == "ppo":
        batches = [_by_episode(b) for b in batches]
    blocks = []
    for round_ in range(args.rounds + 1):
        group.agree(True)  # start each block together
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(args.updates):
            trainer.update(batches[(round_ * args.updates + i) % len(batches)])
        blocks.append(((time.perf_counter() - wall), (time.process_time() - cpu)))
    out.put((rank, blocks[1:]))  # the first block warms up


def measure(algorithm: str, data: Path, world: int, args: Any) -> tuple[float, float]:
    """Median wall seconds per update, and CPU seconds per update summed over the ranks."""
    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(
        _rank,
        args=(world, port, algorithm, str(data), args, out),
        nprocs=world,
        start_method="spawn",
    )
    results = dict(out.get() for _ in range(world))
    walls = [max(results[r][b][0] for r in results) for b in range(args.rounds)]
    cpus = [sum(results[r][b][1] for r in results) for b in range(args.rounds)]
    return statistics.median(walls) / args.updates, statistics.median(cpus) / args.updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=40, help="updates per timed block")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm, (env_id, _) in CASES.items():
            data = write_play(Path(tmp) / algorithm, env_id, 20_000)
            updates = args.updates if algorithm == "sac" else max(1, args.updates // 20)
            one = measure(
                algorithm, data, 1, argparse.Namespace(**{**vars(args), "updates": updates})
            )
            two = measure(
                algorithm, data, 2, argparse.Namespace(**{**vars(args), "updates": updates})
            )
            print(
                f"{algorithm}: 1 rank {one[0] * 1e3:.1f} ms/update ({one[1] * 1e3:.1f} ms CPU); "
                f"2 ranks {two[0] * 1e3:.1f} ms/update ({two[1] * 1e3:.1f} ms CPU)",
                file=sys.stderr,
            )
            figures |= {
                f"{algorithm}_ms_per_update_1": one[0] * 1e3,
                f"{algorithm}_ms_per_update_2": two[0] * 1e3,
                f"{algorithm}_cpu_ms_per_update_1": one[1] * 1e3,
                f"{algorithm}_cpu_ms_per_update_2": two[1] * 1e3,
                f"{algorithm}_cpu_per_update_2_vs_1": two[1] / one[1],
                f"{algorithm}_wall_per_update_2_vs_1": two[0] / one[0],
            }
    report(figures)


if __name__ == "__main__":
    main()

"""Learning benchmark: rlpipe's trainers against Stable-Baselines3 on the same machine, same run.

- PPO on CartPole-v1, online: local-inference clients (processes acting with the newest published
  checkpoint through the numpy policy) append to a live dataset, and ``rlpipe train ppo --follow``
  trains from it. Figure: wall seconds until the mean logged return of the last 20 episodes
  reaches 475, over SB3 PPO's (RL-Zoo's tuned CartPole settings, in-process) to the same bar.
- SAC on Pendulum-v1, online the same way: wall seconds until the greedy evaluation return
  reaches -200, over SB3 SAC's.
- BC and MARWIL on RLlib's recorded CartPole (``cartpole-v1_large``), CQL on RLlib's recorded
  Pendulum (``pendulum-v1_enormous``), offline through ``rlpipe train``: the evaluation return.

Every run is capped in time (``--budget`` seconds). The clients here write the dataset directly
(as ``rlpipe serve`` would); going through the server is the server benchmark's business.
Run: ``python bench/learn.py [--budget 300] [--only ppo,sac,bc,marwil,cql]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import report

from pipeline import DatasetWriter
from pipeline.cli import main as rlpipe
from pipeline.policy import NumpyPolicy, latest_checkpoint, load_checkpoint

ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchor-data" / "rllib-test-data"


def rllib_dataset(source: Path, path: Path, env_id: str, limit: int) -> Path:
    """RLlib's old-API Parquet (``dones``) as an rlpipe dataset; a done at the time limit is a
    truncation, an earlier one a termination, an episode without one was cut (truncated)."""
    table = ds.dataset(source, format="parquet").to_table()
    ids = table["eps_id"].to_numpy()
    dones = table["dones"].to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.append(True, ids[1:] != ids[:-1]))
    t = np.arange(len(ids)) - np.repeat(starts, np.diff(np.append(starts, len(ids))))
    last = np.append(ids[1:] != ids[:-1], True)
    env = gym.make(env_id)

    def stack(name: str, space: gym.Space[Any]) -> np.ndarray:
        values = np.stack(table[name].to_numpy(zero_copy_only=False))
        return values.astype(space.dtype).reshape(len(ids), *space.shape)  # type: ignore[arg-type]

    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    actions = table["actions"].to_numpy() if discrete else stack("actions", env.action_space)
    with DatasetWriter(path, env.observation_space, env.action_space, env_id=env_id) as writer:
        writer.append(
            {
                "episode_id": ids.astype(str),
                "t": t,
                "observation": stack("obs", env.observation_space),
                "action": actions,
                "reward": table["rewards"].to_numpy(),
                "next_observation": stack("new_obs", env.observation_space),
                "terminated": dones & (t < limit - 1),
                "truncated": (dones & (t >= limit - 1)) | (last & ~dones),
            }
        )
    env.close()
    return path


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def offline(algorithm: str, data: Path, root: Path, budget: float, stop: float) -> float:
    run_dir = root / f"run-{algorithm}"
    argv = [
        "train",
        algorithm,
        "--data",
        str(data),
        "--run-dir",
        str(run_dir),
        "--max-seconds",
        str(budget),
        "--stop-return",
        str(stop),
        "--eval-every",
        "500",
        "--eval-episodes",
        "10",
    ]
    with contextlib.redirect_stderr(io.StringIO()):
        rlpipe(argv)
    returns = [m["eval_return"] for m in _metrics(run_dir) if "eval_return" in m]
    return max(returns) if returns else float("nan")


def client(data: Path, env_id: str, stop_file: Path, seed: int) -> None:
    """A local-inference client process: acts with the newest published checkpoint (checked
    between episodes), appends its steps in batches of about 256 rows, until ``stop_file``."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    policy: NumpyPolicy | None = None
    rows: list[dict[str, Any]] = []
    with DatasetWriter(data) as writer:
        episode = 0
        while not stop_file.exists():
            path = latest_checkpoint(data)
            if path is None:
                time.sleep(0.05)
                continue
            if policy is None or path.name != f"policy-{policy.version:08d}.npz":
                policy = NumpyPolicy(load_checkpoint(path))
            observation, _ = env.reset(seed=seed * 100_000 + episode)
            ended, t = False, 0
            while not ended:
                action, logp = policy.act(observation[None], rng)
                next_observation, reward, terminated, truncated, _ = env.step(action[0])
                ended = terminated or truncated
                rows.append(
                    {
                        "episode_id": f"c{seed}-{episode}",
                        "t": t,
                        "observation": observation,
                        "action": action[0],
                        "reward": float(reward),
                        "next_observation": next_observation,
                        "terminated": terminated,
                        "truncated": truncated,
                        "action_logp": float(logp[0]),
                        "policy_version": policy.version,
                    }
                )
                observation, t = next_observation, t + 1
            if len(rows) >= 256:
                writer.append_rows(rows)
                writer.flush()
                rows = []
            episode += 1
    env.close()


def online(
    algorithm: str,
    env_id: str,
    root: Path,
    budget: float,
    stop: float,
    extra: list[str],
    clients: int,
) -> tuple[float, float, int]:
    """(seconds to reach ``stop``, best score, env steps) of ``rlpipe train --follow``."""
    data, run_dir = root / f"live-{algorithm}", root / f"run-{algorithm}"
    env = gym.make(env_id)
    DatasetWriter(data, env.observation_space, env.action_space, env_id=env_id).close()
    env.close()
    stop_file = root / f"stop-{algorithm}"
    processes = [
        subprocess.Popen(
            [sys.executable, __file__, "--client", str(data), env_id, str(stop_file), str(seed)]
        )
        for seed in range(clients)
    ]
    started = time.perf_counter()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            rlpipe(
                [
                    "train",
                    algorithm,
                    "--data",
                    str(data),
                    "--follow",
                    "--run-dir",
                    str(run_dir),
                    "--max-seconds",
                    str(budget),
                    "--stop-return",
                    str(stop),
                    *extra,
                ]
            )
    finally:
        stop_file.touch()
        for process in processes:
            process.wait()
    seconds = time.perf_counter() - started
    key = "episode_return" if algorithm == "ppo" else "eval_return"
    records = [m for m in _metrics(run_dir) if m.get(key) is not None]
    best = max((m[key] for m in records), default=float("nan"))
    steps = max((m.get("env_steps", 0) for m in records), default=0)
    return (seconds if best >= stop else float("inf")), best, steps


def sb3_ppo(budget: float) -> tuple[float, int]:
    """SB3 PPO with RL-Zoo's CartPole-v1 hyperparameters, until 20-episode mean return >= 475."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            buffer = self.model.ep_info_buffer
            recent = [info["r"] for info in list(buffer)[-20:]]
            solved[0] = len(recent) == 20 and bool(np.mean(recent) >= 475)
            return not solved[0] and time.perf_counter() - started < budget

    solved = [False]
    env = make_vec_env("CartPole-v1", n_envs=8, seed=0)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=0.001,
        clip_range=0.2,
        seed=0,
        device="cpu",
    )  # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 (constant rates)
    started = time.perf_counter()
    model.learn(total_timesteps=100_000, callback=Stop())
    seconds = time.perf_counter() - started
    return (seconds if solved[0] else float("inf")), model.num_timesteps


def sb3_sac(budget: float) -> tuple[float, int]:
    """SB3 SAC (RL-Zoo's Pendulum-v1 settings) until the greedy evaluation return >= -200."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    solved = [False]

    class Stop(BaseCallback):
        def _on_step(self) -> bool:
            if time.perf_counter() - started > budget:
                return False
            if self.num_timesteps % 1000:
                return True
            env = Monitor(gym.make("Pendulum-v1"))
            score, _ = evaluate_policy(self.model, env, n_eval_episodes=5)
            solved[0] = bool(score >= -200)
            return not solved[0]

    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=0, device="cpu")
    started = time.perf_counter()
    model.learn(total_timesteps=20_000, callback=Stop())
    seconds = time.perf_counter() - started
    return (seconds if solved[0] else float("inf")), model.num_timesteps


def _ratio(ours: float, theirs: float) -> float:
    """Wall-time ratio; NaN when neither reached the bar within the budget."""
    return float("nan") if ours == theirs == float("inf") else ours / theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--only", default="ppo,sac,bc,marwil,cql")
    parser.add_argument(
        "--client", nargs=4, metavar=("DATA", "ENV", "STOP_FILE", "SEED"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.client:
        data, env_id, stop_file, seed = args.client
        client(Path(data), env_id, Path(stop_file), int(seed))
        return
    only = set(args.only.split(","))
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "ppo" in only:
            ours, best, steps = online(
                "ppo",
                "CartPole-v1",
                root,
                args.budget,
                475.0,
                ["--batch-size", "2048", "--lr", "0.001"],
                clients=2,
            )
            theirs, their_steps = sb3_ppo(args.budget)
            print(
                f"PPO CartPole: rlpipe {ours:.1f} s ({steps} steps, best {best:.0f}); "
                f"SB3 {theirs:.1f} s ({their_steps} steps)"
            )
            figures["ppo_wall_vs_sb3"] = _ratio(ours, theirs)
        if "sac" in only:
            ours, best, steps = online(
                "sac",
                "Pendulum-v1",
                root,
                args.budget,
                -200.0,
                ["--batch-size", "256", "--eval-every", "1000"],
                clients=1,
            )
            theirs, their_steps = sb3_sac(args.budget)
            print(
                f"SAC Pendulum: rlpipe {ours:.1f} s ({steps} steps, best {best:.0f}); "
                f"SB3 {theirs:.1f} s ({their_steps} steps)"
            )
            figures["sac_wall_vs_sb3"] = _ratio(ours, theirs)
        cartpole = ANCHOR / "cartpole" / "cartpole-v1_large"
        if only & {"bc", "marwil"} and cartpole.is_dir():
            data = rllib_dataset(cartpole, root / "rllib-cartpole", "CartPole-v1", 200)
            for algorithm in sorted(only & {"bc", "marwil"}):
                score = offline(algorithm, data, root, min(args.budget, 60.0), 500.0)
                print(
                    f"{algorithm.upper()} on RLlib CartPole: eval return {score:.1f} "
                    f"(RLlib's learning test asks 350)"
                )
                figures[f"{algorithm}_rllib_cartpole_return"] = score
        pendulum = ANCHOR / "pendulum" / "pendulum-v1_enormous"
        if "cql" in only and pendulum.is_dir():
            data = rllib_dataset(pendulum, root / "rllib-pendulum", "Pendulum-v1", 200)
            score = offline("cql", data, root, args.budget, -150.0)
            print(f"CQL on RLlib Pendulum: eval return {score:.1f} (RLlib's test asks -700)")
            figures["cql_rllib_pendulum_return"] = score
    report(figures)


if __name__ == "__main__":
    main()

"""Record a policy checkpoint's episodes in gymnasium as an rlpipe dataset (how datasets/ was made).

    python examples/record_dataset.py --policy CHECKPOINT --env ENV_ID --episodes N --seed S \\
        --out DIR [--greedy] [--noise SIGMA]

Episode ``i`` is reset with seed ``S + i`` and its row in the episodes table records that seed,
so every episode replays exactly with ``rlpipe replay DIR --episode ID``. Actions come from
:class:`pipeline.policy.NumpyPolicy`, the network a client acts with; the action generator is
seeded with ``S`` too, so the same command writes the same steps (only the timestamps differ).

``action_logp`` is the log-probability under the behaviour that really acted: the policy's own
distribution when sampling; 0 for a greedy discrete policy (it picks its action with probability
one); with ``--noise``, a greedy policy's mean plus Gaussian noise of std SIGMA is a Gaussian of
that std, whose log-density is recorded before the clip to the action bounds. Where the behaviour
has no density (greedy Box without noise, sampled with noise) it is null. ``policy_version`` is the
checkpoint's version. The figures printed at the end are the ones a dataset's CARD.md quotes.
"""

from __future__ import annotations

import argparse
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline import DatasetWriter, WriterConfig
from pipeline.errors import ConfigError, RlpipeError
from pipeline.policy.checkpoint import Checkpoint, latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy

STEP_KEYS = ("t", "observation", "action", "reward", "next_observation", "terminated",
             "truncated", "action_logp")  # fmt: skip
CLIENT_ID = "record_dataset"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", required=True, type=Path, help="a policy-NNNNNNNN.npz file")
    parser.add_argument("--env", required=True, help="gymnasium id, e.g. CartPole-v1")
    parser.add_argument("--episodes", required=True, type=int)
    parser.add_argument("--seed", required=True, type=int, help="episode i resets with seed+i")
    parser.add_argument("--out", required=True, type=Path, help="a new dataset directory")
    parser.add_argument("--greedy", action="store_true", help="the policy's mode, not a sample")
    parser.add_argument("--noise", type=float, default=0.0, help="Gaussian action noise std (Box)")
    args = parser.parse_args(argv)
    if args.episodes < 1:
        raise ConfigError("record_dataset", "episodes", "an integer >= 1", args.episodes)
    if args.noise < 0 or not math.isfinite(args.noise):
        raise ConfigError("record_dataset", "noise", "a finite std >= 0", args.noise)
    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError("record_dataset", "out", "a new or empty directory", str(args.out))
    return args


def _act(
    policy: NumpyPolicy, observation: Any, rng: np.random.Generator, args: argparse.Namespace
) -> tuple[Any, float | None]:
    """One action and its behaviour log-probability (see the module docstring)."""
    actions, logp = policy.act(np.asarray(observation)[None], rng, explore=not args.greedy)
    action, behaviour_logp = actions[0], float(logp[0])
    space = policy.spec.action_space
    if isinstance(space, gym.spaces.Discrete):
        return int(action), 0.0 if args.greedy else behaviour_logp
    if args.noise > 0 and isinstance(space, gym.spaces.Box):
        noise = rng.standard_normal(np.shape(action))
        # the density of mean + N(0, sigma^2) at the pre-clip action, summed over dimensions
        gaussian = -0.5 * noise**2 - math.log(args.noise) - 0.5 * math.log(2 * math.pi)
        noisy = np.clip(action + args.noise * noise, space.low, space.high).astype(space.dtype)
        return noisy, float(gaussian.sum()) if args.greedy else None
    return action, None if args.greedy else behaviour_logp


def play_episode(
    env: gym.Env[Any, Any],
    policy: NumpyPolicy,
    rng: np.random.Generator,
    seed: int,
    args: argparse.Namespace,
) -> tuple[dict[str, list[Any]], bool]:
    """One episode's step columns, and whether it terminated (else it was truncated)."""
    columns: dict[str, list[Any]] = {key: [] for key in STEP_KEYS}
    observation, _ = env.reset(seed=seed)
    terminated = truncated = False
    while not (terminated or truncated):
        action, logp = _act(policy, observation, rng, args)
        next_observation, reward, terminated, truncated, _ = env.step(action)
        row = (len(columns["t"]), observation, action, float(reward), next_observation,
               terminated, truncated, logp)  # fmt: skip
        for key, value in zip(STEP_KEYS, row, strict=True):
            columns[key].append(value)
        observation = next_observation
    return columns, bool(terminated)


def record(args: argparse.Namespace, checkpoint: Checkpoint) -> tuple[list[float], int]:
    """Write the episodes (steps, then the episode's row with its seed); their returns, steps."""
    policy = NumpyPolicy(checkpoint)
    if args.noise > 0 and not isinstance(checkpoint.spec.action_space, gym.spaces.Box):
        raise ConfigError("record_dataset", "noise", "0 for a non-Box action space", args.noise)
    env = gym.make(args.env)
    spaces = (checkpoint.spec.observation_space, checkpoint.spec.action_space)
    if spaces != (env.observation_space, env.action_space):
        env.close()
        found = f"{args.env} with {(env.observation_space, env.action_space)}"
        expected = f"an env with the policy's spaces {spaces}"
        raise ConfigError("record_dataset", "env", expected, found)
    rng = np.random.default_rng(args.seed)
    returns, steps = [], 0
    # one shard per table: a small shipped dataset reads faster whole than in age-rolled pieces
    config = WriterConfig(max_age_s=24 * 3600.0)
    with DatasetWriter(args.out, env.observation_space, env.action_space, env_id=args.env,
                       config=config) as writer:  # fmt: skip
        for index in range(args.episodes):
            episode_id, seed = f"{args.out.name}-{index:04d}", args.seed + index
            started = datetime.now(UTC)
            columns, terminated = play_episode(env, policy, rng, seed, args)
            length = len(columns["t"])
            writer.append({"episode_id": [episode_id] * length, **columns,
                           "policy_version": [checkpoint.version] * length,
                           "client_id": [CLIENT_ID] * length})  # fmt: skip
            returns.append(math.fsum(columns["reward"]))
            steps += length
            writer.append_episodes(
                {
                    "episode_id": [episode_id],
                    "client_id": [CLIENT_ID],
                    "started_at": [started],
                    "ended_at": [datetime.now(UTC)],
                    "length": [length],
                    "return": [returns[-1]],
                    "env_id": [args.env],
                    "seed": [seed],
                    "end_reason": ["terminated" if terminated else "truncated"],
                }
            )
    env.close()
    return returns, steps


def figures(
    args: argparse.Namespace, checkpoint: Checkpoint, returns: list[float], steps: int
) -> dict[str, Any]:
    """The numbers a dataset's CARD.md quotes."""
    values = np.asarray(returns)
    return {
        "env_id": args.env, "episodes": len(values), "steps": steps,
        "return_mean": round(float(values.mean()), 2), "return_std": round(float(values.std()), 2),
        "return_min": round(float(values.min()), 2), "return_max": round(float(values.max()), 2),
        "algorithm": checkpoint.spec.algorithm, "policy_version": checkpoint.version,
        "greedy": args.greedy, "noise": args.noise,
        "seeds": f"{args.seed}..{args.seed + len(values) - 1}",
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoint = load_checkpoint(latest_checkpoint(args.policy) or args.policy)
    returns, steps = record(args, checkpoint)
    doc = figures(args, checkpoint, returns, steps)
    print(
        f"wrote {args.out}: {doc['episodes']} episodes, {steps} steps, behaviour return mean "
        f"{doc['return_mean']} std {doc['return_std']} min {doc['return_min']} max "
        f"{doc['return_max']}; policy {doc['algorithm']} version {doc['policy_version']}"
    )
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except RlpipeError as error:  # a bad option or checkpoint: say what, without a traceback
        raise SystemExit(f"record_dataset: {error}") from None

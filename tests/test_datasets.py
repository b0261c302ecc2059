"""The shipped datasets (``datasets/``): each reads, matches its card, replays, and teaches BC.

These are data, not code, so the test pins what their cards promise: the episode count and the
behaviour return the card states, episodes that replay exactly from their recorded seeds, and
``rlpipe train bc --data datasets/cartpole-expert`` out of the box.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

from pipeline import InputReader
from pipeline.commands.cli import main
from pipeline.commands.replay import replay_episode
from pipeline.dataset.batch import FIELD_OF_COLUMN
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy

ROOT = Path(__file__).resolve().parents[1]
DATASETS = ROOT / "datasets"
SHIPPED = {
    "cartpole-expert": "CartPole-v1",
    "cartpole-medium": "CartPole-v1",
    "pendulum-expert": "Pendulum-v1",
    "pendulum-medium": "Pendulum-v1",
}


def card_figures(name: str) -> dict[str, float]:
    """The numbers a card states in its figures table (``| episodes | 100 |`` and so on)."""
    text = (DATASETS / name / "CARD.md").read_text()
    found = {}
    for key in ("env", "episodes", "steps", "behaviour return mean"):
        match = re.search(rf"^\| {key} \| `?([-\w.]+)`? \|", text, re.MULTILINE)
        if match is None:
            raise AssertionError(f"{name}/CARD.md has no '| {key} | ... |' row")
        found[key] = match[1]
    return {
        "env": found["env"],
        "episodes": int(found["episodes"]),
        "steps": int(found["steps"]),
        "return_mean": float(found["behaviour return mean"]),
    }


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_shipped_dataset_reads_and_matches_its_card(name: str) -> None:
    card = card_figures(name)
    reader = InputReader(DATASETS / name, episodes=True)
    assert reader.manifest.env_id == SHIPPED[name] == card["env"]
    returns = [float(np.sum(episode.rewards)) for episode in reader]
    assert len(returns) == card["episodes"]
    steps = sum(len(batch) for batch in InputReader(DATASETS / name, batch_size=8192))
    assert steps == card["steps"]
    assert np.mean(returns) == pytest.approx(card["return_mean"], abs=0.01)
    episodes = pd.read_parquet(DATASETS / name / "episodes")
    # one row per episode, each with the seed replay needs, agreeing with the steps
    assert len(episodes) == card["episodes"] and episodes["seed"].notna().all()
    assert sorted(episodes["return"]) == pytest.approx(sorted(returns))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_episodes_of_a_shipped_dataset_replay_with_zero_divergence(name: str) -> None:
    ids = sorted(pd.read_parquet(DATASETS / name / "episodes")["episode_id"])
    for episode_id in (ids[0], ids[-1]):
        result = replay_episode(DATASETS / name, episode_id)
        assert result.exact, result.describe()
        assert result.env_id == SHIPPED[name] and result.seed is not None


# (dataset, its checkpoint, its first seed, how far its floats may be from the shipped ones):
# the record command of each card, for 3 episodes. CartPole's dynamics are Python's float
# arithmetic, the same on every CPU. Pendulum's take numpy's float64 sin and cos, whose last bit
# depends on the CPU (numpy's AVX-512 builds use Intel's SVML), and 200 steps of its dynamics
# grow that to about 1e-5 (9.1e-6 on an AVX2-only AMD EPYC against the shipped recording)
RERECORD = [
    ("cartpole-medium", "policy-00000024.npz", 2000, 0.0),
    ("pendulum-expert", "policy-00000024.npz", 3000, 1e-4),
]
STEP_COLUMNS = ["episode_id", "t", "observation", "action", "reward", "next_observation",
                "terminated", "truncated", "action_logp", "policy_version"]  # fmt: skip


@pytest.mark.parametrize(("name", "policy", "seed", "atol"), RERECORD)
def test_the_cards_record_command_rebuilds_the_shipped_steps(
    tmp_path: Path, name: str, policy: str, seed: int, atol: float
) -> None:
    out = tmp_path / name  # the directory's name makes the episode ids
    command = [sys.executable, "examples/record_dataset.py", "--policy",
               str(DATASETS / name / "checkpoints" / policy), "--env", SHIPPED[name],
               "--episodes", "3", "--seed", str(seed), "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}: 3 episodes" in done.stdout

    def steps(path: Path) -> dict[str, np.ndarray]:
        """The steps as the reader gives them (next observations restored, section 4.3)."""
        batch = InputReader(path, columns=STEP_COLUMNS, batch_size=1 << 20).next()
        keep = batch.episode_ids < f"{name}-0003"
        order = np.lexsort((batch.ts[keep], batch.episode_ids[keep]))
        return {
            column: np.asarray(getattr(batch, FIELD_OF_COLUMN[column]))[keep][order]
            for column in STEP_COLUMNS
        }

    rebuilt, shipped = steps(out), steps(DATASETS / name)
    assert len(rebuilt["t"]) == len(shipped["t"]) > 0
    for column in STEP_COLUMNS:  # bit for bit where atol is 0: compared exactly, not as printed
        if atol and rebuilt[column].dtype.kind == "f":
            np.testing.assert_allclose(rebuilt[column], shipped[column], 0, atol, err_msg=column)
        else:
            np.testing.assert_array_equal(rebuilt[column], shipped[column], err_msg=column)


def greedy_returns(policy: NumpyPolicy | None, seeds: range) -> list[float]:
    """CartPole returns on ``seeds``: greedy with ``policy``, uniformly random without one."""
    env, rng, returns = gym.make("CartPole-v1"), np.random.default_rng(0), []
    for seed in seeds:
        observation, _ = env.reset(seed=seed)
        total, ended = 0.0, False
        while not ended:
            if policy is None:
                action = int(rng.integers(2))
            else:
                action = int(policy.act(observation[None], rng, explore=False)[0][0])
            observation, reward, terminated, truncated, _ = env.step(action)
            total, ended = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def test_bc_trains_out_of_the_box_on_cartpole_expert(tmp_path: Path) -> None:
    run = tmp_path / "run"
    data = str(DATASETS / "cartpole-expert")
    code = main(["train", "bc", "--data", data, "--env", "CartPole-v1",
                 "--max-updates", "300", "--run-dir", str(run)])  # fmt: skip
    assert code == 0
    found = latest_checkpoint(run)
    assert found is not None and load_checkpoint(found).spec.algorithm == "bc"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["update"] == 300
    (read,) = [json.loads(line) for line in (run / "reads.jsonl").read_text().splitlines()]
    assert (read["rows"], read["data_version"]) == (25000, 0)  # the table as it was read
    learned = greedy_returns(NumpyPolicy(load_checkpoint(found)), range(1000, 1005))
    random = greedy_returns(None, range(1000, 1005))
    # a uniformly random policy lasts about 22 steps in CartPole
    assert np.mean(random) < 50
    assert np.mean(learned) > max(300, 10 * np.mean(random)), (learned, random)

"""Data-parallel ``rlpipe train``: one gloo rank, two, and two Ray Train workers learn the same
policy from the same pinned table version; the ranks read each of its rows once; a rank killed
mid-run fails the run with a message that names it, and nothing hangs.

BC learns ``datasets/cartpole-expert`` (50 episodes of 500 steps) in a few hundred updates; each
run's last checkpoint is served by a real server and played by a remote-inference client."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from server_fixtures import ROOT, cartpole_config, running_server

from pipeline import InputReader
from pipeline.client import PolicyClient
from pipeline.commands.cli import main
from pipeline.trainers.distributed import row_digest

EXPERT = ROOT / "datasets" / "cartpole-expert"
BAR = 450.0  # served mean return of the policy BC learns from the expert, on any count of ranks
SHORT = ["--max-updates", "300", "--eval-every", "300", "--eval-episodes", "1", "--hidden", "32,32",
         "--lr", "0.003"]  # fmt: skip


@pytest.fixture(scope="module")
def expert_rows() -> tuple[int, int]:
    """The expert version's rows and their digest, read by one reader."""
    rows, digest = 0, 0
    for batch in InputReader(EXPERT, batch_size=1 << 16, columns=["episode_id", "t"]):
        rows += len(batch)
        digest = (digest + row_digest(batch)) % (1 << 64)
    return rows, digest


def served_return(policy: Path, tmp_path: Path, episodes: int = 2) -> float:
    """Mean return of ``episodes`` CartPole episodes acted by a real server serving ``policy``."""
    env = gym.make("CartPole-v1")
    total = 0.0
    with running_server(cartpole_config(tmp_path / "served", policy=policy)) as server:
        client = PolicyClient(server.url, inference_mode="remote", spool_dir=tmp_path / "spool")
        for n in range(episodes):
            episode_id = client.start_episode()
            observation, _ = env.reset(seed=100 + n)
            ended = False
            while not ended:
                action = client.get_action(episode_id, observation)
                observation, reward, terminated, truncated, _ = env.step(action)
                client.log_returns(episode_id, float(reward))
                total += float(reward)
                ended = terminated or truncated
            client.end_episode(episode_id, observation, truncated=not terminated)
        client.close()
    env.close()
    return total / episodes


def reads(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "reads.jsonl").read_text().splitlines()]


def assert_read_once(run_dir: Path, expected: tuple[int, int], ranks: int) -> None:
    """The ranks' read lines add up to every row of the version, each once: counted rows, and a
    digest of (episode_id, t) per row that adds up to the whole's only then."""
    lines = reads(run_dir)
    assert [line["rank"] for line in lines] == list(range(ranks))
    assert all(line["rows"] > 0 for line in lines)
    assert {line["data_version"] for line in lines} == {0}
    rows = sum(line["rows"] for line in lines)
    digest = sum(int(line["row_digest"]) for line in lines) % (1 << 64)
    assert (rows, digest) == expected


@pytest.mark.timeout(120)
def test_bc_on_one_and_two_gloo_ranks_serves_the_same_return(
    tmp_path: Path, expert_rows: tuple[int, int], capfd: pytest.CaptureFixture[str]
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    base = ["train", "bc", "--data", str(EXPERT), *SHORT]
    assert main([*base, "--run-dir", str(one)]) == 0
    assert main([*base, "--run-dir", str(two), "--workers", "2"]) == 0
    assert "effective batch size 512; lr 0.003" in capfd.readouterr().err
    last = json.loads((two / "metrics.jsonl").read_text().splitlines()[-1])
    assert (last["ranks"], last["effective_batch_size"], last["rows"]) == (2, 512, 25000)
    assert_read_once(two, expert_rows, ranks=2)
    assert sum(line["episodes"] for line in reads(two)) == 50  # whole episodes, split by id
    assert not (two / "checkpoints" / "policy-00000002.npz").exists()  # rank 0 wrote one
    for run_dir in (one, two):
        assert served_return(run_dir / "checkpoints", run_dir) >= BAR


def _ranks(launcher: int) -> list[int]:
    """The pids of the rank processes ``launcher`` spawned (not its resource tracker)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    return [
        int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


@pytest.mark.timeout(120)
def test_a_rank_killed_mid_run_fails_the_run_with_its_name(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline.commands.cli", "train", "bc", "--data",
               str(EXPERT), "--run-dir", str(run_dir), "--workers", "2", "--max-updates",
               "1000000", "--eval-every", "100000"]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "reads.jsonl").exists():  # both ranks have read: training
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        victim = _ranks(process.pid)[-1]
        os.kill(victim, signal.SIGKILL)
        _, err = process.communicate(timeout=30)  # ended, not hung on the dead rank
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 2
    assert re.search(
        r"rlpipe train: rank [01] of 2 was killed by SIGKILL, so the run stopped \(the other "
        r"ranks were ended\); start it again with the same --run-dir",
        err.decode(),
    ), err.decode()[-2000:]


def test_workers_are_for_offline_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["train", "sac", "--data", str(EXPERT), "--follow", "--workers", "2"]
    assert main(argv) == 2
    assert "train.workers: expected 1 learner with --follow" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bc_on_two_ray_workers_serves_the_same_return(
    ray_session: Any, tmp_path: Path, expert_rows: tuple[int, int]
) -> None:
    run_dir = tmp_path / "ray"
    argv = ["train", "bc", "--data", str(EXPERT), "--run-dir", str(run_dir), "--ray", *SHORT]
    assert main(argv) == 0
    assert_read_once(run_dir, expert_rows, ranks=2)
    reported = sorted((run_dir / "ray" / "train").glob("checkpoint_*/policy-*.npz"))
    assert [path.name for path in reported] == ["policy-00000001.npz"]  # rank 0's, to Ray Train
    assert served_return(run_dir / "checkpoints", run_dir) >= BAR
    np.testing.assert_array_equal(
        np.load(reported[0])["pi.0.weight"],
        np.load(run_dir / "checkpoints" / "policy-00000001.npz")["pi.0.weight"],
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (  # as Ray Train 2.60 words it when `kill -9` ends worker 1 (checked by hand)
            "Training failed due to worker errors:\n[Rank 0 Error Snippet]:\nRuntimeError: "
            "[gloo/transport/tcp/pair.cc:537] Read error: Connection reset by peer\n"
            "[Rank 1 Error Snippet]:\nray.exceptions.ActorDiedError: The actor died "
            "unexpectedly before finishing this task.\n",
            "Ray Train worker rank 1 died",
        ),
        (
            "Training failed due to worker errors:\n[Rank 0,1 Error Snippet]:\nTraceback\n"
            "pipeline.errors.DatasetError: ds: no rows to train on\n",
            "Ray Train worker rank 0,1 failed (pipeline.errors.DatasetError: ds: no rows to train "
            "on)",
        ),
        ("placement group timed out\nmore", "Ray Train failed (placement group timed out)"),
    ],
)
def test_a_failed_ray_run_names_the_worker(text: str, reason: str) -> None:
    from pipeline.trainers.raytrain import _ray_reason

    assert _ray_reason(RuntimeError(text)) == reason

"""A trainer killed with SIGKILL resumes from its last saved state and read position.

Real ``rlpipe train`` processes, killed with ``kill -9`` once they have saved their state and
started again with the same ``--run-dir``, while a writer in this process keeps committing
CartPole rows. What each process read comes from the run's read log (``RUN/reads.jsonl``): the
resumed process reads every shard after the saved position once and none before it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
from conftest import play
from trainer_factories import scripted_cartpole

from pipeline import DatasetWriter
from pipeline.commands.cli import main
from pipeline.dataset import discovery
from pipeline.dataset.location import locate
from pipeline.policy.checkpoint import latest_checkpoint, load_checkpoint
from pipeline.policy.network import NumpyPolicy
from pipeline.trainers import state

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--hidden", "16,16", "--eval-episodes", "1"]


def _start(data: Path, run_dir: Path, *flags: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "train",
        *flags,
        "--data",
        str(data),
        "--run-dir",
        str(run_dir),
        *SMALL,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "error"}
    with (run_dir.parent / f"{run_dir.name}-stderr.txt").open("ab") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env=env)


def _progress(run_dir: Path) -> state.Progress | None:
    path = run_dir / state.STATE_FILE
    return state.Progress.pop(state.load_state(path), path) if path.exists() else None


def _wait_until(
    process: subprocess.Popen[bytes], run_dir: Path, saved: Callable[[state.Progress], bool]
) -> None:
    """Wait for a saved state that ``saved`` accepts, while the process still runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        progress = _progress(run_dir)
        if progress is not None and saved(progress):
            return
        time.sleep(0.02)
    stderr = (run_dir.parent / f"{run_dir.name}-stderr.txt").read_text()[-2000:]
    raise AssertionError(f"no state saved before exit {process.returncode}: {stderr}")


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=20) == -signal.SIGKILL


def _finish(process: subprocess.Popen[bytes], run_dir: Path) -> None:
    code = process.wait(timeout=120)
    stderr = (run_dir.parent / f"{run_dir.name}-stderr.txt").read_text()[-2000:]
    assert code == 0, stderr


def _lines(run_dir: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / name).read_text().splitlines()]


def _shard_rows(data: Path) -> dict[str, int]:
    """Every committed shard (as a path under the dataset root) and its rows."""
    root = os.path.abspath(data)
    paths = discovery.list_shards(locate(root))
    return {path[len(root) + 1 :]: pq.ParquetFile(path).metadata.num_rows for path in paths}


def _act(
    policy: NumpyPolicy | None, rng: np.random.Generator, logps: list[float], observation: Any
) -> int:
    """A random action, or the policy's (its logp kept)."""
    if policy is None:
        return int(rng.integers(2))
    action, logp = policy.act(observation[None], rng)
    logps.append(float(logp[0]))
    return int(action[0])


def _write(writer: DatasetWriter, stop: threading.Event, data: Path, own_rows: bool) -> None:
    """Commit a CartPole episode at a time (a shard each) until ``stop``; with ``own_rows``,
    acted by the newest published checkpoint, with its logp and version, as PPO needs."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    episode = 0
    while not stop.is_set():
        path = latest_checkpoint(data) if own_rows else None
        if own_rows and path is None:
            stop.wait(0.05)
            continue
        policy = NumpyPolicy(load_checkpoint(path)) if path is not None else None
        logps: list[float] = []
        act = functools.partial(_act, policy, rng, logps)
        columns: dict[str, Any] = play(env, act, f"e{episode}", seed=episode, max_steps=60)
        if policy is not None:
            columns["action_logp"] = logps
            columns["policy_version"] = [policy.version] * len(logps)
        writer.append(columns)
        writer.flush()
        episode += 1
        stop.wait(0.03)
    env.close()


def _kill_and_resume(tmp_path: Path, algorithm: str, *flags: str) -> dict[str, Any]:
    """A follower killed once it saved a read position, started again while the writer goes on;
    what the run directory and the dataset then hold."""
    data, run_dir = tmp_path / "ds", tmp_path / "run"
    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    stop = threading.Event()
    args = (algorithm, "--follow", "--timeout", "2", *flags)
    with DatasetWriter(data, *spaces, env_id="CartPole-v1") as writer:
        thread = threading.Thread(target=_write, args=(writer, stop, data, algorithm == "ppo"))
        thread.start()
        try:
            first = _start(data, run_dir, *args)
            _wait_until(first, run_dir, lambda progress: bool(progress.shards))
            time.sleep(0.3)  # reads after the save: the resumed run reads them again
            _kill(first)
            killed = _progress(run_dir)
            published = load_checkpoint(latest_checkpoint(data)).version  # type: ignore[arg-type]
            logged = len(_lines(run_dir, "metrics.jsonl"))
            second = _start(data, run_dir, *args)
            _wait_until(second, run_dir, lambda progress: progress != killed)
            time.sleep(0.5)  # rows committed after the resumed run's first save
        finally:
            stop.set()
            thread.join()
    _finish(second, run_dir)
    assert killed is not None
    return {
        "killed": killed,
        "published": published,
        "logged": logged,
        "shards": _shard_rows(data),
        "final": _progress(run_dir),
        "reads": _lines(run_dir, "reads.jsonl"),
        "metrics": _lines(run_dir, "metrics.jsonl"),
    }


def _check_each_row_read_once(run: dict[str, Any]) -> None:
    killed, final, shards = run["killed"], run["final"], run["shards"]
    pids = list(dict.fromkeys(line["pid"] for line in run["reads"]))
    assert len(pids) == 2  # the killed process, then the resumed one
    resumed = [line for line in run["reads"] if line["pid"] == pids[1]]
    read = [shard for line in resumed for shard in line["shards"]]
    assert len(read) == len(set(read))  # no shard twice
    assert not set(read) & killed.shards  # none before the saved position
    assert set(read) | killed.shards == set(shards)  # none skipped after it
    assert sum(line["rows"] for line in resumed) == sum(shards[s] for s in read)
    versions = [line["data_version"] for line in run["reads"]]
    assert versions == sorted(versions) and all(v >= 0 for v in versions)  # the log read up to
    first_reads = {s for line in run["reads"] if line["pid"] == pids[0] for s in line["shards"]}
    assert killed.shards <= first_reads  # the position is what the killed process read
    # the final position: every shard but those read and not yet trained on (PPO's rows short
    # of a batch), with the rows of them all counted
    assert final.shards >= killed.shards and set(shards) - final.shards <= set(read)
    assert final.env_steps == sum(shards[s] for s in final.shards)


def _check_counters_go_on(run: dict[str, Any]) -> None:
    """Versions go on after the newest on disk at the kill (the killed process may have logged
    one it had not finished writing: only a version on disk is never reused), updates after the
    saved count."""
    killed, metrics = run["killed"], run["metrics"]
    before, after = metrics[: run["logged"]], metrics[run["logged"] :]
    for entries in (before, after):
        versions = [entry["version"] for entry in entries]
        assert versions == sorted(set(versions))
    assert after[0]["version"] > run["published"]
    assert after[0]["update"] == killed.updates  # the resumed run's first version
    updates = [entry["update"] for entry in after]
    assert updates == sorted(updates) and updates[-1] > killed.updates
    assert run["final"].version == after[-1]["version"]


def test_a_killed_follower_reads_each_row_once_across_the_restart(tmp_path: Path) -> None:
    """BC online (a replay buffer, as SAC and CQL): the resumed run's buffer starts from the
    rows after the saved position."""
    run = _kill_and_resume(tmp_path, "bc", "--batch-size", "64", "--eval-every", "10")
    _check_each_row_read_once(run)
    _check_counters_go_on(run)
    assert run["final"].shards == set(run["shards"])  # every row is in the buffer at once


def test_a_killed_ppo_follower_resumes_on_its_own_versions_rows(tmp_path: Path) -> None:
    """PPO reads the rows of its own versions: after the restart, still from its first one, so
    rows acted by the killed process's versions after the saved position are read too."""
    run = _kill_and_resume(tmp_path, "ppo", "--batch-size", "128", "--eval-every", "2")
    _check_each_row_read_once(run)
    _check_counters_go_on(run)
    assert run["final"].min_policy_version == run["killed"].min_policy_version == 1
    assert run["final"].trained_rows > run["killed"].trained_rows


def test_a_killed_offline_run_ends_as_if_never_killed(tmp_path: Path) -> None:
    """Offline, the position is the update count and the minibatch sampler: the resumed run
    repeats the updates since the last save, and ends with the weights of an unkilled run."""
    data = scripted_cartpole(tmp_path / "ds", steps=1000, epsilon=0.1)
    run_dir = tmp_path / "run"
    flags = ("bc", "--max-updates", "1200", "--eval-every", "150")
    first = _start(data, run_dir, *flags)
    _wait_until(first, run_dir, lambda progress: progress.updates >= 150)
    _kill(first)
    killed = _progress(run_dir)
    assert killed is not None and 150 <= killed.updates < 1200
    _finish(_start(data, run_dir, *flags), run_dir)
    metrics = _lines(run_dir, "metrics.jsonl")
    # the update count goes on from the saved one (a record the kill cut off may be missing)
    updates, versions = [e["update"] for e in metrics], [e["version"] for e in metrics]
    assert updates == sorted(set(updates)) and updates[-1] == 1200
    assert set(updates) >= set(range((killed.updates // 150 + 1) * 150, 1201, 150))
    assert versions == sorted(set(versions))
    unkilled = tmp_path / "unkilled"
    argv = ["train", *flags, "--data", str(data), "--run-dir", str(unkilled), *SMALL]
    assert main(argv) == 0
    mine = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    theirs = load_checkpoint(latest_checkpoint(unkilled))  # type: ignore[arg-type]
    assert mine.version >= theirs.version == 8  # more if a kill lost a version's state
    for name, weights in theirs.weights.items():
        np.testing.assert_array_equal(mine.weights[name], weights, err_msg=name)

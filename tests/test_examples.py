"""Each example in ``examples/`` run as a user runs it: a subprocess from the project root, with
small flags, its printed output checked against the data it wrote."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import InputReader
from pipeline.commands.replay import replay_episode

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchor-data" / "rllib-test-data"
# One torch thread: on a shared 2-core machine, two spinning threads make an update ~15x slower.
ENV = {**os.environ, "PYTHONWARNINGS": "error", "OMP_NUM_THREADS": "1"}
EPISODE_LINE = re.compile(r"^episode (\w+): total reward ([\d.]+)$", re.MULTILINE)


def run_example(name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, f"examples/{name}", *args], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def start_example(name: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, f"examples/{name}", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def first_line(process: subprocess.Popen[str], timeout: float = 30) -> str:
    """The process's first line of stdout, or a failure with its stderr."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if selector.select(timeout):
            line = process.stdout.readline()
            if line:
                return line
    process.kill()
    _, err = process.communicate()
    pytest.fail(f"no output from {process.args!r}: {err[-2000:]}")


def finish(process: subprocess.Popen[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Wait for the process (killing it after ``timeout``), so no test leaves one running."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_cartpole_clients_in_both_modes_log_whole_episodes_to_the_server(tmp_path: Path) -> None:
    data = tmp_path / "ds"
    server = start_example("cartpole_server.py", "--data", str(data), "--port", "0")
    try:
        address = re.fullmatch(r"serving http://127\.0\.0\.1:(\d+) -> .*\n", first_line(server))
        assert address is not None
        port = address.group(1)
        clients = [
            start_example("cartpole_client.py", "--port", port, "--inference-mode", "remote",
                          "--episodes", "3", "--seed", "0"),
            start_example("cartpole_client.py", "--port", port, "--inference-mode", "local",
                          "--episodes", "3", "--seed", "10"),
            start_example("cartpole_client.py", "--port", port, "--inference-mode", "remote",
                          "--off-policy", "--episodes", "2", "--seed", "20"),
        ]  # fmt: skip
        results = [finish(client) for client in clients]
    finally:
        server.send_signal(signal.SIGTERM)
        served = finish(server)
    for result in (*results, served):
        assert result.returncode == 0, result.stdout + result.stderr
    outputs = [result.stdout for result in results]

    printed: dict[str, float] = {}
    for out, count in zip(outputs, (3, 3, 2), strict=True):
        assert f"{count} episodes, all steps delivered: True" in out
        found = {eid: float(total) for eid, total in EPISODE_LINE.findall(out)}
        assert len(found) == count, out
        printed |= found
    assert f"recorded {len(printed)} episodes" in served.stdout

    episodes = {str(e.episode_ids[0]): e for e in InputReader(data, episodes=True)}
    assert set(episodes) == set(printed)
    for episode_id, episode in episodes.items():
        np.testing.assert_array_equal(episode.ts, np.arange(len(episode)))
        assert float(episode.rewards.sum()) == printed[episode_id] == len(episode)
        assert episode.terminateds[-1] or episode.truncateds[-1]
        assert not (episode.terminateds[:-1].any() or episode.truncateds[:-1].any())
    # The clients record each episode's seed: the server's data replays exactly, in every mode.
    for out in outputs:
        first_episode_id = EPISODE_LINE.findall(out)[0][0]
        assert replay_episode(data, first_episode_id).exact


def test_import_rllib_gives_the_counts_and_returns_of_the_source(tmp_path: Path) -> None:
    source = ANCHOR / "cartpole" / "large.json"
    if not source.exists():
        pytest.skip(f"anchor data absent: {source}")
    returns: dict[int, float] = {}
    steps = 0
    for line in source.read_text().splitlines():
        batch = json.loads(line)
        for episode, reward in zip(batch["eps_id"], batch["rewards"], strict=True):
            returns[episode] = returns.get(episode, 0.0) + reward
            steps += 1
    mean = math.fsum(returns.values()) / len(returns)

    out = run_example("import_rllib.py", "--out", str(tmp_path / "imported")).stdout
    assert f"InputReader: {len(returns)} episodes, {steps} steps, mean return {mean:.2f}" in out
    assert f"imported {steps} steps in {len(returns)} episodes (1 terminated, 20 truncated" in out


def test_import_rllib_skips_cleanly_without_the_recording(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    out = run_example("import_rllib.py", str(missing), "--out", str(tmp_path / "x")).stdout
    assert out == f"skipped: no RLlib recording at {missing} (the anchor data is not here)\n"
    assert not (tmp_path / "x").exists()


def test_replay_episode_replays_a_recorded_episode_exactly(tmp_path: Path) -> None:
    data, gif = tmp_path / "ds", tmp_path / "replay.gif"
    out = run_example("replay_episode.py", "--data", str(data), "--episodes", "3", "--seed", "7",
                      "--render", str(gif)).stdout  # fmt: skip
    episodes = {str(e.episode_ids[0]): len(e) for e in InputReader(data, episodes=True)}
    assert sorted(episodes) == ["episode-0", "episode-1", "episode-2"]
    steps = episodes["episode-2"]
    assert (f"episode episode-2 (CartPole-v1, seed 9, {steps} steps): replayed {steps} steps "
            "with zero divergence") in out  # fmt: skip
    assert gif.read_bytes()[:6] == b"GIF89a"


def test_offline_bc_learns_cartpole_from_a_scripted_controller(tmp_path: Path) -> None:
    if importlib.util.find_spec("pipeline.trainers.command") is None:
        pytest.skip("pipeline/trainers/command.py (rlpipe train) does not exist yet")
    run_dir = tmp_path / "run"
    out = run_example("offline_bc.py", "--data", str(tmp_path / "ds"), "--episodes", "5",
                      "--max-seconds", "30", "--max-updates", "500", "--run-dir", str(run_dir),
                      timeout=90).stdout  # fmt: skip
    # the controller balances the pole for CartPole-v1's whole 500 steps from each of these seeds
    assert f"data: {tmp_path / 'ds'}, 5 episodes, mean return 500.0" in out
    found = re.search(r"BC policy: greedy mean return ([\d.]+) over 5 episodes", out)
    assert found is not None, out
    assert float(found.group(1)) >= 400
    assert list((run_dir / "checkpoints").glob("policy-*.npz"))


@pytest.mark.parametrize("mode", ["remote", "local"])
def test_vector_client_logs_each_sub_env_s_episodes(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "ds"
    server = start_example("cartpole_server.py", "--data", str(data), "--port", "0")
    try:
        address = re.fullmatch(r"serving http://127\.0\.0\.1:(\d+) -> .*\n", first_line(server))
        assert address is not None
        client = run_example("cartpole_vector_client.py", "--port", address.group(1),
                             "--inference-mode", mode, "--envs", "4", "--steps", "120",
                             "--seed", "3")  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        served = finish(server)
    assert served.returncode == 0, served.stderr
    line = (r"^(\d+) steps in (\d+) episodes \((\d+) ended by the envs, (\d+) truncated by "
            r"close\); all steps delivered: True$")  # fmt: skip
    printed = re.search(line, client.stdout, re.M)
    assert printed is not None, client.stdout
    steps, episodes, ended, closed = map(int, printed.groups())
    recorded = list(InputReader(data, episodes=True))
    assert (sum(map(len, recorded)), len(recorded)) == (steps, episodes)
    assert sum(bool(e.truncateds[-1]) for e in recorded) == closed
    assert sum(bool(e.terminateds[-1]) for e in recorded) == ended  # no CartPole lasts 500 here
    table = pq.read_table(data / "episodes", columns=["episode_id", "seed"]).to_pylist()
    seeded = {row["episode_id"]: row["seed"] for row in table if row["seed"] is not None}
    assert sorted(seeded.values()) == [3, 4, 5, 6]  # each sub-env's first episode
    assert all(replay_episode(data, episode_id).exact for episode_id in seeded)

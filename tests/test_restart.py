"""A ``kill -9`` and restart of ``rlpipe serve`` in the middle of episodes is invisible to clients.

Real server processes, real CartPole clients, real kills: each client keeps the transitions it
was answered for, and after the restart the dataset must hold exactly those rows (none lost,
none twice, ``t`` from 0 without a gap, the actions the clients were given) and the right
summaries, as an uninterrupted run would.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import requests
from server_fixtures import ROOT, free_port

from pipeline.client import PolicyClient

TIMEOUT_S = 60.0  # the client retries a call this long while the server is down


class Server:
    """``rlpipe serve`` on a fixed port and dataset, killed and started again at will (its
    stderr goes to a file: a pipe nobody reads would block a server that logs a lot)."""

    def __init__(self, data: Path, log: Path, *extra: str) -> None:
        self.data, self.port, self.log, self.extra = data, free_port(), log, extra
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "serve", "--data", str(self.data),
                 "--env", "CartPole-v1", "--port", str(self.port), *self.extra],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://{self.address}/v1/health", timeout=1).ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
            assert self.process.poll() is None, self.log.read_text()[-3000:]
        raise AssertionError(f"rlpipe serve did not start: {self.log.read_text()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(timeout=60)
        assert code in (-sig, 0 if sig == signal.SIGTERM else -sig), self.log.read_text()[-3000:]

    def restart(self) -> None:
        self.kill()
        self.start()


@contextmanager
def serving(tmp_path: Path, *extra: str) -> Iterator[Server]:
    server = Server(tmp_path / "ds", tmp_path / "serve.log", *extra)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill(signal.SIGTERM)  # a clean stop: the stored rows are committed
    log = server.log.read_text()
    assert "Traceback" not in log, log[-3000:]


@dataclass
class Played:
    """What a client saw: a row per transition it was answered for, a summary per episode."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    summaries: dict[tuple[str, str], tuple[int, float, str]] = field(default_factory=dict)


class Walker:
    """One CartPole episode played by a remote-inference client, a step per call to
    :meth:`step`; with ``agents`` several CartPoles as the agents of one multi-agent episode
    (each stops when its pole falls; the episode when every pole has)."""

    def __init__(
        self, client: PolicyClient, episode_id: str, seed: int, agents: tuple[str, ...] = ()
    ) -> None:
        self.client, self.episode_id, self.agents = client, episode_id, agents
        names = agents or ("agent0",)
        self.envs = {agent: gym.make("CartPole-v1") for agent in names}
        self.observations = {
            agent: env.reset(seed=seed + i)[0] for i, (agent, env) in enumerate(self.envs.items())
        }
        self.t = dict.fromkeys(names, 0)
        self.returns = dict.fromkeys(names, 0.0)
        self.stopped: set[str] = set()  # pole fallen
        self.gone: set[str] = set()  # and its last observation sent
        client.start_episode(episode_id=episode_id)

    def step(self, played: Played) -> bool:
        """One get_action and env step (and log_returns); True once the episode has ended."""
        observed = {a: o for a, o in self.observations.items() if a not in self.gone}
        if not self.agents:
            actions = {"agent0": self.client.get_action(self.episode_id, observed["agent0"])}
        else:  # a fallen pole's last observation completes its last step; it gets no action
            actions = self.client.get_action(self.episode_id, observed)
            self.gone |= self.stopped & set(observed)
        rewards, dones = {}, {}
        for agent, action in actions.items():
            observation, reward, terminated, _, _ = self.envs[agent].step(action)
            played.rows.append(
                {
                    "episode_id": self.episode_id,
                    "agent_id": agent,
                    "t": self.t[agent],
                    "observation": self.observations[agent],
                    "action": action,
                    "reward": reward,
                    "next_observation": observation,
                    "terminated": terminated,
                }
            )
            self.observations[agent], rewards[agent], dones[agent] = observation, reward, terminated
            self.t[agent] += 1
            self.returns[agent] += reward
            if terminated:
                self.stopped.add(agent)
        if not self.agents:
            self.client.log_returns(self.episode_id, rewards["agent0"])
        else:
            self.client.log_returns(self.episode_id, rewards, multiagent_done_dict=dones)
        if len(self.stopped) < len(self.envs):
            return False
        last: Any = {a: o for a, o in self.observations.items() if a not in self.gone}
        if not self.agents:
            last = last["agent0"]
        self.client.end_episode(self.episode_id, last)
        for agent in self.envs:
            summary = (self.t[agent], self.returns[agent], "terminated")
            played.summaries[(self.episode_id, agent)] = summary
        return True


def check_stored(data: Path, played: Played) -> None:
    """The dataset holds exactly the rows the clients played, once each, and their summaries."""
    steps = pd.read_parquet(data / "steps")
    assert not steps.duplicated(["episode_id", "agent_id", "t"]).any()
    steps = steps.set_index(["episode_id", "agent_id", "t"]).sort_index()
    expected = pd.DataFrame(played.rows).set_index(["episode_id", "agent_id", "t"]).sort_index()
    assert list(steps.index) == list(expected.index)
    for column in ("action", "reward", "terminated"):
        assert steps[column].tolist() == expected[column].tolist(), column
    for column in ("observation", "next_observation"):
        np.testing.assert_array_equal(np.stack(steps[column]), np.stack(expected[column]))
    assert not steps["truncated"].any()
    episodes = pd.read_parquet(data / "episodes")
    assert not episodes.duplicated(["episode_id", "agent_id"]).any()
    stored = {
        (row.episode_id, row.agent_id): (row.length, row["return"], row.end_reason)
        for _, row in episodes.iterrows()
    }
    assert stored == played.summaries


def test_kill_between_calls(tmp_path: Path) -> None:
    played = Played()
    with serving(tmp_path) as server:
        client = PolicyClient(server.address, "remote", timeout=TIMEOUT_S)
        walkers = [Walker(client, f"e{i}", seed=i) for i in range(4)]
        for k, walker in enumerate(walkers):
            for _ in range(k + 1):  # each mid-episode, at its own t
                assert not walker.step(played)
        server.restart()
        for walker in walkers:
            while not walker.step(played):
                pass
        assert client.close()
    check_stored(server.data, played)


def test_kill_while_requests_are_in_flight(tmp_path: Path) -> None:
    """Clients play at full speed through three kills: a call the kill cut off is retried and
    gets the answer it was given before the kill, or is run afresh if it was not given one."""
    played, stop, failures = Played(), threading.Event(), []

    def play(n: int) -> None:
        mine = Played()
        try:
            client = PolicyClient(server.address, "remote", timeout=TIMEOUT_S)
            for k in range(10_000):
                walker = Walker(client, f"c{n}-{k}", seed=1000 * n + k)
                while not walker.step(mine):
                    pass
                if stop.is_set():
                    break
            assert client.close()
        except BaseException as error:
            failures.append(error)
        played.rows.extend(mine.rows)
        played.summaries.update(mine.summaries)

    with serving(tmp_path) as server:
        threads = [threading.Thread(target=play, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        rng = np.random.default_rng(0)
        for _ in range(3):
            time.sleep(float(rng.uniform(0.5, 1.5)))
            server.restart()
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures, failures
    assert len(played.summaries) > 12
    check_stored(server.data, played)


def test_multiagent_kill_between_calls(tmp_path: Path) -> None:
    played = Played()
    with serving(tmp_path) as server:
        client = PolicyClient(server.address, "remote", timeout=TIMEOUT_S)
        walkers = [Walker(client, f"m{i}", seed=10 * i, agents=("a", "b", "c")) for i in range(3)]
        for k, walker in enumerate(walkers):
            for _ in range(k + 2):
                assert not walker.step(played)
        server.restart()
        for walker in walkers:
            while not walker.step(played):
                pass
        assert client.close()
    check_stored(server.data, played)


def test_local_inference_across_a_kill(tmp_path: Path) -> None:
    """Local inference keeps its episodes in the client: they go on while the server is down,
    their steps spool, and every one is delivered once after the restart."""
    played = Played()
    with serving(tmp_path) as server:
        client = PolicyClient(
            server.address,
            "local",
            timeout=TIMEOUT_S,
            spool_dir=tmp_path / "spool",
            upload_interval_s=0.05,
            update_interval=None,
        )
        walkers = [Walker(client, f"l{i}", seed=i) for i in range(3)]
        for walker in walkers:
            for _ in range(3):
                assert not walker.step(played)
        assert client.flush(30)
        server.kill()
        for walker in walkers:  # the server is down: the episodes go on
            for _ in range(3):
                assert not walker.step(played)
        server.start()
        for walker in walkers:
            while not walker.step(played):
                pass
        assert client.close(60)
    check_stored(server.data, played)

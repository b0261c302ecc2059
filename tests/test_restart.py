"""A ``kill -9`` and restart of ``rlpipe serve`` in the middle of episodes is invisible to clients.

Real server processes, real CartPole clients, real kills: each client keeps the transitions it
was answered for, and after the restart the dataset must hold exactly those rows (none lost,
none twice, ``t`` from 0 without a gap, the actions the clients were given) and the right
summaries, as an uninterrupted run would.
"""

from __future__ import annotations

import json
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
import pytest
import requests
from server_fixtures import ROOT, answers, free_port, metric, wait_for

from pipeline.client import PolicyClient

TIMEOUT_S = 60.0  # the client retries a call this long while the server is down


class Server:
    """``rlpipe serve`` on a fixed port and dataset, killed and started again at will (its
    stderr goes to a file: a pipe nobody reads would block a server that logs a lot)."""

    def __init__(self, data: Path, log: Path, *extra: str, journal_bytes: int) -> None:
        self.data, self.port, self.log, self.extra = data, free_port(), log, extra
        self.journal_bytes = journal_bytes
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _SERVE,
                    str(self.journal_bytes),
                    "serve",
                    "--data",
                    str(self.data),
                    "--env",
                    "CartPole-v1",
                    "--port",
                    str(self.port),
                    *self.extra,
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        if not answers(f"http://{self.address}/v1/health", self.process, 60.0):
            raise AssertionError(f"rlpipe serve did not start: {self.log.read_text()[-3000:]}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.process is not None
        self.process.send_signal(sig)
        code = self.process.wait(timeout=60)
        assert code in (-sig, 0 if sig == signal.SIGTERM else -sig), self.log.read_text()[-3000:]

    def restart(self) -> None:
        self.kill()
        self.start()


# ``rlpipe serve`` with the journal's roll size set: small, so that the tests roll it often
_SERVE = (
    "import sys; import server.journal as j; j.MAX_BYTES = int(sys.argv[1]); "
    "from pipeline.commands.cli import main; sys.exit(main(sys.argv[2:]))"
)


@contextmanager
def serving(
    tmp_path: Path, *extra: str, journal_bytes: int = 4 * 2**20, name: str = "serve"
) -> Iterator[Server]:
    """A server on ``tmp_path / "ds"`` (``name``: its log's name, for several on one dataset)."""
    log = tmp_path / f"{name}.log"
    server = Server(tmp_path / "ds", log, *extra, journal_bytes=journal_bytes)
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


@pytest.mark.parametrize("journal_bytes", [512, 4 * 2**20], ids=["rolling", "one-file"])
def test_kill_between_calls(tmp_path: Path, journal_bytes: int) -> None:
    """Clients mid-episode, each at its own ``t``; with a journal that rolls at almost every
    record (each new file starting with a snapshot), or never."""
    _walk_across_a_kill(tmp_path, journal_bytes, "e", seeds=range(4))


@pytest.mark.parametrize(
    ("sync", "journal_bytes"), [("background", 16 * 2**10), ("always", 4 * 2**20)]
)
def test_kill_while_requests_are_in_flight(tmp_path: Path, sync: str, journal_bytes: int) -> None:
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

    with serving(tmp_path, "--sync", sync, journal_bytes=journal_bytes) as server:
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
    _walk_across_a_kill(tmp_path, 4 * 2**20, "m", seeds=range(0, 30, 10), agents=("a", "b", "c"))


def _walk_across_a_kill(
    tmp_path: Path,
    journal_bytes: int,
    prefix: str,
    seeds: range,
    agents: tuple[str, ...] = (),
) -> None:
    """Episodes each mid-way, at its own ``t``, across a kill -9 and restart, then played to
    their ends: the stored rows are those played."""
    played = Played()
    with serving(tmp_path, journal_bytes=journal_bytes) as server:
        client = PolicyClient(server.address, "remote", timeout=TIMEOUT_S)
        walkers = [
            Walker(client, f"{prefix}{i}", seed=seed, agents=agents) for i, seed in enumerate(seeds)
        ]
        for k, walker in enumerate(walkers):
            for _ in range(k + 1):
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


def _post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = requests.post(f"http://{server.address}/v1{path}", json=body, timeout=30)
    assert answer.ok, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


def _drop_last_append(server: Server, table: str) -> None:
    """Remove the last append from the dead server's log of ``table``: the state a kill leaves
    when it comes after the journal's record of a pass and before the pass's rows."""
    (segment,) = (server.data / "_wal").glob(f"*/{table}-*.rows")
    lines = segment.read_bytes().splitlines(keepends=True)
    assert len(lines) >= 2  # the header, then one line per append
    segment.write_bytes(b"".join(lines[:-1]))


def test_a_pass_whose_rows_never_landed_runs_afresh_on_retry(tmp_path: Path) -> None:
    observations = np.random.default_rng(0).uniform(-0.05, 0.05, (3, 4)).round(3).tolist()
    with serving(tmp_path, "--commit-age", "600") as server:
        _post(server, "/episodes", {"episode_id": "e"})
        _post(server, "/episodes/e/actions", {"request": 1, "observation": observations[0]})
        second = {"request": 2, "observation": observations[1], "reward": 1.0}
        _post(server, "/episodes/e/actions", second)
        server.kill()
        _drop_last_append(server, "steps")  # request 2's row never landed
        server.start()
        _post(server, "/episodes/e/actions", second)  # its answer was lost: sent again
        _post(server, "/episodes/e/end", {"request": 3, "observation": observations[2]})
    steps = pd.read_parquet(server.data / "steps").sort_values("t")
    assert steps["t"].tolist() == [0, 1]
    assert np.stack(steps["next_observation"]).tolist() == np.float32(observations[1:]).tolist()
    assert steps["reward"].tolist() == [1.0, 0.0]
    assert "never landed" in server.log.read_text()


def test_an_end_whose_summary_never_landed_is_completed(tmp_path: Path) -> None:
    with serving(tmp_path, "--commit-age", "600") as server:
        _post(server, "/episodes", {"episode_id": "e"})
        _post(server, "/episodes/e/actions", {"request": 1, "observation": [0.0] * 4})
        end = {"request": 2, "observation": [0.01] * 4, "reward": 2.0}
        assert _post(server, "/episodes/e/end", end) == {"episode_id": "e", "ended": True}
        server.kill()
        _drop_last_append(server, "episodes")  # the step row landed, the summary did not
        server.start()
        assert _post(server, "/episodes/e/end", end) == {"episode_id": "e", "ended": True}
    assert pd.read_parquet(server.data / "steps")["t"].tolist() == [0]
    episodes = pd.read_parquet(server.data / "episodes")
    assert episodes[["episode_id", "length", "return", "end_reason"]].values.tolist() == [
        ["e", 1, 2.0, "terminated"]
    ]


def test_servers_sharing_a_dataset_adopt_only_the_dead(tmp_path: Path) -> None:
    """Two servers on one dataset, each with clients mid-episode: the one killed and restarted
    takes back its own episodes, and never the live one's, whose clients go on undisturbed."""
    played = Played()
    with serving(tmp_path) as first, serving(tmp_path, name="second") as second:
        clients = [PolicyClient(s.address, "remote", timeout=TIMEOUT_S) for s in (first, second)]
        walkers = [
            Walker(c, f"s{n}-{i}", seed=10 * n + i) for n, c in enumerate(clients) for i in range(2)
        ]
        for walker in walkers:
            for _ in range(3):
                assert not walker.step(played)
        first.restart()
        for walker in walkers:
            while not walker.step(played):
                pass
        assert all(client.close() for client in clients)
    check_stored(first.data, played)
    assert "adopted" in first.log.read_text() and "adopted" not in second.log.read_text()


def test_adopted_episodes_are_reaped_when_idle_counting_from_the_restart(tmp_path: Path) -> None:
    with serving(tmp_path, "--idle-timeout", "2") as server:
        _post(server, "/episodes", {"episode_id": "idle"})
        _post(server, "/episodes/idle/actions", {"request": 1, "observation": [0.0] * 4})
        _post(server, "/episodes", {"episode_id": "busy"})
        _post(server, "/episodes/busy/actions", {"request": 1, "observation": [0.0] * 4})
        server.kill()
        time.sleep(2.5)  # longer than the idle timeout: the timer starts again at adoption
        server.start()
        _post(server, "/episodes/busy/end", {"request": 2, "observation": [0.1] * 4})
        health = f"http://{server.address}/v1/health"
        wait_for(
            lambda: requests.get(health, timeout=5).json()["open_episodes"] == 0,
            20,
            "no episode open",
        )
    episodes = pd.read_parquet(server.data / "episodes").set_index("episode_id")
    assert episodes["end_reason"].to_dict() == {"busy": "terminated", "idle": "closed"}
    steps = pd.read_parquet(server.data / "steps").set_index("episode_id")
    assert steps.loc["idle", "truncated"] and steps.loc["idle", "t"] == 0  # its pending step


def test_a_vector_env_across_kills(tmp_path: Path) -> None:
    """A vector env's batch requests (many episodes each) carry across two kills in flight."""
    from gymnasium.vector import AutoresetMode
    from test_vector import _check_log, _run

    with serving(tmp_path) as server:
        client = PolicyClient(server.address, "remote", timeout=TIMEOUT_S)
        run: dict[str, Any] = {}
        driver = threading.Thread(
            target=lambda: run.update(_run(client, AutoresetMode.NEXT_STEP, 3000))
        )
        driver.start()
        for _ in range(2):
            _wait_for_steps(server, 400)  # since it (re)started
            assert driver.is_alive()  # the kill comes mid-run
            server.restart()
        driver.join()
        assert client.close()
    assert run, "the vector env did not finish"
    _check_log(server.data, run)


def test_a_batch_records_the_episodes_it_opens_with_its_pass(tmp_path: Path) -> None:
    """A batch that opens episodes writes one journal record, its pass, which holds their starts
    (and waits for no other pass to record them); killed right after, the server comes back with
    them open, their pending steps in place."""
    ids = [f"v{i}" for i in range(4)]
    with serving(tmp_path) as server:
        url = f"http://{server.address}/v1/actions"
        body = {"episode_ids": ids, "observations": [[0.0] * 4] * 4, "starts": [{}] * 4}
        assert requests.post(url, json={**body, "requests": [1] * 4}, timeout=10).ok
        (journal,) = (server.data / "_journal").glob("*/journal-*.jsonl")
        records = [json.loads(line) for line in journal.read_text().splitlines()]
        assert [record["k"] for record in records] == ["snapshot", "pass"]
        assert [start["id"] for start in records[1]["q"][0]["starts"]] == ids
        server.restart()
        body = {"episode_ids": ids, "observations": [[0.5] * 4] * 4, "rewards": [1.0] * 4}
        answer = requests.post(url, json={**body, "requests": [2] * 4}, timeout=10)
        assert answer.status_code == 200, answer.text
    steps = pd.read_parquet(server.data / "steps")  # and a row each the stop closed, t = 1
    first = steps[steps.t == 0]
    assert sorted(first.episode_id) == ids and sorted(steps[steps.t == 1].episode_id) == ids
    assert (np.stack(first.next_observation) == 0.5).all() and (first.reward == 1.0).all()


def _wait_for_steps(server: Server, n: int) -> None:
    """Until the server has accepted ``n`` steps since it started."""

    def accepted() -> float:
        text = requests.get(f"http://{server.address}/v1/metrics", timeout=5).text
        return metric(text, "rlpipe_steps_accepted_total") or 0

    wait_for(lambda: accepted() >= n, 60, f"the server to accept {n} steps")

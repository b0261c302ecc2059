"""docs/deploy.md, for real: three ``rlpipe serve`` processes on one dataset behind haproxy, run
with the configuration the doc shows, and a PolicyClient given the three addresses. A trainer
following the dataset reads every step the clients were acknowledged, once. The dataset is a
directory, or a prefix of a bucket on moto's S3 endpoint (``s3_fixtures``), each server then
with a local state directory of its own, as on machines of their own."""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import pyarrow.fs as pafs
import pytest
import requests
from s3_fixtures import Bucket
from server_fixtures import (
    ROOT,
    answers,
    free_port,
    kill,
    metric,
    server_log,
    start_serve_process,
)

from pipeline import InputReader
from pipeline.client import PolicyClient
from pipeline.client.vector import VectorEpisodes
from pipeline.dataset import discovery
from pipeline.dataset.location import locate
from pipeline.dataset.writer import KILL_AFTER_SHARD_WRITE
from pipeline.format import layout

Acked = collections.Counter[tuple[str, int]]  # (episode_id, t) of the steps acknowledged
SERVE = ("--commit-age", "0.2")  # commit often: the follower's wait at the end is short


def haproxy_config() -> str:
    """The one haproxy configuration ``docs/deploy.md`` shows."""
    found = re.findall(r"```haproxy\n(.*?)```", (ROOT / "docs" / "deploy.md").read_text(), re.S)
    assert len(found) == 1, "docs/deploy.md shows one haproxy configuration"
    return str(found[0])


@pytest.fixture
def haproxy() -> str:
    # Debian installs it in /usr/sbin, which a user's PATH often leaves out
    path = shutil.which("haproxy", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin")
    if path is None:
        message = "haproxy is not installed (apt-get install haproxy; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: there the test must run, not skip
        pytest.skip(message)
    return path


@dataclass(frozen=True)
class Store:
    """The servers' dataset: a directory, or a URI with the options that reach it and a
    directory under which each server keeps its own local state (log and journal)."""

    data: Path | str
    options: dict[str, str] = field(default_factory=dict)
    states: Path | None = None

    @classmethod
    def on(cls, bucket: Bucket) -> Store:
        return cls(bucket.uri(), bucket.options, bucket.state_dir)

    def server_env(self, index: int) -> dict[str, str]:
        """The endpoint and keys in the environment, as an operator gives them, and the
        server's own state directory (``$XDG_STATE_HOME/rlpipe/...``)."""
        if self.states is None:
            return {}
        return {**self.options, "XDG_STATE_HOME": str(self.states / f"server-{index}")}

    def reader(self, **options: Any) -> InputReader:
        return InputReader(self.data, storage_options=self.options or None, **options)


def as_store(data: Path | Store) -> Store:
    return data if isinstance(data, Store) else Store(data)


class Fleet:
    """Servers of one dataset on OS-picked ports, each a real ``rlpipe serve`` process;
    ``hook`` is added to each server's environment at its first start only."""

    def __init__(self, data: Path | Store, count: int, hook: dict[str, str] | None = None) -> None:
        self.store = as_store(data)
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen[bytes]] = []
        for index, port in enumerate(self.ports):
            env = {**self.store.server_env(index), **(hook or {})}
            self.processes.append(start_serve_process(self.store.data, port, *SERVE, env=env))

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    def restart(
        self, index: int, after_s: float, down_s: float, while_down: Callable[[], None]
    ) -> None:
        """``kill -9`` of one server ``after_s`` from now, and the same server again on its port
        ``down_s`` later; ``while_down`` runs just before the restart."""
        time.sleep(after_s)
        kill(self.processes[index])
        time.sleep(down_s)
        while_down()
        self.start(index)

    def start(self, index: int) -> None:
        """Start server ``index`` again on its port, with its state directory."""
        env = self.store.server_env(index)
        self.processes[index] = start_serve_process(
            self.store.data, self.ports[index], *SERVE, env=env
        )

    def revive(self, index: int, while_down: Callable[[], None]) -> None:
        """Wait for server ``index`` to die by its own hook, run ``while_down``, and start it
        again on its port, without the hook. (The hook kills granian's worker, where the writer
        runs, with SIGKILL; the supervisor then exits with status 1.)"""
        process = self.processes[index]
        process.wait(timeout=30)
        assert process.returncode in (1, -signal.SIGKILL), server_log(process)[-2000:]
        kill(process)
        while_down()
        self.start(index)

    def accepted(self) -> list[float]:
        """Steps each server accepted since it started."""
        found = []
        for port in self.ports:
            text = requests.get(f"http://127.0.0.1:{port}/v1/metrics", timeout=5).text
            found.append(metric(text, "rlpipe_steps_accepted_total") or 0.0)
        return found

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                kill(process, signal.SIGTERM)


@contextmanager
def fleet(
    data: Path | Store, count: int = 3, hook: dict[str, str] | None = None
) -> Iterator[Fleet]:
    servers = Fleet(data, count, hook)
    try:
        yield servers
    finally:
        servers.stop()


@contextmanager
def balancer(
    binary: str, directory: Path, addresses: list[str], text: str | None = None
) -> Iterator[str]:
    """haproxy on loopback, in front of ``addresses``, with the configuration ``text`` (default:
    the doc's); it binds ``${RLPIPE_BIND}`` and names the servers ``${RLPIPE_SERVER_1}``..."""
    config = directory / "haproxy.cfg"
    config.write_text(haproxy_config() if text is None else text)
    port = free_port()
    env = {**os.environ, "RLPIPE_BIND": f"127.0.0.1:{port}"}
    env |= {f"RLPIPE_SERVER_{n}": address for n, address in enumerate(addresses, 1)}
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [binary, "-db", "-f", str(config)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for(url, process, log)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _wait_for(url: str, process: subprocess.Popen[bytes], log: Any) -> None:
    if answers(url + "/v1/health", process, 10.0):
        return
    log.seek(0)
    raise RuntimeError(f"haproxy did not start: {log.read().decode(errors='replace')[-2000:]}")


class Follower(threading.Thread):
    """A trainer's reader: every (episode_id, t) a following InputReader yields, until nothing
    new came for ``timeout_s``. While a server restarts, its clients wait and nothing is
    committed; on a loaded machine (the suite runs in parallel) a restart takes over 2 s."""

    def __init__(self, data: Path | Store, timeout_s: float = 8.0) -> None:
        super().__init__(daemon=True)
        self.reader = as_store(data).reader(
            batch_size=256, follow=True, timeout_s=timeout_s, poll_interval_s=0.05
        )
        self.seen: Acked = collections.Counter()
        self.error: BaseException | None = None  # what stopped it early, for the assertion

    def run(self) -> None:
        try:
            for batch in self.reader:
                self.seen.update(zip(batch.episode_ids.tolist(), batch.ts.tolist(), strict=True))
        except BaseException as error:
            self.error = error
            raise


def play_remote(
    client: PolicyClient,
    episode_ids: list[str],
    acked: Acked,
    pace_s: float = 0.0,
    longest: list[float] | None = None,
) -> None:
    """CartPole episodes, each step credited once the call that completes its row returns;
    ``pace_s`` between steps; ``longest[0]``: the longest any call took."""
    longest = [0.0] if longest is None else longest

    def timed(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        answer = call(*args, **kwargs)
        longest[0] = max(longest[0], time.monotonic() - began)
        return answer

    env = gym.make("CartPole-v1")
    for n, episode_id in enumerate(episode_ids):
        timed(client.start_episode, episode_id, seed=n)
        observation, _ = env.reset(seed=n)
        t = 0
        while True:
            time.sleep(pace_s)
            action = timed(client.get_action, episode_id, observation)
            if t > 0:
                acked[(episode_id, t - 1)] += 1
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            t += 1
            if terminated or truncated:
                timed(client.end_episode, episode_id, observation, truncated=truncated)
                acked[(episode_id, t - 1)] += 1
                break
    env.close()


def play_local(client: PolicyClient, episodes: int, acked: Acked, pace_s: float = 0.0) -> None:
    """Local inference: the steps are acknowledged when ``close()`` says all were delivered;
    ``pace_s`` between steps."""
    env = gym.make("CartPole-v1")
    played: Acked = collections.Counter()
    for n in range(episodes):
        episode_id = client.start_episode(seed=n)
        observation, _ = env.reset(seed=n)
        for t in range(500):
            time.sleep(pace_s)
            action = client.get_action(episode_id, observation)
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            played[(episode_id, t)] += 1
            if terminated or truncated:
                client.end_episode(episode_id, observation, truncated=truncated)
                break
    env.close()
    assert client.close(30.0)
    acked.update(played)


def play_vector(client: PolicyClient, steps: int, acked: Acked) -> None:
    """A vector env's sub-envs as episodes: a row is complete when its next step returns."""
    envs = gym.make_vec("CartPole-v1", num_envs=4)
    vector = VectorEpisodes(client, envs.num_envs)
    counts: collections.Counter[str] = collections.Counter()
    observations, _ = envs.reset(seed=0)
    actions = vector.reset(observations)
    for _ in range(steps):
        observations, rewards, terminated, truncated, _ = envs.step(actions)
        open_ids = [episode_id for episode_id in vector.episode_ids if episode_id is not None]
        actions = vector.step(observations, rewards, terminated, truncated)
        for episode_id in open_ids:
            acked[(episode_id, counts[episode_id])] += 1
            counts[episode_id] += 1
    observations, rewards, terminated, truncated, _ = envs.step(actions)
    open_ids = [episode_id for episode_id in vector.episode_ids if episode_id is not None]
    vector.close(observations, rewards, terminated, truncated)
    for episode_id in open_ids:
        acked[(episode_id, counts[episode_id])] += 1
    envs.close()
    assert client.close()


def together(*players: Callable[[Acked], None]) -> Acked:
    """Run the players at once, each crediting its own steps; all their steps. The first
    failure of any is raised."""
    failures: list[BaseException] = []
    acked: Acked = collections.Counter()
    lock = threading.Lock()

    def run(player: Callable[[Acked], None]) -> None:
        mine: Acked = collections.Counter()
        try:
            player(mine)
        except BaseException as error:
            failures.append(error)
        with lock:
            acked.update(mine)

    threads = [threading.Thread(target=run, args=(player,)) for player in players]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return acked


def check_exactly_once(
    follower: Follower, acked: Acked, data: Path | Store, settle_s: float = 30.0
) -> None:
    """The follower read each acknowledged step that the table held while it still followed,
    once, and nothing else; and the table comes to hold every acknowledged step once. A shard
    may commit after the follower's quiet time ran out (three servers race to commit to one
    table, on a loaded machine): those steps are allowed late, within ``settle_s``. A failure
    names the steps by episode, and says which were late and which never came (lost)."""
    early = _fresh_read(data)  # committed while the follower still follows, if it does
    following = follower.is_alive()
    follower.join(timeout=60)
    assert not follower.is_alive()
    assert follower.error is None, f"the follower stopped early: {follower.error!r}"
    assert set(acked.values()) == {1}
    at_stop = _fresh_read(data)
    extra = (follower.seen - acked) + (at_stop - acked)
    assert not extra, f"steps read that no call acknowledged, or read twice: {by_episode(extra)}"
    skipped = (acked - follower.seen) & early if following else collections.Counter()
    assert not skipped, f"the follower skipped committed steps: {by_episode(skipped)}"
    again, deadline = at_stop, time.monotonic() + settle_s
    while again != acked and time.monotonic() < deadline:
        time.sleep(0.5)
        again = _fresh_read(data)
    assert again == acked, (
        f"lost: a fresh read {settle_s:.0f} s on misses {by_episode(acked - again)} (missing "
        f"when the follower stopped: {by_episode(acked - at_stop)})"
    )


def _fresh_read(data: Path | Store) -> Acked:
    """Every (episode_id, t) of the table as a new reader finds it now."""
    found: Acked = collections.Counter()
    for batch in as_store(data).reader(batch_size=4096):
        found.update(zip(batch.episode_ids.tolist(), batch.ts.tolist(), strict=True))
    return found


def by_episode(steps: Acked) -> str:
    """``steps`` as each episode's list of ``t``, for a failure's message."""
    ts: dict[str, list[int]] = collections.defaultdict(list)
    for episode_id, t in sorted(steps):
        ts[episode_id].append(t)
    return "; ".join(f"{episode_id} t={found}" for episode_id, found in ts.items()) or "none"


def upload(url: str, client_id: str, seq: int) -> Any:
    """A JSON upload of one step, as a client without the route header sends it."""
    observation = [0.01, -0.02, 0.03, 0.04]
    step = {
        "episode_id": f"{client_id}-{seq}",
        "t": 0,
        "observation": observation,
        "action": 1,
        "reward": 1.0,
        "next_observation": observation,
        "terminated": True,
        "truncated": False,
    }
    headers = {"X-Rlpipe-Client": client_id, "X-Rlpipe-Upload": str(seq)}
    answer = requests.post(url + "/v1/uploads", json={"steps": [step]}, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_three_servers_behind_haproxy_keep_every_step_once(haproxy: str, tmp_path: Path) -> None:
    data = tmp_path / "ds"
    with fleet(data) as servers, balancer(haproxy, tmp_path, servers.addresses) as url:
        follower = Follower(data)
        follower.start()
        remote = PolicyClient(url, "remote")
        local = PolicyClient(url, "local", update_interval=None, spool_dir=tmp_path / "spool")
        vector = PolicyClient(url, "remote")
        acked = together(
            lambda mine: play_remote(remote, [f"remote-{n}" for n in range(12)], mine),
            lambda mine: play_local(local, 6, mine),
            lambda mine: play_vector(vector, 60, mine),
        )
        assert remote.close()
        accepted = servers.accepted()
        check_exactly_once(follower, acked, data)
        for seq in range(3):  # without the header, an upload is routed by its client's id
            for retry in (False, True):
                assert upload(url, "sim-in-c", seq)["duplicate"] is retry
        servers.stop()  # the balancer's own 503 is in the protocol's form: wait, then retry
        answer = requests.post(url + "/v1/episodes", json={}, timeout=10)
        assert (answer.status_code, answer.headers["Retry-After"]) == (503, "1")
        assert answer.json()["error"]["status"] == 503
    # the remote client's episodes, hashed by their ids, reached every server
    assert all(count > 0 for count in accepted), accepted


def test_a_client_given_three_servers_spreads_its_episodes_and_rides_out_one_outage(
    tmp_path: Path,
) -> None:
    data = tmp_path / "ds"
    with fleet(data) as servers:
        follower = Follower(data)
        follower.start()
        remote = PolicyClient(servers.addresses, "remote", timeout=20.0)
        local = PolicyClient(
            ",".join(servers.addresses), "local", update_interval=None, spool_dir=tmp_path / "sp"
        )
        urls = [f"http://{address}" for address in servers.addresses]
        home = urls.index(local._servers.pick(local.client_id).url)  # its uploads' server
        episode_ids = [f"remote-{n}" for n in range(30)]
        # a second remote client whose every episode is on that server: one is open at the kill
        stranded = PolicyClient(servers.addresses, "remote", timeout=20.0)
        candidates = (f"stranded-{n}" for n in range(1000))
        stranded_ids = [k for k in candidates if stranded._servers.pick(k).url == urls[home]]
        spooled: list[Path] = []
        waited = [0.0]
        acked = together(  # each plays for about 2.5 s; the server dies at 0.5 s for 1 s
            lambda mine: play_remote(remote, episode_ids, mine, pace_s=0.002),
            lambda mine: play_remote(stranded, stranded_ids[:8], mine, 0.006, waited),
            lambda mine: play_local(local, 30, mine, pace_s=0.002),
            lambda _: servers.restart(
                home, 0.5, 1.0, lambda: spooled.extend(local.spool_dir.glob("*.arrows"))
            ),
        )
        assert spooled, "the local client's server was down while it played"
        assert waited[0] > 1.0, "a remote client of that server waited for it"
        assert remote.close() and stranded.close()
        check_exactly_once(follower, acked, data)
        accepted = servers.accepted()
    spread = collections.Counter(remote._servers.pick(key).url for key in episode_ids)
    assert len(spread) == 3, spread
    assert all(count > 0 for count in accepted), accepted


def test_a_batch_of_episodes_on_several_servers_reaches_each_of_them(tmp_path: Path) -> None:
    """step_many over episodes started on their own, each on the server of its id: the batch
    is sent as one request per route key, the actions come back in its order, and each step
    is stored once."""
    data = tmp_path / "ds"
    with fleet(data) as servers:
        client = PolicyClient(servers.addresses, "remote")
        by_server = collections.defaultdict(list)
        for key in (f"e{n}" for n in range(200)):
            by_server[client._servers.pick(key).url].append(key)
        ids = sorted(key for keys in by_server.values() for key in keys[:3])  # servers mixed
        assert len(ids) == 9
        for episode_id in ids:
            client.start_episode(episode_id)
        observations = np.zeros((len(ids), 4), np.float32)
        ended = np.arange(len(ids)) % 2 == 1
        first = client.step_many(ids, observations)
        last = client.step_many(ids, observations + 0.1, np.ones(len(ids)), ended, ~ended)
        assert all(action in (0, 1) for action in first)
        assert [action is None for action in last] == [True] * len(ids)
        assert client.close()
        accepted = servers.accepted()
    steps = pd.read_parquet(data / "steps")
    stored = sorted(zip(steps["episode_id"], steps["t"], strict=True))
    assert stored == [(episode_id, 0) for episode_id in sorted(ids)]
    assert steps.groupby("episode_id")["terminated"].first().to_dict() == dict(
        zip(ids, ended.tolist(), strict=True)
    )
    assert all(count > 0 for count in accepted), accepted


def uncommitted_files(store: Store) -> list[str]:
    """Data files under the dataset that no commit of its tables names."""
    location = locate(store.data, store.options)
    selector = pafs.FileSelector(location.root, recursive=True)
    found = [info.path for info in location.filesystem.get_file_info(selector)]
    committed = {path for table in layout.TABLES for path in discovery.list_shards(location, table)}
    return [path for path in found if path.endswith(".parquet") and path not in committed]


def test_three_servers_on_one_bucket_keep_every_step_once(
    haproxy: str, bucket: Bucket, tmp_path: Path
) -> None:
    """docs/deploy.md, "Object storage": three servers, each with its own state directory, write
    one dataset on S3 through haproxy; a follower of the s3 URI reads each step once."""
    store = Store.on(bucket)
    with fleet(store) as servers, balancer(haproxy, tmp_path, servers.addresses) as url:
        follower = Follower(store)
        follower.start()
        remote = PolicyClient(url, "remote")
        local = PolicyClient(url, "local", update_interval=None, spool_dir=tmp_path / "spool")
        acked = together(
            lambda mine: play_remote(remote, [f"remote-{n}" for n in range(12)], mine),
            lambda mine: play_local(local, 6, mine),
        )
        assert remote.close()
        accepted = servers.accepted()
        check_exactly_once(follower, acked, store)
    assert all(count > 0 for count in accepted), accepted
    assert store.states is not None
    assert len(list(store.states.glob("server-*/rlpipe/*"))) == 3  # a state directory each
    assert not uncommitted_files(store)


def test_a_server_killed_between_a_file_and_its_commit_on_s3_keeps_every_step_once(
    bucket: Bucket, tmp_path: Path
) -> None:
    """The server dies (SIGKILL, by the writer's test hook) right after putting its first
    shard's file on S3, before the commit naming it; restarted on its state directory, it
    commits what it acknowledged, once, while its clients wait (remote) or spool (local)."""
    store = Store.on(bucket)
    stranded: list[str] = []
    with fleet(store, 1, hook={KILL_AFTER_SHARD_WRITE: "1"}) as servers:
        follower = Follower(store)
        follower.start()
        remote = PolicyClient(servers.addresses, "remote", timeout=30.0)
        local = PolicyClient(
            servers.addresses, "local", update_interval=None, spool_dir=tmp_path / "spool"
        )
        acked = together(
            lambda mine: play_remote(remote, [f"remote-{n}" for n in range(8)], mine, 0.002),
            lambda mine: play_local(local, 8, mine, pace_s=0.002),
            lambda _: servers.revive(0, lambda: stranded.extend(uncommitted_files(store))),
        )
        assert remote.close()
        check_exactly_once(follower, acked, store)
    assert stranded, "the server died with a file on S3 that no commit named"
    assert not uncommitted_files(store)  # recovery committed that very file

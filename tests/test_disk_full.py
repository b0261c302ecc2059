"""A full disk, for real: a small tmpfs mounted by the test, filled with a ballast file.

While the dataset's disk is full, an append the writer cannot make durable raises StorageError
(the server answers 503 naming the cause), nothing acknowledged is lost, no half-written file is
left where readers look, and once the ballast is deleted everything goes on by itself.
"""

from __future__ import annotations

import collections
import errno
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.dataset as ds
import pytest
import requests
from conftest import cartpole_rollout, cartpole_spaces
from server_fixtures import cartpole_config, metric, running_server, wait_for

from pipeline import DatasetWriter, InputReader, StorageError, WriterConfig
from pipeline.client import PolicyClient
from pipeline.dataset.location import locate
from pipeline.dataset.recovery import pending_segments
from pipeline.format import layout

DISK_BYTES = 4 * 2**20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own, unmounted at the end (whatever the test left running on it
    must be stopped by the test first)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        why = done.stderr.strip() or f"exit status {done.returncode}"
    except FileNotFoundError as error:
        done, why = None, str(error)
    if done is None or done.returncode != 0:
        message = f"mounting a tmpfs is not permitted here (needs root): {why}"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI runs as root: there the test must run, not skip
        pytest.skip(message)
    try:
        yield mount
    finally:
        done = subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)
        if done.returncode != 0:  # still busy (a failed test left a file open): detach it
            subprocess.run(["umount", "--lazy", str(mount)], check=True, timeout=30)


def fill(disk: Path, leave: int) -> Path:
    """A ballast file that leaves about ``leave`` bytes of ``disk`` free."""
    ballast = disk / "ballast"
    size = max(0, shutil.disk_usage(disk).free - leave)
    with open(ballast, "wb") as handle:
        handle.truncate(size)  # tmpfs: a hole takes no space; write it for real
        handle.seek(0)
        while handle.tell() < size:
            handle.write(bytes(min(2**20, size - handle.tell())))
    return ballast


def stray_files(root: Path) -> list[str]:
    """Files a reader might trip over: temporaries left in a table's folders (the Delta log
    aside)."""
    return [
        str(path.relative_to(root))
        for table in layout.TABLES
        for path in (root / table).rglob("*")
        if path.is_file() and not path.name.endswith(".parquet") and "_delta_log" not in path.parts
    ]


def stored_keys(root: Path) -> collections.Counter[tuple[str, str, int]]:
    """(episode_id, agent_id, t) of every stored step, with how often each is stored."""
    keys: collections.Counter[tuple[str, str, int]] = collections.Counter()
    for batch in InputReader(root, batch_size=1_000_000):
        keys.update(
            zip(
                batch.episode_ids.tolist(), batch.agent_ids.tolist(), batch.ts.tolist(), strict=True
            )
        )
    return keys


def test_a_full_disk_refuses_appends_until_space_is_freed(small_disk: Path) -> None:
    path = small_disk / "ds"
    rows = cartpole_rollout(4000)
    config = WriterConfig(max_rows=300, max_age_s=60, sync="always")
    acknowledged: list[int] = []
    refusals: list[StorageError] = []
    with DatasetWriter(path, *cartpole_spaces(), env_id="CartPole-v1", config=config) as writer:
        ballast = fill(small_disk, leave=64 * 1024)
        start = 0
        while start < 4000:
            chunk = {key: value[start : start + 10] for key, value in rows.items()}
            try:
                writer.append(chunk)
            except StorageError as error:
                refusals.append(error)
                assert writer.disk.error is not None
                if len(refusals) == 1:  # no shard fits either: flush says so, and keeps them
                    with pytest.raises(StorageError, match="disk is full"):
                        writer.flush()
                if len(refusals) == 5:
                    ballast.unlink()  # the next try of the same rows goes through
                continue
            acknowledged += range(start, start + 10)
            start += 10
        writer.flush()
        assert writer.disk.error is None
    assert len(refusals) == 5
    for error in refusals:
        assert error.errno == errno.ENOSPC
        assert re.fullmatch(
            r"the dataset's disk is full \(ENOSPC: No space left on device\) at /.+", str(error)
        )
    keys = stored_keys(path)
    assert set(keys.values()) == {1}
    expected = {
        (str(rows["episode_id"][i]), layout.DEFAULT_AGENT_ID, int(rows["t"][i]))
        for i in acknowledged
    }
    assert sorted(keys) == sorted(expected) and len(acknowledged) == 4000
    assert stray_files(path) == []
    assert not any(layout.wal_root(str(path)).rglob("*.rows"))


class Answers:
    """Every answer to the clients' writes (POST), by status, and the 503s' Retry-After and
    messages."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: collections.Counter[int] = collections.Counter()
        self.unavailable: list[tuple[str, str | None, str]] = []  # (path, Retry-After, message)

    def session(self) -> requests.Session:
        session = requests.Session()
        session.hooks["response"].append(self._seen)
        return session

    def _seen(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        path = requests.utils.urlparse(response.url).path
        if response.request.method != "POST":
            return  # the local client's GET /v1/weights: 404 without a checkpoint
        with self.lock:
            self.statuses[response.status_code] += 1
            if response.status_code == 503:
                message = response.json()["error"]["message"]
                self.unavailable.append((path, response.headers.get("Retry-After"), message))

    def count(self, status: int, path_part: str = "") -> int:
        with self.lock:
            if status == 503:
                return sum(path_part in path for path, _, _ in self.unavailable)
            return self.statuses[status]


def play(client: PolicyClient, stop: threading.Event, played: dict[str, int], local: bool) -> None:
    """CartPole episodes until ``stop``; ``played``: each ended episode's number of steps."""
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    while not stop.is_set():
        episode_id = client.start_episode()
        observation, _ = env.reset()
        for t in range(1, 10_000):
            if local:
                action = int(rng.integers(2))
                client.log_action(episode_id, observation, action)
                time.sleep(0.001)  # ~1k steps/s: at full speed it would fill 4 MiB again
            else:
                action = client.get_action(episode_id, observation)
            observation, reward, terminated, truncated, _ = env.step(action)
            client.log_returns(episode_id, float(reward))
            if terminated or truncated or stop.is_set():
                client.end_episode(episode_id, observation, truncated=not terminated)
                played[episode_id] = t
                break
    env.close()


def test_a_server_on_a_full_disk_answers_503_and_goes_on_once_space_is_freed(
    small_disk: Path, tmp_path: Path
) -> None:
    data = small_disk / "ds"
    answers = Answers()
    stop = threading.Event()
    played: dict[str, int] = {}
    config = cartpole_config(data, writer=WriterConfig(sync="background", max_age_s=0.5))
    with running_server(config) as server:
        ballast = fill(small_disk, leave=160 * 1024)
        clients = [
            PolicyClient(server.url, "remote", session=answers.session(), timeout=60)
            for _ in range(3)
        ]
        local = PolicyClient(
            server.url,
            "local",
            update_interval=None,
            session=answers.session(),
            spool_dir=tmp_path / "spool",  # on the test's own disk, not the full one
            upload_interval_s=0.1,
        )
        threads = [
            threading.Thread(target=play, args=(client, stop, played, client is local))
            for client in [*clients, local]
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(
                lambda: answers.count(503, "/actions") >= 10 and answers.count(503, "/uploads"),
                10,
                "503s on steps and uploads",
            )
            health = requests.get(server.url + "/v1/health", timeout=5).json()
            metrics = requests.get(server.url + "/v1/metrics", timeout=5).text
            spooled = list((tmp_path / "spool").glob("*.arrows"))
            ballast.unlink()
            time.sleep(2)  # the clients carry on
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        closed = local.close(timeout_s=15)
        assert closed, list((tmp_path / "spool").iterdir())
        wait_for(
            lambda: requests.get(server.url + "/v1/health", timeout=5).json()["status"] == "ok",
            10,
            "health to say ok",
        )
        after = requests.get(server.url + "/v1/health", timeout=5).json()
    assert set(answers.statuses) <= {200, 201, 503}, answers.statuses
    full = re.compile(
        r"the dataset's disk is full \(ENOSPC: No space left on device\) at /\S+; "
        r"steps are not being stored; retry after 1 s"
    )
    behind = re.compile(r"the server is \d+ shards behind in writing; retry after 1 s")
    for path, retry_after, message in answers.unavailable:
        assert retry_after == "1", path
        assert full.fullmatch(message) or behind.fullmatch(message), message  # once space is back
    assert sum(bool(full.fullmatch(message)) for _, _, message in answers.unavailable) >= 10
    assert health["status"] == "degraded"
    assert health["storage_error"]["message"].startswith("the dataset's disk is full (ENOSPC")
    assert metric(metrics, "rlpipe_storage_failing") == 1
    assert (metric(metrics, "rlpipe_storage_errors_total") or 0) > 0
    assert spooled, "the local client spooled nothing while the server answered 503"
    assert after["storage_error"] is None and after["open_episodes"] == 0
    keys = stored_keys(data)
    assert set(keys.values()) == {1}  # nothing stored twice
    expected = {
        (episode_id, layout.DEFAULT_AGENT_ID, t)
        for episode_id, steps in played.items()
        for t in range(steps)
    }
    assert sorted(keys) == sorted(expected)  # every acknowledged step, and nothing else
    episodes = ds.dataset(data / layout.EPISODES, partitioning="hive").to_table()
    assert sorted(episodes.column("episode_id").to_pylist()) == sorted(played)
    assert set(episodes.column("end_reason").to_pylist()) <= {"terminated", "truncated"}
    assert stray_files(data) == [] and pending_segments(locate(data)) == []


_DIE_WITH_ROWS_IN_THE_LOG = """
import os, sys
sys.path.insert(0, "tests")
from conftest import cartpole_rollout, cartpole_spaces
from pipeline import DatasetWriter, WriterConfig
writer = DatasetWriter(sys.argv[1], *cartpole_spaces(), env_id="CartPole-v1",
                       config=WriterConfig(max_age_s=600))
writer.append(cartpole_rollout(2000))
os._exit(0)  # acknowledged, still in the log: a dead writer's rows for the next one to commit
"""


def test_a_writer_opened_on_a_full_disk_says_so_and_keeps_the_dead_writers_log(
    small_disk: Path,
) -> None:
    """Opening a dataset commits the logs of writers that died; on a full disk that fails with a
    StorageError naming the cause (``rlpipe serve`` exits saying it), the log stays, and once
    space is freed the next writer commits every row of it."""
    data = small_disk / "data"
    root = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-c", _DIE_WITH_ROWS_IN_THE_LOG, str(data)], check=True, cwd=root
    )
    ballast = fill(small_disk, 0)
    with pytest.raises(StorageError) as refused:
        DatasetWriter(data, *cartpole_spaces(), env_id="CartPole-v1")
    assert refused.value.errno == errno.ENOSPC
    assert "disk is full" in str(refused.value) and "died" in str(refused.value)
    serve = [sys.executable, "-m", "pipeline", "serve", "--data", str(data), "--port", "0"]
    started = subprocess.run(serve, capture_output=True, text=True, timeout=120, cwd=root)
    assert started.returncode != 0
    assert "disk is full" in started.stderr, started.stderr
    assert len(pending_segments(locate(data))) == 1
    ballast.unlink()
    with DatasetWriter(data) as writer:
        assert sum(item.rows for item in writer.recovered) == 2000
    stored = stored_keys(data)
    assert len(stored) == 2000 and set(stored.values()) == {1}

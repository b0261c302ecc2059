"""Datasets on object storage and on local disk, through their URIs: writing, following and
reading back, a kill between a shard's file and its commit, other Delta readers, and the errors
of an endpoint that cannot be reached or refuses the key (``pipeline/dataset/location.py``,
``pipeline/dataset/delta.py``). S3 is moto in server mode on 127.0.0.1 (``s3_fixtures``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from conftest import cartpole_spaces
from s3_fixtures import SECRET, Bucket
from test_upkeep import columns

from pipeline import DatasetWriter, InputReader, WriterConfig, recover
from pipeline.dataset import discovery
from pipeline.dataset.delta import Table
from pipeline.dataset.location import Location, locate
from pipeline.dataset.writer import KILL_AFTER_SHARD_WRITE
from pipeline.errors import DatasetError
from pipeline.format import layout

SCRIPT = Path(__file__).with_name("writer_process.py")


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """Where a test's dataset lives: a local directory, or a prefix of a moto bucket."""
    if request.param == "local":
        return locate(tmp_path / "ds")
    found: Bucket = request.getfixturevalue("bucket")
    return locate(found.uri(), found.options, found.state_dir)


def opened(location: Location, **options: Any) -> InputReader:
    return InputReader(location.uri, storage_options=dict(location.storage_options), **options)


def keys(batches: list[Any]) -> Counter[tuple[str, int]]:
    return Counter(
        (str(e), int(t)) for b in batches for e, t in zip(b.episode_ids, b.ts, strict=True)
    )


def test_write_follow_and_read_back(place: Location) -> None:
    """A follower started on an empty dataset sees every row of 12 commits exactly once; a
    reader pinned to a version sees that version; Polars reads the same rows."""
    rng = np.random.default_rng(0)
    config = WriterConfig(max_age_s=0.05)
    options = dict(place.storage_options)
    writer = DatasetWriter(
        place.uri,
        *cartpole_spaces(),
        config=config,
        storage_options=options,
        state_dir=place.state_dir,
    )
    follower = opened(place, follow=True, timeout_s=3.0, poll_interval_s=0.05, batch_size=4096)
    written: Counter[tuple[str, int]] = Counter()

    def write() -> None:
        with writer:
            for number in range(12):
                rows = int(rng.integers(1, 500))
                writer.append(columns(f"b{number}", rows, rng))
                written.update((f"b{number}", t) for t in range(rows))
                writer.flush()

    thread = threading.Thread(target=write)
    thread.start()
    followed = keys(list(follower))
    thread.join()
    assert followed == written and max(followed.values()) == 1
    assert follower.version == 11  # one commit a flush
    first = opened(place, version=0)
    assert set(keys(list(first))) == {(name, t) for name, t in written if name == "b0"}
    assert first.version == 0
    whole = list(opened(place, batch_size=100_000))
    assert keys(whole) == written

    import polars as pl

    frame = pl.read_delta(place.table_uri(layout.STEPS), storage_options=options)
    assert frame.height == sum(len(b) for b in whole)
    assert frame["reward"].sum() == pytest.approx(float(sum(b.rewards.sum() for b in whole)))
    ids = sorted({str(e) for b in whole for e in b.episode_ids})
    assert sorted(frame["episode_id"].unique().to_list()) == ids
    assert frame["observation"].list.len().unique().to_list() == [4]


def test_a_kill_between_file_and_commit_commits_once(
    place: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer dies (SIGKILL, by the writer's own test hook) right after writing its first
    shard's file: recovery commits every acknowledged row once, and a second recovery of the
    same log (a death after the commit, before the log was deleted) adds nothing."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    location = locate(place.uri, dict(place.storage_options))  # the writer's default state dir
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]), **location.storage_options)
    env[KILL_AFTER_SHARD_WRITE] = "1"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), location.uri, "0", "1000000", "always", "columns"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    acknowledged = dict(line.split() for line in done.stdout.splitlines())
    assert acknowledged
    files = location.filesystem.get_file_info(
        __import__("pyarrow.fs").fs.FileSelector(location.path(layout.STEPS), recursive=True)
    )
    written = [f.path for f in files if f.path.endswith(".parquet")]
    assert written and not discovery.list_shards(location)  # a file, and no commit naming it
    log = layout.wal_root(location.state_dir)
    shutil.copytree(log, tmp_path / "log-copy")
    recover(location)
    stored = keys(list(opened(location, batch_size=100_000)))
    assert max(stored.values()) == 1  # nothing twice
    lengths = Counter(name for name, _ in stored)
    assert all(lengths[name] == int(rows) for name, rows in acknowledged.items())
    version = Table(location, layout.STEPS).open().version()  # type: ignore[union-attr]
    shutil.rmtree(log)
    shutil.copytree(tmp_path / "log-copy", log)
    recover(location)
    assert Table(location, layout.STEPS).open().version() == version  # type: ignore[union-attr]
    assert keys(list(opened(location, batch_size=100_000))) == stored


def test_an_unreachable_endpoint_is_named(tmp_path: Path) -> None:
    options = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_SECRET_ACCESS_KEY": SECRET}
    for attempt in (
        lambda: InputReader("s3://nowhere/ds", storage_options=options),
        lambda: DatasetWriter(
            "s3://nowhere/ds", *cartpole_spaces(), storage_options=options, state_dir=tmp_path
        ),
    ):
        with pytest.raises(DatasetError, match="the endpoint cannot be reached") as caught:
            attempt()
        assert "s3://nowhere/ds (endpoint http://127.0.0.1:9)" in str(caught.value)
        assert SECRET not in str(caught.value)


def test_a_wrong_key_and_a_missing_bucket_are_named(bucket: Bucket, tmp_path: Path) -> None:
    missing = bucket.uri().replace(bucket.name, f"{bucket.name}-gone")
    with pytest.raises(DatasetError, match="no such bucket") as caught:
        DatasetWriter(
            missing, *cartpole_spaces(), storage_options=bucket.options, state_dir=tmp_path
        )
    assert missing in str(caught.value) and SECRET not in str(caught.value)
    requests.post(f"{bucket.endpoint}/moto-api/reset-auth", data=b"0", timeout=5)
    try:  # moto now checks keys, and knows none
        with pytest.raises(DatasetError, match="no permission") as caught:
            DatasetWriter(
                bucket.uri(), *cartpole_spaces(), storage_options=bucket.options, state_dir=tmp_path
            )
        assert bucket.uri() in str(caught.value) and SECRET not in str(caught.value)
    finally:
        requests.post(f"{bucket.endpoint}/moto-api/reset-auth", data=b"inf", timeout=5)


def test_a_compaction_adds_nothing_for_a_follower(place: Location) -> None:
    """deltalake's OPTIMIZE rewrites five files into one (``dataChange`` false): a follower that
    read the five reads only what comes after, and a new reader reads the merged file whole."""
    from deltalake import DeltaTable

    rng = np.random.default_rng(1)
    options = dict(place.storage_options)
    writer = DatasetWriter(
        place.uri, *cartpole_spaces(), storage_options=options, state_dir=place.state_dir
    )
    with writer:
        for number in range(5):
            writer.append(columns(f"a{number}", 100, rng))
            writer.flush()
        follower = opened(
            place, follow=True, timeout_s=0.5, poll_interval_s=0.05, batch_size=100_000
        )
        batches = iter(follower)
        first = next(batches)
        table = DeltaTable(place.table_uri(layout.STEPS), storage_options=options)
        assert table.optimize.compact()["numFilesRemoved"] == 5
        for number in range(2):
            writer.append(columns(f"b{number}", 50, rng))
            writer.flush()
    rest = list(batches)
    assert keys([first, *rest]) == keys(list(opened(place, batch_size=100_000)))
    assert len(first) == 500 and sum(len(b) for b in rest) == 100
    assert len(discovery.list_shards(place)) == 3  # the merged file and the two after it


def test_commands_take_a_bucket_through_the_environment(
    bucket: Bucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``rlpipe inspect`` and an offline ``rlpipe train`` read a dataset in a bucket, the
    endpoint and keys coming from the standard environment variables; ``--follow`` refuses it
    (online trainers publish policies into the dataset's local ``checkpoints/``)."""
    import json

    from conftest import cartpole_rollout

    from pipeline.commands.cli import main

    for name, value in bucket.options.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    with DatasetWriter(bucket.uri(), *cartpole_spaces(), env_id="CartPole-v1") as writer:
        writer.append(cartpole_rollout(300))
    assert main(["inspect", bucket.uri(), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rows"], report["health"]["uncommitted"]) == (300, [])
    run = tmp_path / "run"
    train = ["train", "bc", "--data", bucket.uri(), "--max-updates", "3", "--run-dir", str(run)]
    assert main(train) == 0
    (read,) = [json.loads(line) for line in (run / "reads.jsonl").read_text().splitlines()]
    assert (read["rows"], read["data_version"]) == (300, 0)

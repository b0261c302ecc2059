"""Reading a dataset as it was: ``InputReader(version=N)``, ``rlpipe train --data-version N``,
the version a run records, and a follower's resume point across compactions."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cartpole_spaces
from test_upkeep import columns, keys, write_commits

from pipeline import DatasetWriter, InputReader, WriterConfig
from pipeline.commands.cli import main
from pipeline.dataset.delta import Table
from pipeline.dataset.location import locate
from pipeline.dataset.upkeep import upkeep
from pipeline.errors import DatasetError
from pipeline.format import layout


def reads(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "reads.jsonl").read_text().splitlines()]


def test_a_run_pinned_to_a_version_trains_on_exactly_it(tmp_path: Path) -> None:
    """``rlpipe train bc --data-version 1`` reads the two commits of version 1 while a writer
    keeps appending, and says so in reads.jsonl; a run without it records the latest version
    it read, whose rows are exactly those of that version's commits."""
    location = locate(tmp_path / "ds")
    write_commits(location, 3)  # versions 0, 1, 2 of 200 steps each
    at_one = sorted(f"{layout.STEPS}/{e.path}" for e in Table(location, layout.STEPS, 1).files())
    stop = threading.Event()

    def append() -> None:
        rng = np.random.default_rng(5)
        config = WriterConfig(max_age_s=0.01)
        with DatasetWriter(location.uri, *cartpole_spaces(), config=config) as writer:
            number = 0
            while not stop.is_set():
                writer.append(columns(f"late{number}", 200, rng))
                writer.flush()
                number += 1

    thread = threading.Thread(target=append)
    thread.start()
    try:
        common = ["--data", location.uri, "--max-updates", "3", "--eval-every", "3"]
        pinned, latest = tmp_path / "pinned", tmp_path / "latest"
        small = ["--hidden", "8,8", "--batch-size", "32"]
        assert (
            main(["train", "bc", *common, "--data-version", "1", "--run-dir", str(pinned), *small])
            == 0
        )
        assert main(["train", "bc", *common, "--run-dir", str(latest), *small]) == 0
    finally:
        stop.set()
        thread.join()
    (line,) = reads(pinned)
    assert (line["data_version"], line["rows"], line["shards"]) == (1, 400, at_one)
    (line,) = reads(latest)
    assert line["data_version"] >= 2 and line["rows"] == 200 * (line["data_version"] + 1)


def test_a_follower_resumes_from_its_version_across_compactions(tmp_path: Path) -> None:
    """A follower reads three commits, a compaction merges them, it reads one more commit
    (and marks the merged file read); its position (version, shards_read) is saved. Two more
    compactions and a commit later, a follower resumed from that position reads only the new
    commit: no row twice, none lost."""
    location = locate(tmp_path / "ds")
    write_commits(location, 3, seed=0)
    follower = InputReader(location.uri, follow=True, timeout_s=0.3, poll_interval_s=0.02)
    stream = iter(follower)
    read = [next(stream)]
    upkeep(location)
    write_commits(location, 1, seed=1)
    read.append(next(stream))
    version, shards = follower.version, follower.shards_read
    upkeep(location)
    write_commits(location, 1, seed=2)
    upkeep(location)
    resumed = InputReader(
        location.uri,
        follow=True,
        timeout_s=0.3,
        poll_interval_s=0.02,
        version=version,
        skip_shards=shards,
    )
    read += list(resumed)
    counted = keys(read)
    assert sum(counted.values()) == 5 * 200 and max(counted.values()) == 1


def test_a_version_whose_files_were_vacuumed_is_named(tmp_path: Path) -> None:
    """A reader pinned to a version older than a compaction and a vacuum (forced to retain
    nothing) fails naming the file and why, rather than with a bare FileNotFoundError."""
    location = locate(tmp_path / "ds")
    write_commits(location, 3)
    upkeep(location, 0, force=True)
    with pytest.raises(DatasetError, match=r"at version 1 but gone from the store: a vacuum"):
        list(InputReader(location.uri, version=1))
    assert sum(len(batch) for batch in InputReader(location.uri)) == 600


def test_a_resumed_offline_run_reads_the_version_it_trained_on(tmp_path: Path) -> None:
    """An offline run started again with its --run-dir, after more commits and a compaction,
    reads the table version its first part trained on, not the latest."""
    location = locate(tmp_path / "ds")
    write_commits(location, 2)
    run_dir = tmp_path / "run"
    args = [
        "train",
        "bc",
        "--data",
        location.uri,
        "--run-dir",
        str(run_dir),
        "--eval-every",
        "2",
        "--hidden",
        "8,8",
        "--batch-size",
        "32",
    ]
    assert main([*args, "--max-updates", "2"]) == 0
    write_commits(location, 3, seed=1)
    upkeep(location)
    assert main([*args, "--max-updates", "4"]) == 0
    first, second = reads(run_dir)
    assert first["data_version"] == second["data_version"] == 1
    assert first["rows"] == second["rows"] == 400


def test_a_killed_follower_resumed_after_compactions_reads_each_row_once(
    tmp_path: Path,
) -> None:
    """``rlpipe train bc --follow`` is killed once it saved a read position; while a writer
    goes on, the dataset is compacted (merging the files of the saved position); the run
    started again reads on from the saved version: the rows it holds at the end are exactly
    the table's, none twice (an earlier position made of file names alone read the merged
    file again)."""
    import gymnasium as gym
    from test_trainer_resume import _finish, _kill, _progress, _start, _wait_until, _write

    data, run_dir = tmp_path / "ds", tmp_path / "run"
    env = gym.make("CartPole-v1")
    stop = threading.Event()
    args = ("bc", "--follow", "--timeout", "2", "--batch-size", "64", "--eval-every", "10")
    with DatasetWriter(data, env.observation_space, env.action_space, env_id="CartPole-v1") as w:
        thread = threading.Thread(target=_write, args=(w, stop, data, False))
        thread.start()
        try:
            first = _start(data, run_dir, *args)
            _wait_until(first, run_dir, lambda progress: bool(progress.shards))
            _kill(first)
            killed = _progress(run_dir)
            assert killed is not None and killed.data_version is not None
            (done,) = upkeep(locate(data))
            assert done.files_after < done.files_before
            second = _start(data, run_dir, *args)
            _wait_until(second, run_dir, lambda progress: progress != killed)
            upkeep(locate(data))
            time.sleep(0.5)
        finally:
            stop.set()
            thread.join()
    _finish(second, run_dir)
    final = _progress(run_dir)
    assert final is not None
    rows = sum(len(batch) for batch in InputReader(data, batch_size=100_000))
    assert final.env_steps == rows  # every row read once, across the kill and the compactions

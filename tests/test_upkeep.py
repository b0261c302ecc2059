"""Compaction, checkpoints and vacuum of a dataset's Delta tables while writers append and
followers read (``pipeline/dataset/upkeep.py``, ``rlpipe compact``): no row is read twice or lost
because of them, and the merged files keep rlpipe's encodings."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cartpole_spaces, play_client
from deltalake import DeltaTable
from s3_fixtures import SECRET, Bucket

from pipeline import DatasetWriter, InputReader, WriterConfig
from pipeline.commands.cli import main
from pipeline.dataset.delta import FileEntry, Table
from pipeline.dataset.lease import UpkeepBusy
from pipeline.dataset.location import Location, locate
from pipeline.dataset.upkeep import _tiered, compact_once, upkeep
from pipeline.errors import ConfigError
from pipeline.format import layout


def columns(name: str, rows: int, rng: np.random.Generator) -> dict[str, Any]:
    observations = rng.standard_normal((rows, 4)).astype(np.float32)
    return {
        "episode_id": np.full(rows, name),
        "t": np.arange(rows),
        "observation": observations,
        "action": rng.integers(0, 2, rows),
        "reward": rng.standard_normal(rows),
        "next_observation": observations,
        "terminated": np.zeros(rows, bool),
        "truncated": np.arange(rows) == rows - 1,
    }


def keys(batches: list[Any]) -> Counter[tuple[str, str, int]]:
    return Counter(
        (str(e), str(a), int(t))
        for b in batches
        for e, a, t in zip(b.episode_ids, b.agent_ids, b.ts, strict=True)
    )


def write_commits(location: Location, commits: int, rows: int = 200, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    options = dict(location.storage_options)
    with DatasetWriter(
        location.uri, *cartpole_spaces(), storage_options=options, state_dir=location.state_dir
    ) as writer:
        for number in range(commits):
            writer.append(columns(f"s{seed}-{number}", rows, rng))
            writer.flush()


def operations(location: Location) -> Counter[str]:
    if not Path(location.table_uri(layout.STEPS), "_delta_log").exists() and location.local:
        return Counter()
    table = DeltaTable(
        location.table_uri(layout.STEPS), storage_options=dict(location.storage_options)
    )
    return Counter(entry["operation"] for entry in table.history())


def test_compaction_merges_files_and_keeps_the_encodings(tmp_path: Path) -> None:
    """30 commits of 200 steps become one file of about the bytes per step of rlpipe's own
    shards; floats stay byte-stream-split, ``t`` delta-packed, zstd throughout; every row reads
    back once, and ``rlpipe inspect`` sees the merged file."""
    location = locate(tmp_path / "ds")
    write_commits(location, 30)
    before = list(InputReader(location.uri, batch_size=100_000))
    (done,) = upkeep(location)
    assert (done.files_before, done.files_after, done.rows) == (30, 1, 6000)
    assert done.bytes_after < done.bytes_before  # one footer instead of 30, and longer runs
    assert done.bytes_after / done.rows < 40  # CartPole: ~31 bytes per step as rlpipe's own
    (merged,) = DeltaTable(location.table_uri(layout.STEPS)).file_uris()
    group = pq.read_metadata(merged).row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    assert "BYTE_STREAM_SPLIT" in encodings["observation.list.element"].encodings
    assert "BYTE_STREAM_SPLIT" in encodings["reward"].encodings
    assert "DELTA_BINARY_PACKED" in encodings["t"].encodings
    assert {column.compression for column in encodings.values()} == {"ZSTD"}
    after = list(InputReader(location.uri, batch_size=100_000))
    assert keys(after) == keys(before) and max(keys(after).values()) == 1
    assert operations(location)["OPTIMIZE"] == 1
    latest = DeltaTable(location.table_uri(layout.STEPS)).version()  # checkpointed there
    assert (tmp_path / "ds" / "steps" / "_delta_log" / f"{latest:020d}.checkpoint.parquet").exists()

    from pipeline.commands.inspection import inspect_dataset

    report = inspect_dataset(location.uri)
    assert report["rows"] == 6000 and report["shards"]["steps"] == 1
    assert not report["health"]["uncommitted"] and not report["health"]["unreadable"]


def test_a_follower_reads_every_row_once_through_compactions(tmp_path: Path) -> None:
    """A writer appends in a thread while compaction runs again and again (with a vacuum at
    the default retention); a follower started before the first commit counts every
    (episode_id, agent_id, t) the writer acknowledged exactly once, and neither the writer's
    commits nor the compactions fail for racing each other."""
    location = locate(tmp_path / "ds")
    rng = np.random.default_rng(1)
    acknowledged: Counter[tuple[str, str, int]] = Counter()
    writer = DatasetWriter(location.uri, *cartpole_spaces(), config=WriterConfig(max_age_s=0.02))
    # stops 10 s after the last row: a commit that loses races to compactions retries with a
    # backoff, which under a loaded suite took past 3 s once (fresh-clone CI)
    follower = InputReader(location.uri, follow=True, timeout_s=10.0, poll_interval_s=0.02)
    writing = threading.Event()

    def write() -> None:
        with writer:
            writing.set()
            for number in range(60):
                rows = int(rng.integers(20, 200))
                taken = writer.append(columns(f"e{number}", rows, rng))
                acknowledged.update((f"e{number}", "agent0", t) for t in range(taken))
                if number % 3 == 0:
                    writer.flush()
                time.sleep(0.01)

    followed: list[Any] = []
    reading = threading.Thread(target=lambda: followed.extend(follower))
    thread = threading.Thread(target=write)
    reading.start()
    thread.start()
    writing.wait()
    compactions = 0
    while thread.is_alive():
        time.sleep(0.1)
        if Path(location.table_uri(layout.STEPS), "_delta_log").exists():
            upkeep(location)
            compactions += 1
    thread.join()
    reading.join()
    counted = keys(followed)
    assert counted == acknowledged and max(counted.values()) == 1
    history = operations(location)
    assert compactions >= 3 and history["OPTIMIZE"] >= 3, (compactions, history)
    # a reader that starts after a compaction and a vacuum of every removed file reads all once
    upkeep(location, 0, force=True)
    later = keys(list(InputReader(location.uri, batch_size=100_000)))
    assert later == acknowledged and max(later.values()) == 1
    assert len(DeltaTable(location.table_uri(layout.STEPS)).file_uris()) == 1


def test_a_follower_behind_a_compaction_reads_its_files_once(tmp_path: Path) -> None:
    """Commits land and are compacted away between two looks of a follower: the next look
    reads the small files the data-changing commits added (still on storage, within the
    retention), never the merged file that holds the same rows."""
    location = locate(tmp_path / "ds")
    write_commits(location, 2, seed=0)
    follower = InputReader(location.uri, follow=True, timeout_s=0.5, poll_interval_s=0.02)
    stream = iter(follower)
    first = [next(stream)]
    write_commits(location, 5, seed=1)
    (done,) = upkeep(location)
    assert done.files_after == 1
    rest = list(stream)
    counted = keys(first + rest)
    assert sum(counted.values()) == 7 * 200 and max(counted.values()) == 1


def test_two_compactions_at_once_never_double_a_row(tmp_path: Path) -> None:
    """deltalake 1.6.6 lets two OPTIMIZE commits planned on one snapshot both land, each with a
    copy of the same rows; of two upkeeps started together, the lease lets one compact at a
    time (the other is told so, or runs after it), and no row is ever doubled."""
    location = locate(tmp_path / "ds")
    outcomes: Counter[str] = Counter()
    for round_ in range(4):
        write_commits(location, 4, seed=round_)
        barrier = threading.Barrier(2)

        def run(barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                upkeep(location, vacuum=False)
                outcomes["ran"] += 1
            except UpkeepBusy:
                outcomes["busy"] += 1

        threads = [threading.Thread(target=run) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    counted = keys(list(InputReader(location.uri, batch_size=100_000)))
    assert sum(counted.values()) == 16 * 200 and max(counted.values()) == 1, outcomes
    assert outcomes["ran"] >= 4


def test_a_short_retention_is_refused_without_force(tmp_path: Path) -> None:
    location = locate(tmp_path / "ds")
    write_commits(location, 3)
    with pytest.raises(ConfigError, match=r"retention of 168 hours.*--force"):
        upkeep(location, 1)
    assert operations(location)["OPTIMIZE"] == 0  # refused before anything was done


def test_compaction_passes_merge_a_writers_commits_as_they_come(tmp_path: Path) -> None:
    """Passes of ``compact_once`` (each pass of ``rlpipe serve --compact-every``), back to back
    while a writer commits, merge its commits and report each pass; the commits go on."""
    location = locate(tmp_path / "ds")
    write_commits(location, 1)
    lines: list[str] = []
    stop = threading.Event()

    def passes() -> None:
        while not stop.wait(0.05):
            compact_once(location, lines.append)

    compactor = threading.Thread(target=passes)
    compactor.start()
    try:
        write_commits(location, 10, seed=1)
        deadline = time.monotonic() + 10
        while operations(location)["OPTIMIZE"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        compactor.join()
    assert not any("failed" in line for line in lines), lines
    assert any(line.startswith("compacted steps:") for line in lines)
    assert sum(keys(list(InputReader(location.uri))).values()) == 11 * 200


def test_background_passes_leave_little_besides_the_live_files(tmp_path: Path) -> None:
    """Passes of a long-running server (``tiered``) between bursts of commits rewrite a byte
    about once per tier: merging every file under the target at every pass rewrote the growing
    merged file each time, and the removed copies stay on storage until a vacuum (here: 3.2x
    the live bytes on storage, against 6.9x; at 120 bursts and a 4 MB target, 4.1x against
    55x)."""
    location = locate(tmp_path / "ds")
    for burst in range(40):
        write_commits(location, 5, seed=burst)
        upkeep(location, target_bytes=400_000, tiered=True)
    live = Table(location, layout.STEPS).files()
    stored = sum(path.stat().st_size for path in (tmp_path / "ds" / "steps").glob("date=*/*"))
    assert stored / sum(entry.size for entry in live) < 3.5
    assert len(live) < 40  # of the 200 shards
    assert sum(keys(list(InputReader(location.uri))).values()) == 40 * 5 * 200


def test_tiers_merge_crowds_fills_and_closed_partitions() -> None:
    """The newest partition's shards are merged once MIN_FILES wait, its larger files once they
    fill a file of the target; an older partition's files are merged at once."""

    def files(date: str, *sizes: int) -> list[FileEntry]:
        return [FileEntry(f"{date}/{n}", size, 0, 1, date) for n, size in enumerate(sizes)]

    target = 100_000_000
    assert _tiered(files("d2", *[100] * 49), target) == []
    assert _tiered(files("d2", *[100] * 50), target) == [("d2", 1_000_000)]
    assert _tiered(files("d2", *[10_000_000] * 9), target) == []
    assert _tiered(files("d2", *[10_000_000] * 10), target) == [("d2", target)]
    older = files("d1", 10_000_000, 10_000_000, 60_000_000) + files("d2", 10_000_000)
    assert _tiered(older, target) == [("d1", target)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find processes")
def test_no_compactor_outlives_a_killed_server(tmp_path: Path) -> None:
    """Each pass of ``rlpipe serve --compact-every`` runs in a process spawned for it: after a
    ``kill -9`` of the server, a pass under way finishes and nothing of the server is left
    running (a compactor process that looped on its own was left compacting forever)."""
    from server_fixtures import (
        free_port,
        kill,
        process_tree,
        server_log,
        start_serve_process,
        wait_for,
    )

    from pipeline.client import PolicyClient

    data, port = tmp_path / "ds", free_port()
    server = start_serve_process(data, port, "--commit-age", "0.05", "--compact-every", "0.2")
    try:
        client = PolicyClient(f"127.0.0.1:{port}", "remote")
        play_client(client, 3, seed=0)
        deadline = time.monotonic() + 60
        while "compacted steps:" not in server_log(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "compacted steps:" in server_log(server), server_log(server)[-2000:]
        spawned = process_tree(server.pid)
    finally:
        kill(server)

    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() for pid in spawned)

    wait_for(gone, 30, f"the server's children {spawned} to exit after its kill -9")


def test_rlpipe_compact_on_s3(bucket: Bucket, capsys: pytest.CaptureFixture[str]) -> None:
    """``rlpipe compact s3://...`` with the endpoint and keys as --storage-option flags; its
    output and errors never carry the secret."""
    location = locate(bucket.uri(), bucket.options, bucket.state_dir)
    write_commits(location, 6)
    flags = [f"--storage-option={key}={value}" for key, value in bucket.options.items()]
    assert main(["compact", bucket.uri(), "--json", *flags]) == 0
    out = capsys.readouterr().out
    (steps,) = json.loads(out)["tables"]
    assert (steps["files_before"], steps["files_after"], steps["rows"]) == (6, 1, 1200)
    assert SECRET not in out
    assert (
        sum(keys(list(InputReader(bucket.uri(), storage_options=bucket.options))).values()) == 1200
    )
    assert main(["compact", bucket.uri(), "--retention-hours", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert "retention_hours" in err and "--force" in err and SECRET not in err


def test_rlpipe_serve_compacts_in_the_background(tmp_path: Path) -> None:
    """``rlpipe serve --compact-every`` compacts while clients play (its compactor is a spawned
    process: the forked worker could not run deltalake otherwise); every step the client
    played is in the table once, and the server stops with its compactor."""
    from server_fixtures import free_port, kill, server_log, start_serve_process

    from pipeline.client import PolicyClient

    data, port = tmp_path / "ds", free_port()
    server = start_serve_process(data, port, "--compact-every", "0.3", "--commit-age", "0.05")
    try:
        client = PolicyClient(f"127.0.0.1:{port}", "local", update_interval=None)
        lengths: list[int] = []
        deadline = time.monotonic() + 60
        while operations(locate(data))["OPTIMIZE"] < 2 and time.monotonic() < deadline:
            lengths += play_client(client, 2, seed=len(lengths))
            client.flush()
        client.close()
        log = server_log(server)
    finally:
        kill(server, 15)
    assert operations(locate(data))["OPTIMIZE"] >= 2, log[-2000:]
    assert "compacted steps:" in log and "compaction failed" not in log
    counted = keys(list(InputReader(data, batch_size=100_000)))
    assert sum(counted.values()) == sum(lengths) and max(counted.values()) == 1

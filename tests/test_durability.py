"""A writer killed with SIGKILL at random moments loses no acknowledged row and leaves no
partial file."""

from __future__ import annotations

import collections
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import cartpole_rollout

from pipeline import InputReader, recover
from pipeline.dataset import wal
from pipeline.dataset.discovery import list_shards
from pipeline.dataset.location import locate
from pipeline.format import layout

ROUNDS = 20
FORMS = ("columns", "rows", "packed")  # how each of three sharing writers appends
SCRIPT = Path(__file__).with_name("writer_process.py")


def _run_and_kill(
    path: Path, run: int, rng: np.random.Generator, sync: str = "always", form: str = "columns"
) -> dict[str, int]:
    """Start a writer, kill -9 it at a random moment, return the batches it acknowledged."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    with subprocess.Popen(
        [sys.executable, str(SCRIPT), str(path), str(run), "1000000", sync, form],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as process:  # fmt: skip
        return _collect_then_kill(process, rng)


def _collect_then_kill(process: subprocess.Popen[str], rng: np.random.Generator) -> dict[str, int]:
    acknowledged: dict[str, int] = {}
    first = threading.Event()

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            name, rows = line.split()
            acknowledged[name] = int(rows)
            first.set()

    reader = threading.Thread(target=collect)
    reader.start()
    assert first.wait(60), process.stderr.read() if process.stderr else "writer never acknowledged"
    time.sleep(float(rng.uniform(0.0, 0.6)))
    process.send_signal(signal.SIGKILL)
    process.wait()
    reader.join()
    assert process.returncode == -signal.SIGKILL
    return acknowledged


def _stored(path: Path) -> dict[str, np.ndarray]:
    """The stored ``t`` values of every batch name, sorted."""
    batches = list(InputReader(path, columns=["episode_id", "t"], batch_size=100_000))
    names = np.concatenate([batch.episode_ids for batch in batches]).astype(str)
    ts = np.concatenate([batch.ts for batch in batches])
    order = np.lexsort((ts, names))
    names, ts = names[order], ts[order]
    unique, starts, counts = np.unique(names, return_index=True, return_counts=True)
    return {str(n): ts[s : s + c] for n, s, c in zip(unique, starts, counts, strict=True)}


@pytest.mark.parametrize(
    ("sync", "form", "rounds"),
    [
        ("always", "columns", ROUNDS),
        ("background", "columns", 8),
        ("always", "rows", 6),
        ("background", "rows", 6),
        ("background", "packed", 6),
    ],
)
def test_sigkill_loses_no_acknowledged_row(
    tmp_path: Path, sync: str, form: str, rounds: int
) -> None:
    """``background`` acknowledges before fsync: a process kill must still lose nothing. The
    server's appends (``rows``: a few rows at a time, made columns; ``packed``: with arrays)
    go through the row log."""
    path = tmp_path / "ds"
    rng = np.random.default_rng(7)
    acknowledged: dict[str, int] = {}
    for run in range(rounds):
        acknowledged.update(_run_and_kill(path, run, rng, sync, form))
        recover(path)
        stored = _stored(path)
        missing = [name for name in acknowledged if name not in stored]
        assert not missing, f"round {run}: acknowledged batches lost: {missing[:5]}"
        for name, ts in stored.items():
            # an append is atomic: a batch is stored whole, once, or not at all
            assert np.array_equal(ts, np.arange(len(ts))), f"batch {name} is torn or duplicated"
            if name in acknowledged:
                assert len(ts) == acknowledged[name]
        for shard in list_shards(locate(path)):
            pq.read_metadata(shard)  # every visible file is whole
    assert not [p for p in (path / "_wal").glob("*/*") if p.name != "LOCK"], (
        "recovery left log segments behind")  # fmt: skip
    assert len(acknowledged) > rounds


def test_writer_processes_share_a_directory(tmp_path: Path) -> None:
    """Three processes write one dataset at once, two of them through the row log (row lines,
    column lines); every acknowledged row lands, none collides."""
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    path = tmp_path / "ds"
    processes = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(path), str(run), "40", "always", FORMS[run]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for run in range(3)
    ]
    acknowledged: dict[str, int] = {}
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        acknowledged.update((name, int(rows)) for name, rows in map(str.split, out.splitlines()))
    stored = _stored(path)
    assert {name: len(ts) for name, ts in stored.items()} == acknowledged
    assert len(acknowledged) == 120
    writers = {shard.name.split("-")[1] for shard in path.glob("steps/*/part-*.parquet")}
    assert len(writers) == 3
    assert not list(path.glob("_wal/*")), "clean exits leave no log behind"


def test_a_writer_that_died_claiming_its_log_leaves_nothing_behind(tmp_path: Path) -> None:
    """A writer killed between creating its log's staging directory and renaming it left
    ``.new-<id>`` for good; the next writer's claim removes it, but not a live claim's."""
    base = tmp_path / "_wal"
    dead, live = base / ".new-deadbeef", base / ".new-cafe"
    for staging in (dead, live):
        staging.mkdir(parents=True)
        (staging / layout.WAL_LOCK).touch()
    old = time.time() - 2 * wal.STAGING_STALE_S
    os.utime(dead, (old, old))
    os.utime(live, (old, old))
    held = os.open(live / layout.WAL_LOCK, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        fd, directory = wal.claim_log_dir(base, "f00d")
        wal.release_log_dir(fd, directory, keep=False)
        assert not dead.exists()
        assert live.exists()
    finally:
        os.close(held)


# Fault injection, as SQLite and PostgreSQL test it: this machine has no disk that fails an fsync
# on demand, so os.fsync fails here, once, with EIO, for the log segment of the second append.
_FSYNC_FAILS_ONCE = """
import errno, os, sys
sys.path.insert(0, "tests")
from conftest import cartpole_rollout, cartpole_spaces
from pipeline import DatasetWriter, StorageError, WriterConfig
real_fsync, failed = os.fsync, []
def fsync(fd):
    if ready and not failed and os.readlink(f"/proc/self/fd/{fd}").endswith(("rows", "arrows")):
        failed.append(fd)
        raise OSError(errno.EIO, "Input/output error")
    real_fsync(fd)
os.fsync, ready = fsync, False
writer = DatasetWriter(sys.argv[1], *cartpole_spaces(), env_id="CartPole-v1",
                       config=WriterConfig(max_age_s=600, sync="always"))
writer.append(cartpole_rollout(30, seed=1, client_id="a"))
ready = True
second = cartpole_rollout(40, seed=2, client_id="b")
try:
    writer.append(second)
    sys.exit("the append whose fsync failed was acknowledged")
except StorageError as error:
    print("refused:", error, flush=True)
writer.append(second)  # the simulator's retry
if sys.argv[2] == "die":
    os._exit(0)  # acknowledged, still in the log: a dead writer's rows for the next one
writer.close()
"""


@pytest.mark.parametrize("end", ["close", "die"])
def test_an_append_whose_fsync_failed_is_stored_once_when_retried(tmp_path: Path, end: str) -> None:
    """An fsync that fails (EIO) refuses the append it covered, and takes it back: its rows are
    neither committed from memory (the writer closes) nor replayed from the log (the writer
    dies and the next one recovers), so the simulator's retry stores each row once."""
    data = tmp_path / "ds"
    root = Path(__file__).parents[1]
    script = [sys.executable, "-c", _FSYNC_FAILS_ONCE, str(data), end]
    done = subprocess.run(script, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "Input/output error" in done.stdout, done.stdout
    if end == "die":
        recover(data)
    stored = pq.read_table(data / layout.STEPS, columns=["client_id", "episode_id", "t"])
    rows = collections.Counter(zip(*stored.to_pydict().values(), strict=True))
    rollouts = {
        client: cartpole_rollout(steps, seed, client)
        for client, seed, steps in (("a", 1, 30), ("b", 2, 40))
    }
    expected = collections.Counter(
        (client, episode_id, t)
        for client, rollout in rollouts.items()
        for episode_id, t in zip(rollout["episode_id"], rollout["t"], strict=True)
    )
    assert rows == expected, rows - expected

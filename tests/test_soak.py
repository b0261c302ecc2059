"""``bench/soak.py``: its check finds what it is there to find, and a short soak (a real server
and trainer killed with ``kill -9`` under every kind of client) loses and duplicates nothing."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from soak_check import check  # noqa: E402

KEY_COLUMNS = ["episode_id", "agent_id", "t"]
# 30 s of load, a kill every 4-9 s (so at least 3), the first of the server
SHORT_SOAK = "bench/soak.py --minutes 0.5 --kill-every 4,9 --seed 1"


def test_check_counts_lost_duplicated_and_unreadable(
    make_dataset: Callable[..., Path], tmp_path: Path
) -> None:
    data = make_dataset(steps=300, per_append=100)
    shards = sorted((data / "steps").rglob("*.parquet"))
    keys = pq.read_table(shards[0], columns=KEY_COLUMNS).to_pylist()
    acks = tmp_path / "acks.txt"
    lines = [f"{k['episode_id']} {k['agent_id']} {k['t']}" for k in keys]
    acks.write_text("\n".join([*lines, "never-stored agent0 3"]) + "\n")
    shutil.copy(shards[0], shards[0].with_name("part-copy-00000000.parquet"))
    (shards[0].parent / "part-torn-00000000.parquet").write_bytes(b"PAR1 torn off")
    (shards[0].parent / ".part-half.parquet").write_bytes(b"")

    found = check(data, [acks])

    assert found["acknowledged_steps"] == len(keys) + 1
    assert found["lost_acknowledged_steps"] == 1
    assert found["lost_examples"] == ["never-stored agent0 3"]
    assert found["duplicated_steps"] == len(keys)
    assert found["stored_steps"] == 300 + len(keys)
    assert found["unreadable_files"] == 1
    assert any("part-torn" in name for name in found["unreadable_names"])
    assert found["stray_files"] == [
        str((shards[0].parent / ".part-half.parquet").relative_to(data))
    ]
    assert found["inspect"]["problems"] >= 2


def test_check_counts_no_row_of_the_files_a_compaction_removed(tmp_path: Path) -> None:
    """A compaction's merged files hold the rows of the files it removed, which stay on disk
    until a vacuum; rows count once, and the removed files are still read whole."""
    from conftest import cartpole_rollout, cartpole_spaces

    from pipeline import DatasetWriter
    from pipeline.dataset.location import locate
    from pipeline.dataset.upkeep import DEFAULT_RETENTION_HOURS, upkeep

    data, rows = tmp_path / "ds", cartpole_rollout(300, seed=0)
    with DatasetWriter(data, *cartpole_spaces(), env_id="CartPole-v1") as writer:
        for start in range(0, 300, 100):
            writer.append({key: value[start : start + 100] for key, value in rows.items()})
            writer.flush()  # a commit, and a file, each
    small = sorted((data / "steps").glob("date=*/*.parquet"))
    upkeep(locate(data), DEFAULT_RETENTION_HOURS)
    merged = set((data / "steps").glob("date=*/*.parquet")) - set(small)
    assert len(small) == 3 and len(merged) == 1
    keys = [k for f in small for k in pq.read_table(f, columns=KEY_COLUMNS).to_pylist()]
    small[0].write_bytes(b"PAR1 torn off")  # removed, yet read: its damage is found
    acks = tmp_path / "acks.txt"
    acks.write_text("".join(f"{k['episode_id']} {k['agent_id']} {k['t']}\n" for k in keys))

    found = check(data, [acks])

    assert (found["stored_steps"], found["duplicated_steps"]) == (300, 0)
    assert (found["lost_acknowledged_steps"], found["reader_rows"]) == (0, 300)
    assert found["unreadable_files"] == 1 and str(small[0]) in found["unreadable_names"][0]


@pytest.mark.timeout(240)
def test_short_soak_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    work = tmp_path / "soak"
    soak = subprocess.Popen(
        [sys.executable, *SHORT_SOAK.split(), "--keep", str(work)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its server, trainer and clients are in its process group
    )
    try:
        out, _ = soak.communicate(timeout=200)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(soak.pid, signal.SIGKILL)  # whatever a failed run left behind
    assert soak.returncode == 0, out[-5000:]
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["kills"] >= 2, out
    assert figures["server_kills"] >= 1
    assert figures["restarts"] == figures["kills"]
    assert figures["acknowledged_steps"] > 1000, out
    assert figures["lost_acknowledged_steps"] == 0, out
    assert figures["duplicated_steps"] == 0, out
    assert figures["unreadable_files"] == 0, out
    assert figures["unexpected_exits"] == 0, out
    assert "server_rss_growth" in figures

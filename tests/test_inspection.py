"""``rlpipe inspect``: known counts and returns of real datasets, and every unhealthy file."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import cartpole_rollout
from PIL import Image

from pipeline.commands.cli import main
from pipeline.commands.inspection import inspect_dataset
from pipeline.importers.table import import_dataframe


def expected_episodes(steps: int, seed: int = 0) -> tuple[list[float], int]:
    """Returns of the complete episodes in make_dataset's rows, and how many were cut off."""
    rows = cartpole_rollout(steps, seed=seed)
    returns: dict[str, list[float]] = {}
    ended: set[str] = set()
    for key, reward, term, trunc in zip(
        rows["episode_id"], rows["reward"], rows["terminated"], rows["truncated"], strict=True
    ):
        returns.setdefault(str(key), []).append(float(reward))
        if term or trunc:
            ended.add(str(key))
    complete = [math.fsum(v) for k, v in returns.items() if k in ended]
    return complete, len(returns) - len(ended)


def run_json(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert main(["inspect", str(path), "--json", *extra]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def test_counts_and_returns_of_a_recorded_dataset(
    make_dataset: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_dataset(steps=1000, per_append=250)
    report = run_json(path, capsys)
    complete, incomplete = expected_episodes(1000)
    assert report["rows"] == 1000
    assert report["episodes"] == {"complete": len(complete), "incomplete": incomplete}
    assert report["clients"] == ["c0"]
    assert report["agents"] == ["agent0"]
    assert report["policy_versions"] == []
    assert report["env_id"] == "CartPole-v1"
    assert report["shards"]["steps"] >= 1
    assert report["returns"]["source"] == "steps"  # make_dataset writes no episodes table
    assert report["returns"]["count"] == len(complete)
    assert report["returns"]["mean"] == pytest.approx(np.mean(complete))
    assert report["returns"]["max"] == max(complete)
    assert report["date_range"]["first"] <= report["date_range"]["last"]
    assert "observation: fixed_size_list<item: float>[4]" in report["schema"]
    assert report["health"] == {
        "uncommitted": [],
        "unreadable": [],
        "pending_log": [],
        "damaged": [],
    }


def test_episodes_table_and_policy_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    frame = pd.DataFrame({
        "episode_id": ["a", "a", "b", "b", "b"],
        "observation": [[0.0]] * 5,
        "action": [0, 1, 1, 0, 1],
        "reward": [1.0, 2.0, 0.5, 0.5, 0.5],
        "next_observation": [[0.0]] * 5,
        "terminated": [False, True, False, False, False],
        "truncated": [False, False, False, False, True],
    })  # fmt: skip
    import_dataframe(frame, tmp_path / "ds")
    report = run_json(tmp_path / "ds", capsys)
    assert report["episodes_table"] == {"rows": 2, "end_reasons": {"terminated": 1,
                                                                   "truncated": 1}}  # fmt: skip
    assert report["returns"] == {"source": "episodes", "count": 2, "mean": 2.25, "std": 0.75,
                                 "min": 1.5, "max": 3.0}  # fmt: skip
    assert report["lengths"]["max"] == 3
    assert main(["inspect", str(tmp_path / "ds")]) == 0
    text = capsys.readouterr().out
    assert "episodes       2 complete, 0 incomplete in steps; 2 in the episodes table " in text
    assert "(1 terminated, 1 truncated)" in text
    assert "health         ok" in text


def test_unhealthy_files_are_reported(
    make_dataset: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_dataset(steps=200, per_append=100)
    partition = next((path / "steps").glob("date=*"))
    broken = sorted(partition.glob("part-*.parquet"))[0]  # a committed shard, damaged
    (partition / "part-dead-00000009.parquet").write_bytes(b"half a shard, never committed")
    lost = pq.read_metadata(broken).num_rows
    broken.write_bytes(b"not parquet at all")
    wal = path / "_wal" / "deadwriter"
    wal.mkdir(parents=True)
    (wal / "steps-00000000.arrows").write_bytes(b"")
    report = run_json(path, capsys)
    date = partition.name
    assert report["health"] == {
        "uncommitted": [f"steps/{date}/part-dead-00000009.parquet"],
        "unreadable": [f"steps/{date}/{broken.name}"],
        "pending_log": ["_wal/deadwriter/steps-00000000.arrows"],
        "damaged": [
            {
                "file": f"steps/{date}/{broken.name}",
                "problem": "its footer cannot be read (Parquet magic bytes not found in footer. "
                "Either the file is corrupted or this is not a parquet file.)",
            }
        ],
    }
    assert report["rows"] == 200 - lost  # the unreadable shard is left out, not fatal
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "health         3 problems" in text
    assert f"  - unreadable file steps/{date}/{broken.name}" in text


def test_plot_writes_a_png(
    make_dataset: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_dataset(steps=500)
    out = tmp_path / "plots" / "returns.png"
    report = run_json(path, capsys, "--plot", str(out))
    assert report["plot"] == str(out.resolve())
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (1000, 400)


def test_not_a_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path)]) == 2
    assert "no manifest.json; this is not an rlpipe dataset" in capsys.readouterr().err


def test_empty_dataset(tmp_path: Path) -> None:
    from conftest import cartpole_spaces

    from pipeline import DatasetWriter

    observation_space, action_space = cartpole_spaces()
    DatasetWriter(tmp_path / "ds", observation_space, action_space).close()
    report = inspect_dataset(tmp_path / "ds")
    assert report["rows"] == 0
    assert report["returns"]["count"] == 0


def test_returns_too_large_to_square_are_described_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finite returns whose squares pass a double's range (an upload may hold them) are
    described exactly as smaller ones; rlpipe inspect raised OverflowError on them (found by
    the Schemathesis run's check of what it stored)."""
    from fractions import Fraction

    from conftest import cartpole_spaces

    from pipeline.dataset.writer import DatasetWriter

    rows = cartpole_rollout(200, seed=1)
    rows["reward"] = [1e306 * (1 if i % 3 else -2) for i in range(200)]
    with DatasetWriter(tmp_path / "ds", *cartpole_spaces(), env_id="CartPole-v1") as writer:
        writer.append(rows)
    returns = run_json(tmp_path / "ds", capsys)["returns"]
    sums: dict[str, Fraction] = {}
    ended = set()
    columns = ("episode_id", "reward", "terminated", "truncated")
    for key, reward, terminated, truncated in zip(*(rows[c] for c in columns), strict=True):
        sums[str(key)] = sums.get(str(key), Fraction(0)) + Fraction(reward)
        if terminated or truncated:
            ended.add(str(key))
    values = [total for key, total in sums.items() if key in ended]  # complete episodes
    assert returns["count"] == len(values) > 2
    mean = sum(values, Fraction(0)) / len(values)
    variance = sum(((v - mean) ** 2 for v in values), Fraction(0)) / len(values)
    assert math.isclose(returns["mean"], float(mean), rel_tol=1e-12)
    assert math.isclose(returns["std"], math.sqrt(float(variance / 2**1200)) * 2**600, rel_tol=1e-9)

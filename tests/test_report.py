"""``rlpipe inspect DIR --html``: one self-contained page with the dataset's figures (the page
drawn in a real browser: tests/test_dashboard_browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cartpole_rollout, cartpole_spaces

from pipeline import DatasetWriter
from pipeline.commands.cli import main


def report_dataset(path: Path) -> Path:
    """CartPole rows acted by policy versions 1 and 2, one observation past the space's bound."""
    rows = cartpole_rollout(600)
    rows["policy_version"] = np.where(np.arange(600) < 300, 1, 2)
    rows["observation"] = rows["observation"].copy()
    rows["observation"][5, 0] = 7.5  # the cart position's bound is 4.8
    with DatasetWriter(path, *cartpole_spaces(), env_id="CartPole-v1") as writer:
        writer.append(rows)
    return path


def page_data(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    assert found is not None
    data: dict[str, Any] = json.loads(found[1])
    return data


def test_html_report_holds_the_figures_and_loads_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = report_dataset(tmp_path / "ds")
    out = tmp_path / "mail" / "report.html"
    assert main(["inspect", str(data), "--html", str(out)]) == 0
    assert f"html report    {out.resolve()}" in capsys.readouterr().out
    page = out.read_text(encoding="utf-8")
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # nothing fetched: mailable
    assert "RlCharts" in page
    figures = page_data(page)
    report = figures["report"]
    assert figures["sampled"] == report["rows"] == 600
    assert len(figures["episodes"]) == report["returns"]["count"] > 10
    assert {e[3] for e in figures["episodes"]} == {1, 2}
    assert sum(e[2] for e in figures["episodes"]) <= 600
    actions = figures["actions"]
    assert (actions["kind"], actions["labels"]) == ("counts", [0, 1])
    assert sum(actions["counts"]) == 600
    dims = figures["observations"]["dims"]
    assert [d["dim"] for d in dims] == [0, 1, 2, 3]
    assert (dims[0]["low"], dims[0]["high"]) == pytest.approx((-4.8, 4.8))  # float32 bounds
    assert dims[0]["outside"] == 1
    assert dims[0]["quantiles"][-1] == 7.5
    assert dims[1]["low"] is None and dims[1]["outside"] == 0  # an unbounded velocity
    assert "health         ok" in page  # the text report is in it too


def test_html_report_of_an_empty_dataset(tmp_path: Path) -> None:
    DatasetWriter(tmp_path / "ds", *cartpole_spaces()).close()
    out = tmp_path / "report.html"
    assert main(["inspect", str(tmp_path / "ds"), "--html", str(out)]) == 0
    figures = page_data(out.read_text(encoding="utf-8"))
    assert figures["episodes"] == [] and figures["actions"] == {"kind": "none"}


def test_an_image_dataset_gets_a_strip_of_frames_from_a_bounded_sample(tmp_path: Path) -> None:
    """Frames are stored as their bytes: the report reads them back as images, shows a strip of
    thumbnails, and reads at most SAMPLE_BYTES of them (200,000 frames would be 34 GB as the
    floats the ranges are computed from)."""
    import gymnasium as gym

    from pipeline.commands.report import FRAMES, SAMPLE_BYTES, sample_rows

    space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    assert sample_rows(space) == SAMPLE_BYTES // (84 * 84 * 3)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (41, 84, 84, 3), dtype=np.uint8)
    rows = {
        "episode_id": ["e"] * 40,
        "t": np.arange(40),
        "observation": frames[:-1],
        "action": rng.integers(0, 2, 40),
        "reward": np.ones(40),
        "next_observation": frames[1:],
        "terminated": np.arange(40) == 39,
        "truncated": np.zeros(40, bool),
    }
    with DatasetWriter(tmp_path / "ds", space, gym.spaces.Discrete(2)) as writer:
        writer.append(rows)
    out = tmp_path / "report.html"
    assert main(["inspect", str(tmp_path / "ds"), "--html", str(out)]) == 0
    page = out.read_text()
    assert len(re.findall(r'<img src="data:image/png;base64,', page)) == FRAMES
    ranges = page_data(page)["observations"]
    assert ranges["of"] == 84 * 84 * 3 and len(ranges["dims"]) == 64

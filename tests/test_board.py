"""pipeline/trainers/board.py: a run's records as TensorBoard scalars beside metrics.jsonl, under
CleanRL's names, read back with TensorBoard's own event reader."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeline.trainers.runlog import RunLog

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="needs tensorboard (the tensorboard extra)",
)


def test_records_become_scalars_under_cleanrl_names(tmp_path: Path) -> None:
    log = RunLog(tmp_path, "ppo online", stream=io.StringIO())
    log.record(update=1, version=1, env_steps=200, episode_return=12.5, value_loss=0.75)
    log.record(update=2, version=2, env_steps=600, episode_return=30.0, value_loss=0.5, ok=True)
    log.close()
    assert (tmp_path / "metrics.jsonl").exists()
    board = event_accumulator.EventAccumulator(str(tmp_path))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert {
        "charts/episodic_return",
        "losses/value_loss",
        "charts/policy_version",
        "charts/SPS",
    } <= tags
    assert "charts/ok" not in tags  # flags are not curves
    returns = board.Scalars("charts/episodic_return")
    assert [(e.step, e.value) for e in returns] == [(200, 12.5), (600, 30.0)]
    assert [e.value for e in board.Scalars("losses/value_loss")] == [0.75, 0.5]
    (sps,) = board.Scalars("charts/SPS")
    assert sps.step == 600 and sps.value > 0


def test_an_offline_run_steps_by_update(tmp_path: Path) -> None:
    log = RunLog(tmp_path, "bc offline", stream=io.StringIO())
    for update in (1, 2, 3):
        log.record(update=update, version=update, loss=1.0 / update)
    log.close()
    board = event_accumulator.EventAccumulator(str(tmp_path))
    board.Reload()
    assert [e.step for e in board.Scalars("losses/loss")] == [1, 2, 3]
    assert "charts/SPS" not in board.Tags()["scalars"]

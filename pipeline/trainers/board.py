"""A run's scalars for TensorBoard, under the names Stable-Baselines3 and CleanRL users know.

When ``tensorboard`` is installed (``pip install 'rlpipe[tensorboard]'``), every record of a run
(:class:`~pipeline.trainers.runlog.RunLog`) is also written as scalars to an event file beside
``metrics.jsonl`` (``tensorboard --logdir RUN``), through ``torch.utils.tensorboard``, the writer
SB3 uses. Names follow CleanRL (``charts/episodic_return``, ``losses/value_loss``,
``charts/SPS``; ``cleanrl/ppo.py``), so dashboards and comparison scripts written for those runs
read ours. The step is the run's environment steps when it counts them (online), as in CleanRL's
``global_step``, else its update number (offline).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TextIO

# our record keys -> CleanRL's scalar names; any other number is logged as charts/<key>
NAMES = {
    "episode_return": "charts/episodic_return",
    "eval_return": "eval/episodic_return",
    "version": "charts/policy_version",
    "loss": "losses/loss",
    "policy_loss": "losses/policy_loss",
    "value_loss": "losses/value_loss",
    "entropy": "losses/entropy",
    "approx_kl": "losses/approx_kl",
    "clipfrac": "losses/clipfrac",
    "actor_loss": "losses/actor_loss",
    "critic_loss": "losses/qf_loss",
    "q": "losses/qf1_values",
    "alpha": "losses/alpha",
    "td_loss": "losses/td_loss",
    "cql_penalty": "losses/cql_penalty",
    "logp": "losses/logp",
}
_NOT_SCALARS = {"seconds", "update", "env_steps"}  # the steps and the clock, not curves


class Board:
    """An event file of the run's scalars; :func:`open_board` makes one when it can."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer
        self._last: tuple[float, int] | None = None  # (seconds, env_steps) of the last record

    def write(self, entry: dict[str, Any]) -> None:
        """One record of the run: its numbers as scalars at its step, and the env steps per
        second since the last record (``charts/SPS``) when it counts env steps."""
        step = int(entry.get("env_steps", entry.get("update", 0)) or 0)
        for key, value in entry.items():
            if key in _NOT_SCALARS or isinstance(value, bool):
                continue
            if isinstance(value, int | float):
                self._writer.add_scalar(NAMES.get(key, f"charts/{key}"), value, step)
        if "env_steps" in entry:  # the clock unrounded: records may come within a millisecond
            now = (time.monotonic(), entry["env_steps"])
            if self._last is not None and now[0] > self._last[0]:
                sps = (now[1] - self._last[1]) / (now[0] - self._last[0])
                self._writer.add_scalar("charts/SPS", sps, step)
            self._last = now
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def open_board(run_dir: Path, stream: TextIO) -> Board | None:
    """A board writing into ``run_dir``, or None (and a line on ``stream``) without
    tensorboard."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print(
            "tensorboard is not installed: no TensorBoard scalars "
            "(pip install 'rlpipe[tensorboard]')",
            file=stream,
        )
        return None
    return Board(SummaryWriter(log_dir=str(run_dir)))

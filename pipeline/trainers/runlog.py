"""A training run's record: a metrics file, a progress line on the terminal, a learning curve.

Metrics go to ``RUN/metrics.jsonl``, one JSON object per line (appended and flushed as they come,
so a crashed run keeps its history and ``pandas.read_json(lines=True)`` reads it). The curve is
drawn with matplotlib when it is installed; it is optional, so without it the run says so once
and skips the PNG. With tensorboard installed, the same records go to a TensorBoard event file
beside the metrics, under CleanRL's scalar names (:mod:`pipeline.trainers.board`).

A run also keeps its read log, ``RUN/reads.jsonl``: one line per batch it read from the dataset
(an offline run: one for all it read), ``{"seconds", "pid", "rows", "shards", "data_version"}``, the
shards (paths under the dataset root) whose rows first came in that batch, and the version of the
step table's Delta log read up to, so the run can be repeated on the table as it was
(``InputReader(data, version=...)``). Lines of a resumed run follow those of the run before it,
under another ``pid``; so the log shows which rows each process read, and that a resumed one read
none it had already trained on.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from pipeline.trainers.board import open_board

METRICS_FILE = "metrics.jsonl"
READS_FILE = "reads.jsonl"
CURVE_FILE = "learning_curve.png"


class RunLog:
    """Records metrics of one run; ``close()`` draws the learning curve."""

    def __init__(self, run_dir: Path, title: str, stream: TextIO | None = None) -> None:
        self.run_dir = run_dir
        self.title = title
        run_dir.mkdir(parents=True, exist_ok=True)
        self.stream = stream or sys.stderr
        self._file = (run_dir / METRICS_FILE).open("a", encoding="utf-8")
        self._start = time.monotonic()
        self._records: list[dict[str, Any]] = []
        self._interactive = self.stream.isatty()
        self._reads: TextIO | None = None
        self._board = open_board(run_dir, self.stream)

    def record(self, **values: Any) -> dict[str, Any]:
        entry = {
            "seconds": round(time.monotonic() - self._start, 3),
            **{k: _plain(v) for k, v in values.items()},
        }
        self._records.append(entry)
        self._file.write(json.dumps(entry) + "\n")
        self._file.flush()
        if self._board is not None:
            self._board.write(entry)
        self.progress(entry)
        return entry

    def read(
        self, shards: list[str], rows: int, data_version: int | None = None, **extra: Any
    ) -> None:
        """Log a batch read from the dataset: its rows, the shards whose rows it brought, and
        the table version read up to; ``extra`` fields follow (a rank's, in a distributed run)."""
        if self._reads is None:
            self._reads = (self.run_dir / READS_FILE).open("a", encoding="utf-8")
        seconds = round(time.monotonic() - self._start, 3)
        line = {
            "seconds": seconds,
            "pid": os.getpid(),
            "rows": rows,
            "shards": shards,
            "data_version": data_version,
            **extra,
        }
        self._reads.write(json.dumps(line) + "\n")
        self._reads.flush()

    def progress(self, entry: dict[str, Any]) -> None:
        """One line per record; rewritten in place on a terminal, appended in a log."""
        shown = ("update", "version", "eval_return", "episode_return", "loss", "rows")
        parts = [f"{key}={_short(entry[key])}" for key in shown if key in entry]
        line = f"{self.title} {entry['seconds']:7.1f}s " + " ".join(parts)
        end = "\r" if self._interactive else "\n"
        print(line.ljust(100) if self._interactive else line, end=end, file=self.stream)
        self.stream.flush()

    def close(self) -> Path | None:
        """Close the metrics file and draw the curve; returns the PNG's path, if drawn."""
        self._file.close()
        if self._board is not None:
            self._board.close()
        if self._reads is not None:
            self._reads.close()
        if self._interactive:
            print(file=self.stream)
        return plot(self._records, self.run_dir / CURVE_FILE, self.title, self.stream)


def plot(records: list[dict[str, Any]], path: Path, title: str, stream: TextIO) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a server
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no learning-curve PNG", file=stream)
        return None
    key = next(
        (k for k in ("eval_return", "episode_return", "loss") if any(k in r for r in records)),
        None,
    )
    if key is None:
        return None
    points = [(r.get("update", 0), r[key]) for r in records if key in r]
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot([p[0] for p in points], [p[1] for p in points], marker=".")
    axes.set_xlabel("update")
    axes.set_ylabel(key.replace("_", " "))
    axes.set_title(title)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

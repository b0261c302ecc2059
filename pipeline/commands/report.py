"""A dataset's report (:mod:`pipeline.commands.inspection`) as a screenful of text, and with
``rlpipe inspect DIR --html REPORT.html`` as one self-contained HTML file.

The file holds its data (JSON), its chart script (:mod:`pipeline.charts`, inline SVG) and its
styles, and loads nothing, so it can be mailed or attached to a ticket and opened anywhere. It
shows what ``inspect`` prints (with its health findings first when there are any), returns over
time and by policy version, the episode length histogram, the action distribution, and each
observation dimension's range against the space's bounds. Observations and actions are read
from at most :data:`SAMPLE_ROWS` rows and :data:`SAMPLE_BYTES` of observations (the report says so
when it is fewer than all); a dataset of image observations also gets a strip of thumbnails.
"""

from __future__ import annotations

import html
import json
import math
import re
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline import charts

SAMPLE_ROWS = 200_000  # observation and action rows read for their ranges and distribution
SAMPLE_BYTES = 64 * 2**20  # ... and at most this many bytes of observations (camera frames)
FRAMES = 16  # frames in the thumbnail strip of an image dataset
_LIST_LIMIT = 20  # names listed in the text
SHOWN_DIMS = 64  # observation dimensions listed one by one
HISTOGRAM_BINS = 30


def write_report(
    report: dict[str, Any],
    text: str,
    spaces: tuple[gym.Space[Any], gym.Space[Any]],
    tables: tuple[Any, Any, Any],
    out: str | Path,
) -> Path:
    """Write the HTML report of ``inspect``'s ``report`` (and its ``text``) for a dataset of
    ``spaces`` (observation, action), from ``tables``: the step table's narrow columns, the
    episodes table, and the observation and action columns of up to SAMPLE_ROWS rows."""
    steps, episodes, sample = tables
    data = {
        "report": report,
        "episodes": _episodes(steps, episodes),
        "actions": _distribution(spaces[1], sample, "action"),
        "observations": _ranges(spaces[0], sample),
        "sampled": sample.num_rows,
    }
    values = {
        "TITLE": html.escape(f"rlpipe dataset report: {report['path']}"),
        "STYLE": charts.STYLE,
        "TEXT": html.escape(text),
        "FRAMES": _strip(spaces[0], sample),
        "SCRIPT": charts.script(),
        "DATA": json.dumps(data, default=str, allow_nan=False).replace("</", "<\\/"),
        "MADE": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    template = files("pipeline.commands").joinpath("report.html").read_text(encoding="utf-8")
    page = re.sub(r"/\*__(\w+)__\*/", lambda found: values[found[1]], template)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    return target


def _episodes(steps: Any, episodes: Any) -> list[list[Any]]:
    """Each ended episode as [ended_at (unix s), return, length, policy version]: from the
    episodes table when it has rows, else summed from the step table's ended episodes; the
    version is the newest that acted in the episode (None: at random)."""
    from pipeline.commands.inspection import complete_episodes

    versions = steps.group_by("episode_id").aggregate([("policy_version", "max")])
    by_id = dict(
        zip(
            versions.column("episode_id").to_pylist(),
            versions.column("policy_version_max").to_pylist(),
            strict=True,
        )
    )
    if episodes.num_rows:
        ids, ended = episodes.column("episode_id"), episodes.column("ended_at")
        returns, lengths = episodes.column("return"), episodes.column("length")
    else:
        table = complete_episodes(steps)
        ids, ended = table.column("episode_id"), table.column("logged_at_max")
        returns, lengths = table.column("reward_sum"), table.column("reward_count")
    rows = [
        [t.timestamp(), r, n, by_id.get(i)]
        for i, t, r, n in zip(
            ids.to_pylist(),
            ended.to_pylist(),
            returns.to_pylist(),
            lengths.to_pylist(),
            strict=True,
        )
        if math.isfinite(r)
    ]
    return sorted(rows, key=lambda row: row[0])


def sample_rows(space: gym.Space[Any]) -> int:
    """How many rows the report reads: SAMPLE_ROWS, fewer for observations of many bytes."""
    size = int(np.prod(space.shape)) * space.dtype.itemsize if space.shape and space.dtype else 8
    return max(1, min(SAMPLE_ROWS, SAMPLE_BYTES // max(size, 1)))


def _values(space: gym.Space[Any], column: Any, dims: int | None = None) -> np.ndarray:
    """A column as float rows (the first ``dims`` values of each): a Box's own values, any
    other space flattened (one-hot)."""
    from pipeline.format.codec import from_arrow
    from pipeline.format.flattening import flatten

    if isinstance(space, gym.spaces.Box):
        batch = np.asarray(from_arrow(space, column))
        return np.asarray(batch.reshape(len(batch), -1)[:, :dims], np.float64)
    return np.asarray(flatten(space, column), np.float64)[:, :dims]


def _image(space: gym.Space[Any]) -> bool:
    """A uint8 Box shaped as an image: (height, width) or (height, width, 1, 3 or 4)."""
    shape = space.shape or ()
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and (len(shape) == 2 or (len(shape) == 3 and shape[2] in (1, 3, 4)))
        and min(shape[:2]) >= 8
    )


def _strip(space: gym.Space[Any], sample: Any) -> str:
    """Up to FRAMES observations of the first rows, evenly spaced, as inline PNG images; empty
    unless the observations are images."""
    import base64
    import io

    from PIL import Image

    from pipeline.format.codec import from_arrow

    if not _image(space) or sample.num_rows == 0:
        return ""
    picked = np.unique(np.linspace(0, sample.num_rows - 1, FRAMES).astype(np.int64))
    frames = np.asarray(from_arrow(space, sample.column("observation").take(picked)))
    images = []
    for row, frame in zip(picked.tolist(), frames, strict=True):
        buffer = io.BytesIO()
        Image.fromarray(
            frame.squeeze(-1) if frame.ndim == 3 and frame.shape[2] == 1 else frame
        ).save(buffer, format="PNG")
        data = base64.b64encode(buffer.getvalue()).decode()
        images.append(f'<img src="data:image/png;base64,{data}" title="row {row}" alt="row {row}">')
    return (
        '<div class="panel"><h2>Observations (rows of the sample, evenly spaced)</h2>'
        f'<div class="strip">{"".join(images)}</div></div>'
    )


def _distribution(space: gym.Space[Any], sample: Any, name: str) -> dict[str, Any]:
    """Counts of each discrete action, or a histogram of each dimension of any other."""
    if sample.num_rows == 0:
        return {"kind": "none"}
    column = sample.column(name)
    if isinstance(space, gym.spaces.Discrete):
        values = np.asarray(column.to_numpy(zero_copy_only=False), np.int64)
        labels = list(range(int(space.start), int(space.start + space.n)))
        tally = [int((values == label).sum()) for label in labels]
        return {"kind": "counts", "labels": labels, "counts": tally}
    values = _values(space, column, 8)
    dims = []
    for d in range(values.shape[1]):
        counts, edges = np.histogram(values[:, d], bins=HISTOGRAM_BINS)
        dims.append({"counts": counts.tolist(), "edges": edges.tolist()})
    return {"kind": "histograms", "dims": dims, "of": flat_size(space)}


def _ranges(space: gym.Space[Any], sample: Any) -> dict[str, Any]:
    """Each observation dimension's min, p10, median, p90 and max against the space's bounds
    (a Box's; other spaces are flattened, one-hot, and have none), and how many rows fall out."""
    if sample.num_rows == 0:
        return {"dims": [], "of": 0}
    values = _values(space, sample.column("observation"), SHOWN_DIMS)
    low = high = None
    if isinstance(space, gym.spaces.Box):
        low = np.asarray(space.low, np.float64).reshape(-1)
        high = np.asarray(space.high, np.float64).reshape(-1)
    quantiles = np.percentile(values, [0, 10, 50, 90, 100], axis=0)
    dims = []
    for d in range(min(values.shape[1], SHOWN_DIMS)):
        outside = 0
        if low is not None and high is not None:
            outside = int(((values[:, d] < low[d]) | (values[:, d] > high[d])).sum())
        dims.append(
            {
                "dim": d,
                "quantiles": [float(q) for q in quantiles[:, d]],
                "low": None if low is None or not np.isfinite(low[d]) else float(low[d]),
                "high": None if high is None or not np.isfinite(high[d]) else float(high[d]),
                "outside": outside,
            }
        )
    return {"dims": dims, "of": flat_size(space)}


def flat_size(space: gym.Space[Any]) -> int:
    """Values a row of ``space`` holds (flattened, one-hot)."""
    from pipeline.format.flattening import flatdim

    return int(np.prod(space.shape)) if isinstance(space, gym.spaces.Box) else flatdim(space)


def text_report(report: dict[str, Any]) -> str:
    """The report as a screenful of text."""
    table, health = report["episodes_table"], report["health"]
    lines = [
        f"dataset        {report['path']}  (format {report['format_version']}, created "
        f"{report['created_at']})",
        f"env            {report['env_id'] or '(external simulator)'}",
        f"observation    {report['spaces']['observation']}",
        f"action         {report['spaces']['action']}",
        f"shards         {report['shards']['steps']} step, {report['shards']['episodes']} episode "
        f"({report['bytes']:,} bytes)",
        f"rows           {report['rows']:,}",
        f"episodes       {report['episodes']['complete']:,} complete, "
        f"{report['episodes']['incomplete']:,} incomplete in steps; {table['rows']:,} in the "
        f"episodes table {_counts(table['end_reasons'])}",
        f"clients        {_names(report['clients'])}",
        f"agents         {_names(report['agents'])}",
        f"policy         {_versions(report['policy_versions'])}",
        f"dates          {report['date_range']['first']} .. {report['date_range']['last']}",
        f"returns        {_stats(report['returns'])}",
        f"lengths        {_stats(report['lengths'])}",
        "schema         " + ", ".join(report["schema"]),
    ]
    problems = (
        [f"uncommitted file {name}" for name in health["uncommitted"]]
        + [f"pending log segment {name}" for name in health["pending_log"]]
        + [f"unreadable file {d['file']}: {d['problem']}" for d in health["damaged"]]
    )
    lines.append("health         " + ("ok" if not problems else f"{len(problems)} problems"))
    lines += [f"  - {problem}" for problem in problems]
    if "plot" in report:
        lines.append(f"plot           {report['plot']}")
    if "html" in report:
        lines.append(f"html report    {report['html']}")
    return "\n".join(lines)


def _stats(stats: dict[str, Any]) -> str:
    if not stats["count"]:
        return "(no ended episodes)"
    return (
        f"mean {stats['mean']:.4g}, std {stats['std']:.4g}, min {stats['min']:.4g}, "
        f"max {stats['max']:.4g} over {stats['count']} episodes (from the {stats['source']} "
        "table)"
    )


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_LIST_LIMIT])
    more = f", ... ({len(names)} in all)" if len(names) > _LIST_LIMIT else ""
    return f"{len(names)}: {shown}{more}" if names else "0"


def _versions(versions: list[int]) -> str:
    if not versions:
        return "no policy versions recorded"
    return f"{len(versions)} versions, {versions[0]} .. {versions[-1]}"


def _counts(counts: dict[str, int]) -> str:
    return "(" + ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items())) + ")"

"""``rlpipe inspect DIR --html REPORT.html``: a dataset's report as one self-contained HTML file.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline import charts

SAMPLE_ROWS = 200_000  # observation and action rows read for their ranges and distribution
SAMPLE_BYTES = 64 * 2**20  # ... and at most this many bytes of observations (camera frames)
FRAMES = 16  # frames in the thumbnail strip of an image dataset
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
    page = _PAGE.format(
        title=html.escape(f"rlpipe dataset report: {report['path']}"),
        style=charts.STYLE,
        text=html.escape(text),
        frames=_strip(spaces[0], sample),
        script=charts.script(),
        data=json.dumps(data, default=str, allow_nan=False).replace("</", "<\\/"),
        made=datetime.now(UTC).isoformat(timespec="seconds"),
    )
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


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>
{style}
body {{ margin: 0 auto; max-width: 1280px; padding: 12px 20px; color: #111827;
  font: 14px system-ui, sans-serif; background: #f3f4f6; }}
h1 {{ font-size: 18px; }} h2 {{ font-size: 14px; margin: 0 0 4px; color: #374151; }}
.grid {{ display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 10px; }}
.panel {{ background: #fff; border-radius: 6px; padding: 8px 10px; margin-bottom: 10px; }}
pre {{ white-space: pre-wrap; font-size: 12px; margin: 0; }}
table {{ border-collapse: collapse; font-size: 12px; font-variant-numeric: tabular-nums; }}
th, td {{ padding: 2px 8px; border-bottom: 1px solid #f3f4f6; text-align: right; }}
.bad {{ color: #b91c1c; font-weight: 600; }} .ok {{ color: #15803d; font-weight: 600; }}
.note {{ color: #6b7280; font-size: 12px; }}
.strip {{ display: flex; flex-wrap: wrap; gap: 4px; }}
.strip img {{ width: 84px; image-rendering: pixelated; border: 1px solid #e5e7eb; }}
</style>
</head>
<body>
<h1>{title}</h1>
<div class="panel"><h2>Health</h2><div id="health"></div></div>
<div class="grid">
  <div class="panel"><h2>Episode return over time (each episode; median, p10-p90 of 20 groups)</h2>
    <div id="returns-time"></div></div>
  <div class="panel"><h2>Episode return by policy version (median, p10-p90)</h2>
    <div id="returns-version"></div></div>
  <div class="panel"><h2>Episode lengths</h2><div id="lengths"></div></div>
  <div class="panel"><h2>Actions</h2><div id="actions"></div></div>
</div>
{frames}
<div class="panel"><h2>Observation ranges per dimension, against the space</h2>
  <div id="observations"></div></div>
<div class="panel"><h2>Summary (rlpipe inspect)</h2><pre>{text}</pre></div>
<p class="note">Written by rlpipe inspect --html at {made}. This file loads nothing: its data,
charts and styles are all inside it.</p>
<script type="application/json" id="data">{data}</script>
<script>
{script}
</script>
<script>
{render}
</script>
</body>
</html>
"""

_RENDER = """
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
const n = RlCharts.number;

function quantile(sorted, q) {
  const i = (sorted.length - 1) * q, lo = Math.floor(i), hi = Math.ceil(i);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (i - lo);
}

function spread(values) {
  const s = values.slice().sort((a, b) => a - b);
  return [quantile(s, 0.1), quantile(s, 0.5), quantile(s, 0.9)];
}

function health() {
  const h = DATA.report.health;
  const problems = h.uncommitted.map((f) => `uncommitted file ${f}`)
    .concat(h.pending_log.map((f) => `pending log segment ${f}`))
    .concat(h.damaged.map((d) => `unreadable file ${d.file}: ${d.problem}`));
  const box = $("health");
  if (!problems.length) {
    box.innerHTML = '<span class="ok">ok</span>: every file is committed and readable, ' +
      "no log segment is pending.";
    return;
  }
  const title = document.createElement("div");
  title.className = "bad";
  title.textContent = `${problems.length} problems`;
  const list = document.createElement("ul");
  for (const p of problems) list.appendChild(document.createElement("li")).textContent = p;
  box.replaceChildren(title, list);
}

function returns() {
  const e = DATA.episodes;
  const bins = [], width = e.length ? Math.max(1, Math.ceil(e.length / 20)) : 1;
  for (let i = 0; i < e.length; i += width) {
    const group = e.slice(i, i + width);
    const [p10, p50, p90] = spread(group.map((r) => r[1]));
    bins.push([i + group.length / 2, p10, p50, p90]);
  }
  RlCharts.line($("returns-time"), [
    { label: "episode", color: "#93c5fd", dots: true, points: e.map((r, i) => [i + 1, r[1]]) },
    { label: "median", color: "#1d4ed8", points: bins.map((b) => [b[0], b[2]]),
      band: bins.map((b) => [b[0], b[1], b[3]]) },
  ], { xlabel: "episode, in the order they ended", empty: "no ended episodes" });
  const byVersion = new Map();
  for (const r of e) if (r[3] !== null) {
    if (!byVersion.has(r[3])) byVersion.set(r[3], []);
    byVersion.get(r[3]).push(r[1]);
  }
  const versions = [...byVersion.keys()].sort((a, b) => a - b);
  const figures = versions.map((v) => [v, ...spread(byVersion.get(v))]);
  RlCharts.line($("returns-version"), [{ label: "median", dots: true,
    points: figures.map((f) => [f[0], f[2]]),
    band: figures.length > 1 ? figures.map((f) => [f[0], f[1], f[3]]) : [] }],
  { xlabel: "policy version", integer: true, empty: e.length
    ? "every episode was played at random (no policy version)" : "no ended episodes" });
}

function histogram(values, bins) {
  if (!values.length) return [[], []];
  const lo = Math.min(...values), hi = Math.max(...values);
  const width = Math.max(1, Math.ceil((hi - lo + 1) / bins));
  const counts = new Array(Math.floor((hi - lo) / width) + 1).fill(0);
  for (const v of values) counts[Math.floor((v - lo) / width)] += 1;
  return [counts.map((_, i) => lo + i * width), counts];
}

function lengths() {
  const [labels, counts] = histogram(DATA.episodes.map((r) => r[2]), 30);
  RlCharts.bars($("lengths"), labels, counts, { ylabel: "episodes", xlabel: "length (steps)",
    empty: "no ended episodes" });
}

function actions() {
  const a = DATA.actions, box = $("actions");
  if (a.kind === "counts") {
    RlCharts.bars(box, a.labels, a.counts, { ylabel: "steps", xlabel: "action" });
  } else if (a.kind === "histograms") {
    box.replaceChildren();
    a.dims.forEach((d, i) => {
      const part = box.appendChild(document.createElement("div"));
      RlCharts.bars(part, d.edges.slice(0, -1).map(n), d.counts,
        { ylabel: "steps", xlabel: `action dimension ${i}` });
    });
    if (a.of > a.dims.length) box.appendChild(document.createElement("p")).textContent =
      `the first ${a.dims.length} of ${a.of} dimensions`;
  } else {
    box.textContent = "no steps";
  }
}

function observations() {
  const o = DATA.observations, box = $("observations");
  if (!o.dims.length) { box.textContent = "no steps"; return; }
  const table = document.createElement("table");
  const head = table.createTHead().insertRow();
  for (const h of ["dim", "space low", "min", "p10", "median", "p90", "max", "space high",
    "rows outside"]) head.appendChild(document.createElement("th")).textContent = h;
  const body = table.createTBody();
  for (const d of o.dims) {
    const row = body.insertRow();
    const q = d.quantiles;
    for (const v of [d.dim, d.low ?? "–", ...q, d.high ?? "–", d.outside]) {
      row.insertCell().textContent = typeof v === "number" ? n(v) : v;
    }
    if (d.outside) row.lastChild.className = "bad";
  }
  box.replaceChildren(table);
  const notes = [];
  if (o.of > o.dims.length) notes.push(`the first ${o.dims.length} of ${o.of} dimensions`);
  if (DATA.sampled < DATA.report.rows)
    notes.push(`observations and actions of the first ${DATA.sampled.toLocaleString()} of ` +
      `${DATA.report.rows.toLocaleString()} rows`);
  if (notes.length) box.appendChild(document.createElement("p")).textContent = notes.join("; ");
}

health(); returns(); lengths(); actions(); observations();
"""
_PAGE = _PAGE.replace("{render}", _RENDER.replace("{", "{{").replace("}", "}}"))

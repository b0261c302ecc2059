"""``rlpipe inspect DIR [--json] [--plot FILE.png] [--html REPORT.html]``: what a dataset holds,
and what is wrong (``--html``: the same as one self-contained page with charts,
:mod:`pipeline.commands.report`).

The report is built from the tables' Delta snapshots and their files (a few narrow columns), so it
works on a dataset that is being written, on one whose writer died, and on one copied from
elsewhere. "Unhealthy" means something a reader would not see or would trip over: files in a
table's directory that no commit names (a writer is mid-commit, or died between writing and
committing; recovery commits them), shards that cannot be read, and write-ahead-log segments not
yet committed (acknowledged rows that only a live writer or the next one's recovery turns into
shards).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.commands.storage_options import add_storage_options, storage_options
from pipeline.errors import RlpipeError

if TYPE_CHECKING:
    from pipeline.dataset.location import Location

_STEP_COLUMNS = [
    "episode_id",
    "agent_id",
    "client_id",
    "policy_version",
    "logged_at",
    "reward",
    "terminated",
    "truncated",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="summarize a dataset and report anything unhealthy",
        description="Shards, rows, episodes, clients, agents, policy versions, dates, returns, "
        "schema and spaces of a dataset, and any uncommitted, unreadable or pending files.",
    )
    parser.add_argument("dir", metavar="DIR", help="the dataset directory (or URI)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--plot", metavar="FILE.png", help="write return over time and episode lengths to a PNG"
    )
    parser.add_argument(
        "--html",
        metavar="REPORT.html",
        help="also write a self-contained HTML report (charts of returns, lengths, actions, "
        "observation ranges, and the health findings) that can be mailed or attached",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="first move damaged files into DIR/_quarantine/ and list the steps and episodes "
        "lost with them, so readers can go on with the rest",
    )
    add_storage_options(parser)
    parser.set_defaults(command_module=__name__)


def run(args: argparse.Namespace) -> int:
    from pipeline.commands.report import text_report
    from pipeline.dataset.location import locate

    dataset = locate(args.dir, storage_options("inspect", args.storage_option))
    if args.repair:
        from pipeline.dataset.quarantine import format_repair, repair

        repaired = repair(dataset)
        print(json.dumps(repaired, indent=2) if args.json else format_repair(repaired))
    report = inspect_dataset(dataset, plot=args.plot, html=args.html)
    print(json.dumps(report, indent=2) if args.json else text_report(report))
    return 0


def inspect_dataset(
    path: str | Path | Location, plot: str | Path | None = None, html: str | Path | None = None
) -> dict[str, Any]:
    """The whole report as plain JSON-ready data; with ``plot``, also the PNG of
    :func:`plot_episodes`, and with ``html`` the page of :mod:`pipeline.commands.report`."""
    from pipeline.dataset.location import locate
    from pipeline.format import layout
    from pipeline.format.manifest import read_manifest

    location = locate(path)
    manifest = read_manifest(location)
    filesystem, root = location.filesystem, location.root
    health = _health(location, manifest)
    bad = set(health["unreadable"])
    steps = _table_files(location, layout.STEPS, bad)
    episodes = _table_files(location, layout.EPISODES, bad)
    step_rows = _read(filesystem, root, steps, layout.STEPS, _STEP_COLUMNS, manifest)
    episode_columns = ["episode_id", "ended_at", "length", "return", "end_reason"]
    episode_rows = _read(filesystem, root, episodes, layout.EPISODES, episode_columns, manifest)
    returns, lengths, source = _curve(step_rows, episode_rows)
    report = {
        "path": root,
        "format_version": manifest.format_version,
        "created_at": manifest.created_at,
        "env_id": manifest.env_id,
        "spaces": {
            "observation": str(manifest.observation_space),
            "action": str(manifest.action_space),
        },
        "schema": _schema(manifest),
        "shards": {"steps": len(steps), "episodes": len(episodes)},
        "bytes": sum(int(filesystem.get_file_info(p).size or 0) for p in steps + episodes),
        **_step_stats(step_rows),
        "episodes_table": _episode_summary(episode_rows),
        "returns": {"source": source, **_describe(returns)},
        "lengths": {"source": source, **_describe(lengths)},
        "health": health,
    }
    if plot:
        report["plot"] = str(plot_episodes(returns, lengths, plot).resolve())
    if html:
        report["html"] = str(
            _html(report, location, manifest, steps, step_rows, episode_rows, html)
        )
    return report


def _html(
    report: dict[str, Any],
    location: Any,
    manifest: Any,
    paths: list[str],
    steps: Any,
    episodes: Any,
    out: str | Path,
) -> Path:
    """The HTML report, with the observations and actions of the first rows."""
    from pipeline.commands.report import sample_rows, text_report, write_report
    from pipeline.dataset import discovery
    from pipeline.dataset.storage_types import restore
    from pipeline.format import layout, schema

    spaces = manifest.observation_space, manifest.action_space
    step_schema = schema.step_schema(*spaces)
    columns = ["observation", "action"]
    if paths:
        dataset = discovery.open_dataset(
            location.filesystem, location.root, paths, step_schema, layout.STEPS
        )
        stored = dataset.head(sample_rows(spaces[0]), columns=columns)
        sample = restore(stored, step_schema)  # frames are stored as bytes, say
    else:
        sample = step_schema.empty_table().select(columns)
    tables = (steps, episodes, sample)
    return write_report(report, text_report(report), spaces, tables, out).resolve()


def plot_episodes(returns: list[float], lengths: list[int], out: str | Path) -> Path:
    """A PNG of episode return in the order episodes ended, and a histogram of their lengths.

    Raises:
        RlpipeError: when matplotlib is not installed (it is an optional extra).
    """
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:
        raise RlpipeError("--plot needs matplotlib: pip install matplotlib") from None
    figure = Figure(figsize=(10, 4), dpi=100)
    left, right = figure.subplots(1, 2)
    left.plot(range(1, len(returns) + 1), returns, ".", alpha=0.4, label="episode")
    window = max(1, len(returns) // 20)
    smooth = [
        sum(returns[max(0, i - window + 1) : i + 1]) / min(window, i + 1)
        for i in range(len(returns))
    ]
    left.plot(range(1, len(returns) + 1), smooth, "-", label=f"mean of {window}")
    left.set(xlabel="episode (in order of ending)", ylabel="return", title="Return over time")
    left.legend(loc="best")
    right.hist(lengths, bins=min(30, max(1, len(set(lengths)))))
    right.set(xlabel="episode length (steps)", ylabel="episodes", title="Episode lengths")
    figure.tight_layout()
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target, format="png")
    return target


def _curve(steps: Any, rows: Any) -> tuple[list[float], list[int], str]:
    """From the episodes table when it has rows; otherwise (datasets written without one) summed
    from the step table's complete episodes."""
    if rows.num_rows:
        rows = rows.sort_by([("ended_at", "ascending")])
        return rows.column("return").to_pylist(), rows.column("length").to_pylist(), "episodes"
    grouped = complete_episodes(steps).sort_by([("logged_at_max", "ascending")])
    return (
        grouped.column("reward_sum").to_pylist(),
        grouped.column("reward_count").to_pylist(),
        "steps",
    )


def _health(location: Any, manifest: Any) -> dict[str, list[Any]]:
    import pyarrow.fs as pafs

    from pipeline.dataset import discovery
    from pipeline.dataset.quarantine import find_damaged
    from pipeline.dataset.recovery import pending_segments
    from pipeline.dataset.upkeep import removed_paths
    from pipeline.format import layout

    filesystem, root = location.filesystem, location.root
    uncommitted: list[str] = []
    for table in layout.TABLES:
        committed = set(discovery.list_shards(location, table))
        committed |= {location.path(table, p) for p in removed_paths(location, table)}
        selector = pafs.FileSelector(f"{root}/{table}", recursive=True, allow_not_found=True)
        for info in filesystem.get_file_info(selector):
            relative = info.path[len(root) + 1 :]
            if info.type != pafs.FileType.File or "/_delta_log/" in f"/{relative}":
                continue
            if info.path not in committed:
                uncommitted.append(relative)
    top = filesystem.get_file_info(pafs.FileSelector(root))
    uncommitted += [i.base_name for i in top if i.base_name.startswith(".")]
    state = location.state_dir
    pending = [str(p.relative_to(state)) for p in pending_segments(location)]
    damaged = find_damaged(location, manifest)
    return {
        "uncommitted": sorted(uncommitted),
        "unreadable": sorted(d["file"] for d in damaged if d["file"].endswith(".parquet")),
        "pending_log": pending,
        "damaged": [{"file": d["file"], "problem": d["problem"]} for d in damaged],
    }


def _table_files(location: Any, table: str, bad: set[str]) -> list[str]:
    from pipeline.dataset import discovery

    paths = discovery.list_shards(location, table)
    return [p for p in paths if p[len(location.root) + 1 :] not in bad]


def _read(
    filesystem: Any, root: str, paths: list[str], table: str, columns: list[str], manifest: Any
) -> Any:
    """The columns of a table's shards (none: an empty table), ids decoded to plain strings."""
    import pyarrow as pa

    from pipeline.dataset import discovery
    from pipeline.format import layout, schema

    if table == layout.STEPS:
        table_schema = schema.step_schema(manifest.observation_space, manifest.action_space)
    else:
        table_schema = schema.EPISODE_SCHEMA
    if paths:
        dataset = discovery.open_dataset(filesystem, root, paths, table_schema, table)
        data = dataset.to_table(columns=columns)
    else:
        data = table_schema.empty_table().select(columns)
    for index, field in enumerate(data.schema):
        if pa.types.is_dictionary(field.type):
            data = data.set_column(index, field.name, data.column(index).cast(pa.string()))
    return data


def _step_stats(steps: Any) -> dict[str, Any]:
    import pyarrow.compute as pc

    complete = complete_episodes(steps).num_rows
    everything = steps.group_by(["episode_id", "agent_id"]).aggregate([]).num_rows
    versions = pc.unique(steps.column("policy_version").drop_null()).to_pylist()
    first, last = pc.min_max(steps.column("logged_at")).values()
    return {
        "rows": steps.num_rows,
        "episodes": {"complete": complete, "incomplete": everything - complete},
        "clients": sorted(pc.unique(steps.column("client_id")).to_pylist()),
        "agents": sorted(pc.unique(steps.column("agent_id")).to_pylist()),
        "policy_versions": sorted(versions),
        "date_range": {"first": _iso(first.as_py()), "last": _iso(last.as_py())},
    }


def complete_episodes(steps: Any) -> Any:
    """One row per (episode, agent) that has its ending row: reward sum and count, last time."""
    import pyarrow.compute as pc

    ended = pc.or_(steps.column("terminated"), steps.column("truncated"))
    grouped = steps.append_column("ended", ended).group_by(["episode_id", "agent_id"])
    totals = grouped.aggregate(
        [("reward", "sum"), ("reward", "count"), ("logged_at", "max"), ("ended", "any")]
    )
    return totals.filter(totals.column("ended_any"))


def _episode_summary(rows: Any) -> dict[str, Any]:
    reasons = rows.column("end_reason").value_counts().to_pylist()
    return {
        "rows": rows.num_rows,
        "end_reasons": {item["values"]: item["counts"] for item in reasons},
    }


def _describe(values: Sequence[float]) -> dict[str, Any]:
    """Count, mean, standard deviation and range. The values are scaled by a power of two (an
    exact scaling) where their sum or squares could pass a double's range: returns of 1e200 are
    finite, and stored, but their squares are not."""
    if not values:
        return {"count": 0, "mean": None, "std": None, "min": None, "max": None}
    top = max(map(abs, values))
    exponent = math.frexp(top)[1] if top > 2.0**500 else 0
    scaled = [math.ldexp(v, -exponent) for v in values] if exponent else values
    mean = math.fsum(scaled) / len(scaled)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in scaled) / len(scaled))
    return {
        "count": len(values),
        "mean": math.ldexp(mean, exponent),  # within the values' range
        "std": _ldexp_or_inf(std, exponent),  # up to twice their largest: may pass a double's
        "min": min(values),
        "max": max(values),
    }


def _ldexp_or_inf(value: float, exponent: int) -> float:
    try:
        return math.ldexp(value, exponent)
    except OverflowError:
        return math.inf


def _schema(manifest: Any) -> list[str]:
    from pipeline.format import schema

    step = schema.step_schema(manifest.observation_space, manifest.action_space)
    return [f"{field.name}: {field.type}" for field in step]


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None

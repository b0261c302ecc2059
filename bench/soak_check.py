"""The soak's final checks and report (``bench/soak.py``), on a dataset whose server has stopped
cleanly.

- Every file under the dataset that readers look at is read whole: each Parquet file to its last
  row (data files, whether or not a commit names them, so an orphan counts too), each line of the
  tables' Delta logs, each checkpoint loaded, the manifest parsed. Files under a dot-name (a
  write a kill cut short) and log segments still there after a clean stop are listed apart, as
  stray: readers skip them, but they should not be left.
- The step table's keys ``(episode_id, agent_id, t)``, over every stored row: a key stored twice
  is a duplicate; an acknowledged key not stored is a lost step. Stored rows are those of every
  data file but the ones a commit removed: a compaction's merged files hold the rows of the
  files it removed, which stay on disk until a vacuum, and no reader of the table reads them.
  An orphan (a file no commit names) counts.
- ``InputReader`` reads the whole step table, and must see every stored row.
- ``rlpipe inspect DIR --json`` reports its own findings.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["episode_id", "agent_id", "t"]
BARS = {"lost_acknowledged_steps": 0, "duplicated_steps": 0, "unreadable_files": 0}
RSS_BAR, KILLS_BAR = 0.10, 10
# Server memory, per lifetime: warm-up lasts until 20% into the run and 20 s into the lifetime
# (a fresh server's RSS rose by ~15-25% in its first 10-20 s of load here, as the policy, the
# writer's buffers and the threads' arenas filled; and clients start slowly on a loaded
# machine); a lifetime is measured when it lasted 30 s more. Each end is the median of 5 s of
# samples, so one request's transient buffers do not decide it.
WARMUP_RUN, WARMUP_S, MIN_SPAN_S, WINDOW_S = 0.2, 20.0, 30.0, 5.0
Samples = list[tuple[float, int]]  # (seconds on the run's clock, RSS in kB)
_KEY_SCHEMA = pa.schema([("episode_id", pa.string()), ("agent_id", pa.string()), ("t", pa.int64())])
_EPISODE_KEY_SCHEMA = pa.schema([("episode_id", pa.string()), ("agent_id", pa.string())])


def check(data: Path, ack_files: list[Path]) -> dict[str, Any]:
    """Every figure of the final check; lists of names under ``*_names``."""
    files = _files(data)
    seen = [p for p in files if not _stray(p, data)]  # what readers look at
    stored, episodes, unreadable = _read_tables(seen, _removed(data))
    acked = _acks(ack_files)
    distinct = stored.group_by(KEYS).aggregate([("t", "count")])
    duplicated = int(pc.sum(pc.subtract(distinct["t_count"], 1)).as_py() or 0)
    lost = acked.join(distinct.select(KEYS), keys=KEYS, join_type="left anti")
    repeats = acked.num_rows - acked.group_by(KEYS).aggregate([]).num_rows
    ep_distinct = episodes.group_by(["episode_id", "agent_id"]).aggregate([]).num_rows
    return {
        "lost_acknowledged_steps": lost.num_rows,
        "lost_examples": [" ".join(map(str, row.values())) for row in lost.slice(0, 5).to_pylist()],
        "duplicated_steps": duplicated,
        "unreadable_files": len(unreadable),
        "unreadable_names": unreadable,
        "stored_steps": stored.num_rows,
        "acknowledged_steps": acked.num_rows,
        "acknowledged_repeats": repeats,
        "episode_rows": episodes.num_rows,
        "duplicated_episode_rows": episodes.num_rows - ep_distinct,
        "stray_files": [str(p.relative_to(data)) for p in files if _stray(p, data)],
        "reader_rows": _reader_rows(data),
        "inspect": _inspect(data),
    }


def _files(data: Path) -> list[Path]:
    return sorted(p for p in data.rglob("*") if p.is_file())


def _stray(path: Path, data: Path) -> bool:
    """A file a cut-short write left: a dot-name, or a log segment (after a clean stop)."""
    parts = path.relative_to(data).parts
    return any(part.startswith(".") for part in parts) or (
        parts[0] == "_wal" and path.suffix in (".arrows", ".rows")
    )


def _removed(data: Path) -> set[Path]:
    """The data files a commit of their table removed (a compaction's)."""
    from pipeline.dataset.location import locate
    from pipeline.dataset.upkeep import removed_paths
    from pipeline.format import layout

    location = locate(data)
    return {
        data / table / path for table in layout.TABLES for path in removed_paths(location, table)
    }


def _read_tables(files: list[Path], removed: set[Path]) -> tuple[pa.Table, pa.Table, list[str]]:
    """The step and episode shards' rows (readable shards a commit has not removed), and every
    unreadable file."""
    from pipeline.policy.checkpoint import load_checkpoint

    tables: dict[str, list[pa.Table]] = {"steps": [], "episodes": []}
    unreadable = []
    for path in files:
        try:
            if "_delta_log" in path.parts:  # a table's Delta log: JSON lines, checkpoints
                _read_log_file(path)
            elif path.suffix == ".parquet":
                table = pq.read_table(path)  # every column of every row group, decoded
                if path not in removed:
                    tables.setdefault(path.parents[1].name, []).append(table)  # steps/date=.../
            elif path.suffix == ".npz":
                load_checkpoint(path)
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except Exception as error:  # any failure to read is the finding
            unreadable.append(f"{path}: {type(error).__name__}: {error}"[:300])
    steps = _concat(tables["steps"], _KEY_SCHEMA)
    return steps, _concat(tables["episodes"], _EPISODE_KEY_SCHEMA), unreadable


def _read_log_file(path: Path) -> None:
    """A Delta log file read whole: a commit's JSON actions, a checkpoint's rows, the pointer."""
    if path.suffix == ".parquet":
        pq.read_table(path)
    elif path.suffix == ".json":
        for line in path.read_text().splitlines():
            json.loads(line)
    elif path.name == "_last_checkpoint":
        json.loads(path.read_text())


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    if not tables:
        return schema.empty_table()
    return pa.concat_tables([_plain(t.select(schema.names)) for t in tables])


def _plain(table: pa.Table) -> pa.Table:
    """Keys as plain string and int64 columns, whatever encoding the shard used."""
    out = {}
    for name in table.column_names:
        column = table[name]
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        out[name] = column.cast(pa.int64() if name == "t" else pa.string())
    return pa.table(out)


def _acks(files: list[Path]) -> pa.Table:
    options = pacsv.ReadOptions(column_names=KEYS)
    parse = pacsv.ParseOptions(delimiter=" ")
    types = pacsv.ConvertOptions(column_types=dict(zip(KEYS, _KEY_SCHEMA.types, strict=True)))
    tables = [
        pacsv.read_csv(path, options, parse, types)
        for path in files
        if path.exists() and path.stat().st_size
    ]
    return pa.concat_tables(tables) if tables else _KEY_SCHEMA.empty_table()


def _reader_rows(data: Path) -> int | None:
    from pipeline.dataset.reader import InputReader

    try:
        reader = InputReader(data, columns=("episode_id", "t"), batch_size=1 << 16)
        return sum(len(batch) for batch in reader)
    except Exception as error:
        print(f"InputReader failed on {data}: {type(error).__name__}: {error}")
        return None


def _inspect(data: Path) -> dict[str, Any]:
    """``rlpipe inspect --json``'s health findings and row count (or why it failed)."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "inspect", str(data), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        return {"failed": done.returncode, "stderr": done.stderr[-1000:]}
    report = json.loads(done.stdout)
    health = report["health"]
    return {
        "rows": report["rows"],
        "problems": sum(len(v) for v in health.values()),
        "health": {k: v[:5] for k, v in health.items()},
    }


@dataclass
class Run:
    """What the soak did, as :func:`summarize` reports it."""

    minutes: float
    kill_every: tuple[float, float]
    counts: Counter[str]
    results: dict[str, dict[str, Any]]  # each client's own JSON line, by name
    lifetimes: list[tuple[float, Samples]]  # per server lifetime: its start and RSS samples
    server_stop: tuple[int | None, float]  # exit status and seconds of the final SIGTERM
    server_restart_s: list[float]  # from the killed tree gone until health answered again


def rss_growth(lifetimes: list[tuple[float, Samples]], run_s: float) -> list[tuple[float, float]]:
    """(span in seconds, relative growth) of each server lifetime long enough to measure."""
    out = []
    for start, samples in lifetimes:
        warm_at = max(start + WARMUP_S, WARMUP_RUN * run_s)
        if not samples or samples[-1][0] < warm_at + MIN_SPAN_S:
            continue
        last = samples[-1][0]
        warm = [kb for s, kb in samples if warm_at <= s < warm_at + WINDOW_S]
        end = [kb for s, kb in samples if s > last - WINDOW_S]
        if warm:
            growth = statistics.median(end) / statistics.median(warm) - 1.0
            out.append((last - warm_at, growth))
    return out


def summarize(run: Run, found: dict[str, Any]) -> dict[str, Any]:
    """The figures of the JSON line, printed with what they mean."""
    counts, results = run.counts, run.results
    errors = Counter[str]()
    for result in results.values():
        errors.update(result.get("errors", {}))
    kills = counts["server_kills"] + counts["trainer_kills"]
    _print_run(run, kills, errors)
    growth = rss_growth(run.lifetimes, run.minutes * 60)
    worst = max((g for _, g in growth), default=None)
    _print_checks(found, kills, growth, worst, len(run.lifetimes))
    return {
        **{key: found[key] for key in BARS},
        "server_rss_growth": worst,
        "kills": kills,
        "server_kills": counts["server_kills"],
        "trainer_kills": counts["trainer_kills"],
        "restarts": counts["server_restarts"] + counts["trainer_restarts"],
        "unexpected_exits": counts["server_exits"]
        + counts["trainer_exits"]
        + counts["client_exits"],
        "acknowledged_steps": found["acknowledged_steps"],
        "stored_steps": found["stored_steps"],
        "episodes": sum(r.get("episodes", 0) for r in results.values()),
        "client_errors": sum(errors.values()),
        "local_undelivered_steps": sum(r.get("undelivered", 0) for r in results.values()),
        "duplicated_episode_rows": found["duplicated_episode_rows"],
        "stray_files": len(found["stray_files"]),
        "inspect_problems": found["inspect"].get("problems"),
        "server_stop_s": run.server_stop[1],
        "server_restart_s_max": max(run.server_restart_s, default=None),
        "rss_lifetimes_measured": len(growth),
        "minutes": run.minutes,
    }


def _print_run(run: Run, kills: int, errors: Counter[str]) -> None:
    counts = run.counts
    low, high = run.kill_every
    print(
        f"soak: {run.minutes:g} min, a kill every {low:g}-{high:g} s: {kills} kills "
        f"({counts['server_kills']} server, {counts['trainer_kills']} trainer), "
        f"{counts['server_restarts'] + counts['trainer_restarts']} restarts; exits not by a "
        f"kill: server {counts['server_exits']}, trainer {counts['trainer_exits']}, clients "
        f"{counts['client_exits']}"
    )
    for name, result in sorted(run.results.items()):
        extra = "".join(f"; {k} {result[k]}" for k in ("undelivered", "flushes") if k in result)
        print(
            f"  {name}: {result.get('acked', 0):,} steps acknowledged in "
            f"{result.get('episodes', 0):,} episodes; errors {result.get('errors', {})}{extra}"
        )
    print(f"client errors by kind: {dict(errors) or 'none'}")
    code, seconds = run.server_stop
    print(f"server stop (SIGTERM): exit {code} after {seconds:.1f} s")
    if run.server_restart_s:
        print(
            f"server restarts (start until health answers): "
            f"{min(run.server_restart_s):.1f}-{max(run.server_restart_s):.1f} s"
        )


def _print_checks(
    found: dict[str, Any],
    kills: int,
    growth: list[tuple[float, float]],
    worst: float | None,
    lifetimes: int,
) -> None:
    acked, stored = found["acknowledged_steps"], found["stored_steps"]
    print(
        f"lost_acknowledged_steps: {found['lost_acknowledged_steps']:,} of {acked:,} "
        f"acknowledged (bar: 0) {found['lost_examples'] or ''}"
    )
    print(
        f"duplicated_steps: {found['duplicated_steps']:,} of {stored:,} stored rows (bar: 0); "
        f"InputReader read {found['reader_rows']} rows; duplicated episodes-table rows "
        f"{found['duplicated_episode_rows']} of {found['episode_rows']:,}"
    )
    print(f"unreadable_files: {found['unreadable_files']} (bar: 0) {found['unreadable_names']}")
    print(f"stray files (dot-names, log segments after a clean stop): {found['stray_files'][:10]}")
    print(f"rlpipe inspect: {found['inspect']}")
    spans = ", ".join(f"{g:+.1%} over {s:.0f} s" for s, g in growth) or "none"
    verdict = (
        "not measured (no server lifetime lasted long enough)"
        if worst is None
        else f"{worst:.3f} ({worst / RSS_BAR:.2f}x the bar)"
    )
    print(
        f"server_rss_growth: {verdict}; bar <= {RSS_BAR}; the largest over server lifetimes, "
        f"each from a warm-up ({WARMUP_RUN:.0%} into the run and {WARMUP_S:g} s into the "
        f"lifetime) to its end, if {MIN_SPAN_S:g} s or more: {spans} ({lifetimes} lifetimes "
        "in all)"
    )
    print(f"kills: {kills} ({kills / KILLS_BAR:.2f}x the bar of {KILLS_BAR})")
    if acked == 0:
        print("WARNING: no step was acknowledged: the soak checked nothing")

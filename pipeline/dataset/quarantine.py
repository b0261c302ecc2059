"""Quarantine: damaged files moved aside, with what was lost, so readers go on with the rest.

``DIR/_quarantine/<stamp>/`` holds each damaged file at its path relative to ``DIR`` and a
``report.json`` naming, for each, what is wrong and which rows went with it. Readers never look
there, and nothing in it is deleted by rlpipe. ``recover`` moves damaged log segments there on its
own (after committing their sound records); :func:`repair` (``rlpipe inspect --repair``) moves
damaged shards and a damaged manifest, then commits the shards' removal from their Delta table
(Delta's FSCK), so readers go on without them. Repair works on a local dataset.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.dataset import discovery
from pipeline.dataset.damage import READ_ERRORS, shard_problem
from pipeline.dataset.delta import Table
from pipeline.dataset.location import Location, locate
from pipeline.dataset.recovery import pending_segments, recover
from pipeline.dataset.wal import fsync_path
from pipeline.errors import DamagedFileError, DatasetError, FormatVersionError
from pipeline.format import layout, schema
from pipeline.format.manifest import Manifest, open_manifest, read_manifest

REPORT = "report.json"


class Quarantine:
    """One run's quarantine folder, made on the first file moved into it."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.folder: Path | None = None
        self.entries: list[dict[str, Any]] = []

    def move(self, path: Path, problem: str, lost: dict[str, Any]) -> dict[str, Any]:
        """Move ``path`` into the folder and record it; returns its report entry."""
        if self.folder is None:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            self.folder = self.root / layout.QUARANTINE / f"{stamp}-{secrets.token_hex(3)}"
        relative = path.relative_to(self.root)
        target = self.folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(path, target)
        fsync_path(target.parent)
        fsync_path(path.parent)
        entry = {
            "file": str(relative),
            "problem": problem,
            "moved_to": str(target.relative_to(self.root)),
            "lost": lost,
        }
        self.entries.append(entry)
        _write_json(self.folder / REPORT, {"quarantined": self.entries})
        return entry


def repair(path: str | Path | Location) -> dict[str, Any]:
    """Move a dataset's damaged files into quarantine and say what was lost with them.

    The manifest, if damaged, is rebuilt from the spaces every step shard records; damaged
    shards are moved aside whole; dead writers' logs are recovered, damaged segments moved
    aside by ``recover``. Then episodes the episodes table says are longer than the steps that
    remain are listed with the steps they miss.

    Raises:
        DatasetError: no manifest and no sound step shard to rebuild it from.
    """
    location = locate(path)
    if not location.local:
        raise DatasetError(f"{location.uri}: --repair works on a local dataset; copy it here first")
    root = location.root
    quarantine = Quarantine(root)
    manifest = _repair_manifest(root, quarantine)
    recovered = [item for item in recover(location) if item.problems]
    moved = set()
    for found in find_damaged(location, manifest):
        shard = Path(root, found["file"])
        if shard.suffix == ".parquet":  # segments of live writers stay theirs
            quarantine.move(shard, found["problem"], shard_loss(str(shard), found["table"]))
            moved.add(found["table"])
    for table in sorted(moved):
        Table(location, table).forget_missing()
    step_schema = schema.step_schema(manifest.observation_space, manifest.action_space)
    return {
        "path": root,
        "quarantined": quarantine.entries + [entry for item in recovered for entry in item.entries],
        "folder": str(quarantine.folder) if quarantine.folder else None,
        "episodes_missing_steps": missing_steps(location, step_schema),
    }


def find_damaged(location: Location, manifest: Manifest) -> list[dict[str, str]]:
    """Every damaged shard (read whole, page checksums checked) and log segment of a dataset:
    its path relative to the dataset (a segment's: to its state directory), its table, and
    what is wrong."""
    filesystem, root = location.filesystem, location.root
    step_schema = schema.step_schema(manifest.observation_space, manifest.action_space)
    found = []
    for table, table_schema in (
        (layout.STEPS, step_schema),
        (layout.EPISODES, schema.EPISODE_SCHEMA),
    ):
        for shard in discovery.list_shards(location, table):
            problem = shard_problem(filesystem, shard, table_schema)
            if problem is not None:
                found.append({"file": shard[len(root) + 1 :], "table": table, "problem": problem})
    if location.state_dir.is_dir():
        for segment in pending_segments(location):
            problem = _segment_problem(segment)
            if problem is not None:
                found.append(
                    {
                        "file": str(segment.relative_to(location.state_dir)),
                        "table": segment.name.split("-")[0],
                        "problem": problem,
                    }
                )
    return found


def _segment_problem(segment: Path) -> str | None:
    from pipeline.dataset import rowlog
    from pipeline.dataset.wal import read_segment

    try:
        found = rowlog.read_rows(segment) if segment.suffix == ".rows" else read_segment(segment)
    except DatasetError as error:
        return str(error)
    return "; ".join(found.problems) or None


def shard_loss(path: str, table: str) -> dict[str, Any]:
    """The rows of a damaged shard, as far as they can be known: the episodes and ``t`` ranges of
    each row group whose id columns still read (their pages pass their checksums), and the count
    of the others' rows from the footer."""
    keys = ["episode_id", "agent_id"] + (["t"] if table == layout.STEPS else [])
    try:
        file = pq.ParquetFile(path, page_checksum_verification=True)
    except READ_ERRORS:
        return {
            "rows": None,
            "episodes": [],
            "unknown": "the footer cannot be read: which rows "
            "and how many cannot be known from this file",
        }
    episodes: list[dict[str, Any]] = []
    unknown = []
    for index in range(file.num_row_groups):
        try:
            rows = file.read_row_group(index, columns=keys)
        except READ_ERRORS:
            count = file.metadata.row_group(index).num_rows
            unknown.append(f"row group {index}: {count} rows whose ids cannot be read")
            continue
        episodes += _episode_ranges(rows, table)
    return {"rows": file.metadata.num_rows, "episodes": episodes, "unknown": "; ".join(unknown)}


def _episode_ranges(rows: pa.Table, table: str) -> list[dict[str, Any]]:
    if table != layout.STEPS:
        return rows.select(["episode_id", "agent_id"]).to_pylist()
    grouped = rows.group_by(["episode_id", "agent_id"]).aggregate(
        [("t", "min"), ("t", "max"), ("t", "count")]
    )
    return [
        {
            "episode_id": row["episode_id"],
            "agent_id": row["agent_id"],
            "t": [row["t_min"], row["t_max"]],
            "rows": row["t_count"],
        }
        for row in grouped.to_pylist()
    ]


def missing_steps(location: Location, step_schema: pa.Schema) -> list[dict[str, Any]]:
    """Episodes the episodes table records as longer than the step rows that remain of them,
    with the ``t`` ranges missing (episodes without a summary row cannot be checked so)."""
    summaries = discovery.committed(location, layout.EPISODES, schema.EPISODE_SCHEMA)
    if summaries is None:
        return []
    ended = summaries.to_table(columns=["episode_id", "agent_id", "length"])
    steps = discovery.committed(location, layout.STEPS, step_schema)
    stored: dict[tuple[str, str], set[int]] = {}
    if steps is not None:  # ids are read as dictionaries, which to_pylist decodes
        rows = steps.to_table(columns=["episode_id", "agent_id", "t"])
        for episode, agent, t in zip(*(rows.column(i).to_pylist() for i in range(3)), strict=True):
            stored.setdefault((episode, agent), set()).add(t)
    found = []
    for row in ended.to_pylist():
        have = stored.get((row["episode_id"], row["agent_id"]), set())
        gaps = _ranges(sorted(set(range(row["length"])) - have))
        if gaps:
            found.append({**row, "missing_t": gaps})
    return found


def _ranges(values: list[int]) -> list[list[int]]:
    ranges: list[list[int]] = []
    for value in values:
        if ranges and ranges[-1][1] == value - 1:
            ranges[-1][1] = value
        else:
            ranges.append([value, value])
    return ranges


def _repair_manifest(root: str, quarantine: Quarantine) -> Manifest:
    try:
        return read_manifest(root)
    except FormatVersionError:
        raise
    except DamagedFileError as error:
        problem = error.problem
    rebuilt = _manifest_from_shards(root)
    quarantine.move(
        Path(root) / layout.MANIFEST,
        problem,
        {
            "rows": 0,
            "episodes": [],
            "unknown": "no rows: the manifest was rebuilt from the "
            "spaces the step shards record; env_id and created_at are not in them (null, now)",
        },
    )
    return open_manifest(
        locate(root), rebuilt.observation_space, rebuilt.action_space, rebuilt.env_id
    )


def _manifest_from_shards(root: str) -> Manifest:
    from pipeline.format import spaces

    for shard in discovery.list_shards(locate(root), layout.STEPS):
        try:
            meta = pq.read_schema(shard).metadata or {}
            return Manifest(
                observation_space=spaces.space_from_json(
                    json.loads(meta[layout.META_OBSERVATION_SPACE])
                ),
                action_space=spaces.space_from_json(json.loads(meta[layout.META_ACTION_SPACE])),
                env_id=None,
            )
        except (*READ_ERRORS, KeyError, ValueError):
            continue
    raise DatasetError(f"{root}: the manifest is damaged and no step shard records the spaces")


def _write_json(target: Path, doc: Any) -> None:
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w") as handle:
        json.dump(doc, handle, indent=2)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    fsync_path(target.parent)


def format_repair(report: dict[str, Any]) -> str:
    """What :func:`repair` did, as text: each file moved, what was wrong, and the rows lost."""
    moved = report["quarantined"]
    if not moved:
        return "repair         nothing damaged"
    files = "1 damaged file" if len(moved) == 1 else f"{len(moved)} damaged files"
    lines = [f"repair         {files} moved into {report['folder'] or layout.QUARANTINE}/"]
    for entry in moved:
        lost = entry["lost"]
        rows = "unknown" if lost["rows"] is None else lost["rows"]
        lines.append(f"  - {entry['file']}: {entry['problem']}")
        lines.append(f"      now {entry['moved_to']}; rows lost: {rows}")
        lines += [f"      {_episode_text(episode)}" for episode in lost["episodes"][:_SHOWN]]
        if len(lost["episodes"]) > _SHOWN:
            lines.append(f"      ... ({len(lost['episodes'])} episodes in all)")
        if lost["unknown"]:
            lines.append(f"      unknown: {lost['unknown']}")
    for episode in report["episodes_missing_steps"][:_SHOWN]:
        gaps = ", ".join(f"{a}..{b}" for a, b in episode["missing_t"])
        lines.append(
            f"missing steps  episode {episode['episode_id']!r} agent {episode['agent_id']!r} "
            f"(length {episode['length']}): t {gaps}"
        )
    return "\n".join(lines)


def _episode_text(episode: dict[str, Any]) -> str:
    text = f"episode {episode['episode_id']!r} agent {episode['agent_id']!r}"
    if "t" in episode:
        text += f" t {episode['t'][0]}..{episode['t'][1]} ({episode['rows']} rows)"
    return text


_SHOWN = 20

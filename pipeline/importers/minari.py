"""Minari datasets: ``DATASET/data/main_data.hdf5`` with one group per episode.

Following Minari's dataset standards, a group ``episode_<id>`` holds ``observations`` (one more
row than steps: the reset observation and every next one), ``actions``, ``rewards``,
``terminations`` and ``truncations``, and its ``seed`` attribute the seed of the episode's reset
(kept, so ``rlpipe replay`` can re-run it). The env id comes from the dataset's ``env_spec`` (in
``metadata.json`` beside ``data/``, or in the HDF5 file's attributes in older Minari releases).
Observations and actions must be arrays: Dict and Tuple spaces (nested groups) are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DatasetError
from pipeline.importers.d4rl import open_hdf5
from pipeline.importers.transitions import SourceSteps

DATA_FILE = "main_data.hdf5"
EPISODE_PREFIX = "episode_"


def read_minari(src: str | Path) -> tuple[SourceSteps, str | None]:
    """The steps of a Minari dataset directory (or its HDF5 file) and the env id it names."""
    data_file = _data_file(Path(src))
    columns: dict[str, list[np.ndarray]] = {}
    with open_hdf5(data_file) as handle:
        for name in _episode_names(handle, data_file):
            for key, values in _episode(handle[name], f"{data_file}:{name}").items():
                columns.setdefault(key, []).append(values)
        env_id = _env_id(data_file, dict(handle.attrs))
    if not columns:
        raise DatasetError(f"{data_file}: no {EPISODE_PREFIX}<id> groups")
    steps = SourceSteps(**{key: np.concatenate(parts) for key, parts in columns.items()})
    return steps, env_id


def _data_file(src: Path) -> Path:
    for candidate in (src, src / "data" / DATA_FILE, src / DATA_FILE):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"{src}: no Minari dataset here (looked for data/{DATA_FILE})")


def _episode_names(handle: Any, where: Path) -> list[str]:
    names = [name for name in handle if name.startswith(EPISODE_PREFIX)]
    try:
        return sorted(names, key=lambda name: int(name[len(EPISODE_PREFIX) :]))
    except ValueError:
        raise DatasetError(f"{where}: episode groups must be named episode_<integer>") from None


def _episode(group: Any, where: str) -> dict[str, np.ndarray]:
    names = ("observations", "actions", "rewards", "terminations", "truncations")
    missing = [name for name in names if name not in group]
    if missing:
        raise DatasetError(f"{where}: missing {missing}; found {sorted(group.keys())}")
    nested = [name for name in ("observations", "actions") if not hasattr(group[name], "shape")]
    if nested:
        raise DatasetError(
            f"{where}: {nested} are nested groups (Dict or Tuple spaces), which this importer "
            "does not read; only array observations and actions"
        )
    observations = np.asarray(group["observations"])
    rewards = np.asarray(group["rewards"]).reshape(-1)
    n = len(rewards)
    if len(observations) != n + 1:
        raise DatasetError(
            f"{where}: observations: expected {n + 1} rows (one more than the {n} steps), "
            f"got {len(observations)}"
        )
    seed = group.attrs.get("seed")
    return {
        "episode_keys": np.full(n, int(group.attrs.get("id", where.rsplit("_", 1)[-1]))),
        "seeds": np.full(n, int(seed) if isinstance(seed, int | np.integer) else -1),
        "observations": observations[:-1],
        "next_observations": observations[1:],
        "actions": np.asarray(group["actions"]),
        "rewards": rewards,
        "terminateds": np.asarray(group["terminations"]).astype(bool).reshape(-1),
        "truncateds": np.asarray(group["truncations"]).astype(bool).reshape(-1),
    }


def _env_id(data_file: Path, attrs: dict[str, Any]) -> str | None:
    metadata_file = data_file.parent.parent / "metadata.json"
    metadata = dict(attrs)
    if metadata_file.is_file():
        metadata.update(json.loads(metadata_file.read_text()))
    spec = metadata.get("env_spec")
    if isinstance(spec, bytes):
        spec = spec.decode()
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError:
            return None
    env_id = spec.get("id") if isinstance(spec, dict) else None
    return str(env_id) if env_id else None

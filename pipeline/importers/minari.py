"""Minari datasets (``rlpipe import minari``): all three storage backends, as Minari wrote them.

Minari 0.5 writes ``DATASET/data/metadata.json``: ``data_format`` (``hdf5``, ``arrow`` or
``parquet``), the ``observation_space`` and ``action_space`` (Minari's own JSON,
``minari/serialization.py``), ``env_spec`` (gymnasium's ``EnvSpec.to_json``: the env id and its
``max_episode_steps``) and ``jpeg_encoding``. Where ``data/metadata.json`` is absent (older
releases), the same keys are read from the HDF5 file's attributes and a ``metadata.json`` beside
``data/``; that form is not tested against an old Minari release. The episodes are read by
:mod:`pipeline.importers.minari_files`.

What comes across, exactly: every step (observation, action, reward, next observation,
terminated, truncated), Box, Discrete, MultiDiscrete, MultiBinary spaces and Dict and Tuple ones
nested to any depth, each episode's reset ``seed`` (any integer up to 2**64 - 1) and ``options``,
and each step's ``info`` (the info ``step`` returned; the reset's info has no row to go in). What is
refused, naming the reason: Text spaces (rlpipe stores none), a ``data_format`` other than the
three, episodes whose arrays disagree in length. Minari is not needed to read the files: HDF5 takes
h5py, the others pyarrow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.dataset.batch import join, length, map_leaves
from pipeline.errors import DatasetError, SpaceError
from pipeline.format.spaces import space_from_json
from pipeline.importers.minari_files import (
    HDF5_FILE,
    MinariEpisode,
    Spaces,
    arrow_episodes,
    hdf5_episodes,
    json_file,
    plain,
)
from pipeline.importers.transitions import SourceSteps, env_spaces

FORMATS = ("hdf5", "arrow", "parquet")


@dataclass(frozen=True)
class MinariSource:
    """A Minari dataset as rlpipe imports it: the steps and what its metadata says."""

    steps: SourceSteps
    env_id: str | None
    max_episode_steps: int | None
    observation_space: gym.Space[Any] | None  # None: neither the metadata nor the env says
    action_space: gym.Space[Any] | None
    env_kwargs: dict[str, Any]  # what the env was made with besides its id (rlpipe keeps none)


def read_minari(src: str | Path) -> MinariSource:
    """The steps of a Minari dataset directory (its ``data/`` directory, or an HDF5 file).

    Raises:
        DatasetError: naming what is missing or not readable, and why.
    """
    data_dir, metadata = _locate(Path(src))
    data_format = metadata.get("data_format", "hdf5")
    if data_format not in FORMATS:
        raise DatasetError(
            f"{data_dir}: data_format {data_format!r}: rlpipe reads Minari's {list(FORMATS)}"
        )
    observation_space = _space(metadata, "observation_space", data_dir)
    action_space = _space(metadata, "action_space", data_dir)
    spec = _env_spec(metadata)
    env_id = spec.get("id")
    limit = spec.get("max_episode_steps")
    if observation_space is None or action_space is None:
        observation_space, action_space = _spaces_of_env(env_id, observation_space, action_space)
    spaces = Spaces(observation_space, action_space, bool(metadata.get("jpeg_encoding", True)))
    if data_format == "hdf5":
        episodes: Iterator[MinariEpisode] = hdf5_episodes(data_dir, spaces)
    else:
        episodes = arrow_episodes(data_dir, spaces, data_format)
    return MinariSource(
        steps=_steps(episodes),
        env_id=str(env_id) if env_id else None,
        max_episode_steps=int(limit) if isinstance(limit, int) else None,
        observation_space=observation_space,
        action_space=action_space,
        env_kwargs={key: spec[key] for key in ("kwargs", "additional_wrappers") if spec.get(key)},
    )


def _locate(src: Path) -> tuple[Path, dict[str, Any]]:
    """The directory (or HDF5 file) that holds the episodes, and the dataset's metadata."""
    if src.is_file():  # an HDF5 file named directly
        beside = json_file(src.parent / "metadata.json") or json_file(
            src.parent.parent / "metadata.json"
        )
        return src, _hdf5_attrs(src) | beside
    data_dir = src / "data" if (src / "data").is_dir() else src
    metadata = json_file(data_dir / "metadata.json") or json_file(src / "metadata.json")
    if (data_dir / HDF5_FILE).is_file():  # Minari before 0.5 kept metadata in its attributes
        return data_dir, _hdf5_attrs(data_dir / HDF5_FILE) | metadata
    if not metadata:
        raise DatasetError(
            f"{src}: no Minari dataset here (looked for data/metadata.json, as Minari 0.5 "
            f"writes it, and data/{HDF5_FILE})"
        )
    return data_dir, metadata


def _hdf5_attrs(path: Path) -> dict[str, Any]:
    from pipeline.importers.d4rl import open_hdf5

    with open_hdf5(path) as handle:
        return {key: plain(value) for key, value in handle.attrs.items()}


def _env_spec(metadata: dict[str, Any]) -> dict[str, Any]:
    spec = metadata.get("env_spec")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError:
            return {}
    return spec if isinstance(spec, dict) else {}


def _space(metadata: dict[str, Any], key: str, where: Path) -> gym.Space[Any] | None:
    """A space from Minari's serialization (``subspaces`` for Dict and Tuple, bounds as
    floats with ``Infinity``), read through rlpipe's own space documents."""
    text = metadata.get(key)
    if text is None:
        return None
    try:
        doc = json.loads(text) if isinstance(text, str) else text
        return space_from_json(_as_rlpipe_doc(doc, f"{key}"))
    except (json.JSONDecodeError, SpaceError) as error:
        raise DatasetError(f"{where}: metadata {key}: {error}") from None


def _as_rlpipe_doc(doc: Any, where: str) -> Any:
    if not isinstance(doc, dict):
        return doc
    kind = doc.get("type")
    if kind == "Text":
        raise SpaceError(f"{where} is a Text space, which rlpipe datasets cannot store")
    if kind in ("Dict", "Tuple") and "subspaces" in doc:
        subs = doc["subspaces"]
        if isinstance(subs, dict):
            spaces: Any = {k: _as_rlpipe_doc(v, f"{where}.{k}") for k, v in subs.items()}
        else:
            spaces = [_as_rlpipe_doc(v, f"{where}.{i}") for i, v in enumerate(subs)]
        return {"type": kind, "spaces": spaces}
    if kind == "Box":
        return {
            **doc,
            "low": _finite_or_text(doc.get("low")),
            "high": _finite_or_text(doc.get("high")),
        }
    return doc


def _finite_or_text(bound: Any) -> Any:
    """Minari writes infinite bounds as JSON's nonstandard ``Infinity``; rlpipe as ``"inf"``."""
    if isinstance(bound, list):
        return [_finite_or_text(b) for b in bound]
    if isinstance(bound, float) and math.isinf(bound):
        return "inf" if bound > 0 else "-inf"
    return bound


def _spaces_of_env(
    env_id: Any, observation: gym.Space[Any] | None, action: gym.Space[Any] | None
) -> tuple[gym.Space[Any] | None, gym.Space[Any] | None]:
    if not env_id:
        return observation, action
    try:
        made = env_spaces(str(env_id))
    except DatasetError:  # not installed here
        return observation, action
    return observation or made[0], action or made[1]


def _steps(episodes: Iterator[MinariEpisode]) -> SourceSteps:
    """Every episode's steps, back to back, with its seed, options and infos on each row."""
    parts: dict[str, list[Any]] = {}
    for episode in episodes:
        for key, value in _episode_columns(episode).items():
            parts.setdefault(key, []).append(value)
    if not parts:
        raise DatasetError("the Minari dataset holds no episodes")
    columns = {key: join(values) for key, values in parts.items()}
    for key in ("infos", "reset_options", "seeds"):
        if all(value is None for value in columns[key]):
            columns[key] = None
    return SourceSteps(**columns)


def _episode_columns(episode: MinariEpisode) -> dict[str, Any]:
    n = len(episode.rewards)
    where = f"episode {episode.id}"
    lengths = {
        "observations": length(episode.observations) - 1,
        "actions": length(episode.actions),
        "terminations": len(episode.terminations),
        "truncations": len(episode.truncations),
    }
    wrong = {name: count for name, count in lengths.items() if count != n}
    if wrong:
        raise DatasetError(
            f"{where}: {n} rewards, but {wrong} (observations and infos hold one row more than "
            "the steps: the reset's)"
        )
    return {
        "episode_keys": np.full(n, episode.id),
        "seeds": _constant(episode.seed, n),
        "reset_options": _constant(episode.options, n),
        "infos": _step_infos(episode.infos, n, where),
        "observations": map_leaves(lambda array: np.asarray(array)[:n], episode.observations),
        "next_observations": map_leaves(lambda array: np.asarray(array)[1:], episode.observations),
        "actions": episode.actions,
        "rewards": np.asarray(episode.rewards, dtype=np.float64),
        "terminateds": episode.terminations,
        "truncateds": episode.truncations,
    }


def _constant(value: Any, n: int) -> np.ndarray:
    """``value`` on every row, as Python objects: a seed past int64 stays an exact int."""
    column = np.empty(n, dtype=object)
    column[:] = [value] * n
    return column


def _step_infos(infos: dict[str, Any] | None, n: int, where: str) -> np.ndarray:
    """Row ``t`` gets the info that ``step`` returned (Minari's row ``t + 1``)."""
    if not infos:
        return _constant(None, n)
    rows = length(infos)
    if rows != n + 1:
        raise DatasetError(f"{where}: infos hold {rows} rows; expected {n + 1} (steps + reset)")
    column = np.empty(n, dtype=object)
    column[:] = [plain(_row(infos, t)) for t in range(1, n + 1)]
    return column


def _row(value: Any, t: int) -> Any:
    return map_leaves(lambda array: array[t], value)

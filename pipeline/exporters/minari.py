"""An rlpipe dataset as a Minari dataset, written by Minari itself (``rlpipe export minari``).

Minari (``pip install minari``) is what reads the result, so it is Minari's own
``create_dataset_from_buffers`` that writes it, in any of its storage backends: one
``EpisodeBuffer`` per episode, with the observations of every step and the last next
observation, the actions, rewards, terminations and truncations, and the episode's reset seed and
options from the episodes table. d3rlpy and TorchRL load Minari datasets through Minari.

Episodes keep their ids when every id is a decimal integer (as after ``rlpipe import minari``),
so Minari -> rlpipe -> Minari gives the same episodes; other ids are numbered 0, 1, ... in the
order the step table holds them. Not exported: step infos (Minari wants the reset's info too,
which rlpipe does not keep) and datasets with several agents (a Minari episode has one).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.dataset import discovery
from pipeline.dataset.location import Location, locate
from pipeline.errors import DatasetError, RlpipeError

FORMATS = ("hdf5", "arrow", "parquet")
_COLUMNS = ("observation", "action", "reward", "next_observation", "terminated", "truncated")


@dataclass(frozen=True)
class ExportSummary:
    dataset_id: str
    path: str
    episodes: int
    steps: int

    def describe(self) -> str:
        return (
            f"exported {self.steps} steps in {self.episodes} episodes as Minari dataset "
            f"{self.dataset_id!r} into {self.path}"
        )


def export_minari(
    src: str | Path | Location,
    out: str | Path,
    dataset_id: str | None = None,
    data_format: str = "hdf5",
) -> ExportSummary:
    """Write the dataset at ``src`` as Minari dataset ``dataset_id`` under the Minari datasets
    root ``out`` (what ``MINARI_DATASETS_PATH`` names): ``out/<dataset_id>/data/...``.

    Raises:
        RlpipeError: when Minari is not installed.
        DatasetError: when the dataset has several agents, or Minari refuses the dataset id.
    """
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
    except ModuleNotFoundError:
        raise RlpipeError("export minari writes through Minari: pip install minari") from None
    from pipeline.format.manifest import read_manifest

    if data_format not in FORMATS:
        raise DatasetError(f"--format {data_format!r}: Minari's formats are {list(FORMATS)}")
    location = locate(src)
    manifest = read_manifest(location)
    name = dataset_id or f"rlpipe/{_name(location)}-v0"
    reset = discovery.reset_args(location)
    buffers = [
        EpisodeBuffer(
            id=number,
            seed=reset.get(key, (None, None))[0],
            options=reset.get(key, (None, None))[1],
            **episode,
        )
        for number, key, episode in _episodes(location)
    ]
    if not buffers:
        raise DatasetError(f"{location}: no episodes to export")
    spec = _spec(manifest.env_id)
    with _datasets_root(out), warnings.catch_warnings():
        # Minari nags about metadata (author, description...) that rlpipe does not have
        warnings.filterwarnings("ignore", message=r".*is set to None", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"env_spec is None", category=UserWarning)
        try:
            minari.create_dataset_from_buffers(
                name,
                buffers,
                env=spec,
                eval_env=spec,
                observation_space=manifest.observation_space,
                action_space=manifest.action_space,
                algorithm_name="rlpipe export",
                description=f"exported by rlpipe from {location.uri}",
                data_format=data_format,
            )
        except ValueError as error:
            raise DatasetError(f"Minari refused dataset {name!r}: {error}") from None
    steps = sum(len(buffer.rewards) for buffer in buffers)
    return ExportSummary(name, str(Path(out).resolve() / name), len(buffers), steps)


def _episodes(location: Location) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(Minari id, rlpipe episode id, buffer fields) of every episode."""
    from pipeline.dataset.reader import InputReader

    reader = InputReader(location, episodes=True, columns=_COLUMNS)
    episodes = list(reader)
    agents = {str(agent) for episode in episodes for agent in set(episode.agent_ids.tolist())}
    if len(agents) > 1:
        raise DatasetError(
            f"{location}: agents {sorted(agents)}: a Minari episode has one agent; export a "
            "single-agent dataset"
        )
    keys = [str(episode.episode_ids[0]) for episode in episodes]
    numbered = all(key.isdecimal() for key in keys) and len(set(map(int, keys))) == len(keys)
    order = sorted(range(len(keys)), key=lambda i: int(keys[i])) if numbered else range(len(keys))
    for number, i in enumerate(order):
        episode = episodes[i]
        yield (
            int(keys[i]) if numbered else number,
            keys[i],
            {
                "observations": _with_last(episode.observations, episode.next_observations),
                "actions": episode.actions,
                "rewards": np.asarray(episode.rewards, dtype=np.float64).tolist(),
                "terminations": np.asarray(episode.terminateds, dtype=bool).tolist(),
                "truncations": np.asarray(episode.truncateds, dtype=bool).tolist(),
            },
        )


def _with_last(observations: Any, next_observations: Any) -> Any:
    """Minari's observations: every step's, then the last next observation."""
    if isinstance(observations, dict):
        return {k: _with_last(observations[k], next_observations[k]) for k in observations}
    if isinstance(observations, tuple):
        return tuple(_with_last(o, n) for o, n in zip(observations, next_observations, strict=True))
    return np.concatenate([observations, next_observations[-1:]])


def _spec(env_id: str | None) -> Any:
    if env_id is None:
        return None
    try:
        return gym.spec(env_id)
    except gym.error.Error:
        return None  # not installed here: the spaces describe the dataset


def _name(location: Location) -> str:
    stem = location.root.rstrip("/").rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() or c in "_" else "_" for c in stem) or "dataset"


@contextmanager
def _datasets_root(out: str | Path) -> Iterator[None]:
    """Minari writes under ``MINARI_DATASETS_PATH``: point it at ``out`` for the call."""
    before = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(Path(out).resolve())
    try:
        yield
    finally:
        if before is None:
            del os.environ["MINARI_DATASETS_PATH"]
        else:
            os.environ["MINARI_DATASETS_PATH"] = before

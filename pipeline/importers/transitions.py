"""Foreign step rows in, our episodes out: the part every importer shares.

A source hands over flat arrays in its own row order (:class:`SourceSteps`);
:mod:`pipeline.importers.boundaries` finds its episodes, and :func:`write_dataset` writes them.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np
import pyarrow.fs as pafs

from pipeline.dataset.batch import length, map_leaves
from pipeline.dataset.location import Location, locate
from pipeline.dataset.writer import DatasetWriter
from pipeline.errors import ConfigError, DatasetError, RlpipeWarning
from pipeline.format import layout
from pipeline.importers import boundaries
from pipeline.importers.boundaries import Boundaries

_CHUNK_ROWS = 65_536


@dataclass(frozen=True)
class SourceSteps:
    """Steps as a foreign format holds them, in its row order, row axis first.

    ``dones`` is read only when ``terminateds`` and ``truncateds`` are both absent; ``ts`` (the
    source's own step index) makes the time-limit check right for episodes recorded from mid-way.
    ``seeds`` (per row; None, or -1 in an integer array, for none) are the seeds episodes were
    reset with, which lets ``rlpipe replay`` re-run them, and ``reset_options`` the options; the
    episode's first row gives both. Seeds past int64 (up to 2**64 - 1) come as an object array
    of Python ints, never as floats. ``infos`` (per row: a dict, JSON text or None) is the info
    the step returned. Observations and actions are batches: arrays with the row axis first, or
    dicts and tuples of them for Dict and Tuple spaces.
    """

    episode_keys: np.ndarray
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    terminateds: np.ndarray | None = None
    truncateds: np.ndarray | None = None
    dones: np.ndarray | None = None
    agent_ids: np.ndarray | None = None
    ts: np.ndarray | None = None
    action_logps: np.ndarray | None = None
    seeds: np.ndarray | None = None
    reset_options: np.ndarray | None = None
    infos: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.episode_keys)
        wrong = [
            f"{name} has {length(value)}"
            for name, value in vars(self).items()
            if value is not None and length(value) != n
        ]
        if wrong:
            raise DatasetError(
                f"source columns differ in length: episode keys have {n} rows, " + ", ".join(wrong)
            )


@dataclass(frozen=True)
class ImportSummary:
    """What an import wrote; ``returns`` are per episode, in the order the episodes were written."""

    path: str
    steps: int
    episodes: int
    terminated: int
    truncated: int
    returns: tuple[float, ...]

    def describe(self) -> str:
        mean = math.fsum(self.returns) / len(self.returns) if self.returns else float("nan")
        return (
            f"imported {self.steps} steps in {self.episodes} episodes ({self.terminated} "
            f"terminated, {self.truncated} truncated; mean return {mean:.4g}) into {self.path}"
        )


def time_limit(env_id: str | None) -> int | None:
    """gymnasium's ``max_episode_steps`` for ``env_id``, or None when unknown or unregistered."""
    if env_id is None:
        return None
    try:
        limit = gym.spec(env_id).max_episode_steps
    except gym.error.Error:
        return None
    return int(limit) if limit is not None else None


def env_spaces(env_id: str) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """The spaces of a registered env, which an import records so replay can rebuild it."""
    try:
        env = gym.make(env_id)
    except (gym.error.Error, ImportError) as error:
        raise DatasetError(f"--env {env_id}: gymnasium cannot make it ({error})") from None
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def infer_spaces(steps: SourceSteps) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """Unbounded Boxes for the data's shapes, Discrete for integer scalar actions: used without
    ``--env``, when nothing better describes the source."""
    if not all(isinstance(v, np.ndarray) for v in (steps.observations, steps.actions)):
        raise DatasetError(
            "observations and actions are dicts or tuples of arrays: give --env, or spaces, to "
            "say what spaces they are"
        )
    observation = gym.spaces.Box(-np.inf, np.inf, steps.observations.shape[1:], np.float32)
    actions = steps.actions
    if actions.dtype.kind in "iub" and actions.ndim == 1:
        if actions.size and actions.min() < 0:
            raise DatasetError(
                f"actions: integer actions must be >= 0 to form a Discrete space, got "
                f"{actions.min()}; give --env to say what the action space is"
            )
        n = int(actions.max()) + 1 if actions.size else 1
        return observation, gym.spaces.Discrete(n)
    return observation, gym.spaces.Box(-np.inf, np.inf, actions.shape[1:], np.float32)


def write_dataset(
    steps: SourceSteps,
    path: str | Path | Location,
    *,
    env_id: str | None = None,
    max_episode_steps: int | None = None,
    observation_space: gym.Space[Any] | None = None,
    action_space: gym.Space[Any] | None = None,
    actions_normalized: bool = False,
) -> ImportSummary:
    """Write ``steps`` as a new dataset at ``path``, with one episodes-table row per episode.

    Spaces come from the arguments, else from ``env_id``, else from the data. The time limit
    comes from ``max_episode_steps``, else from the env's registration. ``actions_normalized``
    says the source logged Box actions scaled to [-1, 1] (RLlib's ``actions_in_input_normalized``
    recordings); they are stored in the action space's own units, as the env applied them.

    Warns:
        RlpipeWarning: when every action lies in [-1, 1] and the bounded Box action space is wider
            while ``actions_normalized`` is False: the actions may be normalized.

    Raises:
        DatasetError: when ``path`` already holds a dataset (an import never appends).
        SchemaError: when the data does not fit the spaces.
    """
    location = locate(path)
    manifest = location.filesystem.get_file_info(location.path(layout.MANIFEST))
    if manifest.type != pafs.FileType.NotFound:
        raise DatasetError(f"{location}: already holds a dataset; import into a new directory")
    if not len(steps.episode_keys):
        raise DatasetError("the source holds no steps; nothing to import")
    if observation_space is None or action_space is None:
        observation_space, action_space = (
            env_spaces(env_id) if env_id is not None else infer_spaces(steps)
        )
    if actions_normalized:
        steps = dataclasses.replace(steps, actions=denormalize(steps.actions, action_space))
    else:
        _warn_if_normalized(steps.actions, action_space)
    limit = max_episode_steps if max_episode_steps is not None else time_limit(env_id)
    episodes = boundaries.split(steps, limit)
    returns = _returns(steps.rewards[episodes.order], episodes)
    with DatasetWriter(
        location.uri,
        observation_space,
        action_space,
        env_id=env_id,
        storage_options=location.storage_options,
        state_dir=location.state_dir,
    ) as writer:
        for start in range(0, len(episodes.order), _CHUNK_ROWS):
            writer.append(_step_columns(steps, episodes, slice(start, start + _CHUNK_ROWS)))
        writer.append_episodes(_episode_columns(steps, episodes, returns, env_id))
    last = episodes.ends - 1
    terminated = int(episodes.terminateds[last].sum()) if len(last) else 0
    return ImportSummary(
        path=location.uri if not location.local else str(Path(location.uri).resolve()),
        steps=len(episodes.order),
        episodes=len(episodes.starts),
        terminated=terminated,
        truncated=len(last) - terminated,
        returns=tuple(returns),
    )


def denormalize(actions: np.ndarray, space: gym.Space[Any]) -> np.ndarray:
    """Actions logged in [-1, 1] mapped linearly onto a bounded Box (and clipped into it).

    Raises:
        ConfigError: when the action space is not a Box with finite bounds.
    """
    if not _bounded_box(space):
        raise ConfigError(
            "import", "actions_normalized", "a Box action space with finite bounds", str(space)
        )
    low, high = space.low, space.high
    scaled = low + (np.asarray(actions, np.float64) + 1.0) * (high - low) / 2.0
    return np.clip(scaled, low, high).astype(space.dtype)


def _bounded_box(space: gym.Space[Any]) -> TypeGuard[gym.spaces.Box]:
    return isinstance(space, gym.spaces.Box) and bool(
        np.isfinite(space.low).all() and np.isfinite(space.high).all()
    )


def _warn_if_normalized(actions: np.ndarray, space: gym.Space[Any]) -> None:
    """RLlib logs Box actions in [-1, 1] when its policy acted normalized (its recorded Pendulum
    data does); taken as the env's units they would be a fraction of what the env applied."""
    if not _bounded_box(space) or not len(actions):
        return
    if (space.low >= -1).all() and (space.high <= 1).all():
        return  # the space itself lies in [-1, 1]: nothing to tell apart
    values = np.asarray(actions, dtype=np.float64)
    if values.min() >= -1.0 and values.max() <= 1.0:
        warnings.warn(
            f"actions: all {len(values)} imported actions lie in [-1, 1] while the action space "
            f"is {space}; if the source logged them normalized (RLlib's "
            "actions_in_input_normalized), import with --actions-normalized "
            "(actions_normalized=True) to store them in the space's units",
            RlpipeWarning,
            stacklevel=3,
        )


def _returns(rewards: np.ndarray, episodes: Boundaries) -> list[float]:
    """Exact sums (``math.fsum``), so a return does not depend on the order rows were added in."""
    values = np.asarray(rewards, dtype=np.float64).tolist()
    return [
        math.fsum(values[start:end])
        for start, end in zip(episodes.starts.tolist(), episodes.ends.tolist(), strict=True)
    ]


def _step_columns(steps: SourceSteps, episodes: Boundaries, rows: slice) -> dict[str, Any]:
    source = episodes.order[rows]
    columns: dict[str, Any] = {
        "episode_id": episodes.episode_ids[rows],
        "agent_id": episodes.agent_ids[rows],
        "t": episodes.ts[rows],
        "observation": _rows(steps.observations, source),
        "action": _rows(steps.actions, source),
        "reward": np.asarray(steps.rewards, dtype=np.float64)[source],
        "next_observation": _rows(steps.next_observations, source),
        "terminated": episodes.terminateds[rows],
        "truncated": episodes.truncateds[rows],
    }
    if steps.action_logps is not None:
        columns["action_logp"] = np.asarray(steps.action_logps, dtype=np.float64)[source]
    if steps.infos is not None:
        columns["info"] = list(steps.infos[source])
    return columns


def _episode_columns(
    steps: SourceSteps, episodes: Boundaries, returns: list[float], env_id: str | None
) -> dict[str, Any]:
    last = episodes.ends - 1
    now = datetime.now(UTC)
    count = len(last)
    first = episodes.order[episodes.starts]
    seeds = [None] * count if steps.seeds is None else _seeds(steps.seeds[first])
    options = [None] * count if steps.reset_options is None else list(steps.reset_options[first])
    return {
        "episode_id": episodes.episode_ids[last],
        "agent_id": episodes.agent_ids[last],
        "started_at": [now] * count,
        "ended_at": [now] * count,
        "length": (episodes.ends - episodes.starts).tolist(),
        "return": returns,
        "env_id": [env_id] * count,
        "seed": seeds,
        "reset_options": options,
        "end_reason": np.where(episodes.terminateds[last], "terminated", "truncated").tolist(),
    }


def _rows(batch: Any, rows: np.ndarray) -> Any:
    return map_leaves(lambda array: np.asarray(array)[rows], batch)


def _seeds(values: np.ndarray) -> list[int | None]:
    """Seeds as exact Python ints (None for none, as is -1 in an integer column); a float seed
    is refused, since float64 rounds seeds past 2**53 (5272104914398938230 would be stored as
    ...8112, and replay would diverge at t=0)."""
    if values.dtype.kind == "f":
        raise DatasetError(
            f"seeds: expected integers, got {values.dtype} (floats round seeds past 2**53)"
        )
    seeds: list[int | None] = []
    for value in values.tolist():  # Python ints, exact, for int64, uint64 and object arrays
        if value is None or (isinstance(value, int) and value == -1):
            seeds.append(None)
        elif isinstance(value, int) and not isinstance(value, bool):
            seeds.append(value)
        else:
            raise DatasetError(f"seeds: expected integers, got {value!r}")
    return seeds

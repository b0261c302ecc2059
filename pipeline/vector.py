"""Vectorized simulators: many episodes' steps in one call, and a gymnasium vector env's sub-envs
as episodes.

A simulator that steps N envs at once would pay N round trips through the one-episode verbs.
:func:`step_many` sends the N steps in the server's columnar batch form (``docs/protocol.md``,
"Vectorized simulators") as one request: one forward pass and one durable write on the server.
Its rows are numbered per episode, as the one-episode verbs' requests are, so a retried request
is answered again instead of being stored twice. :class:`VectorEpisodes` keeps the bookkeeping a
gymnasium vector env needs on top: which episode each sub-env is in, a new one whenever a sub-env
resets itself, and an action for a sub-env whose episode has just ended.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import orjson
from gymnasium.vector import AutoresetMode

from pipeline import layout
from pipeline.errors import ConfigError, SchemaError
from pipeline.transport import RemoteEpisode, jsonable, row_of

if TYPE_CHECKING:
    from pipeline.client import PolicyClient

_AGENT = layout.DEFAULT_AGENT_ID
_JSON = {"Content-Type": "application/json"}


def step_many(
    client: PolicyClient,
    episode_ids: Sequence[str],
    observations: Any,
    rewards: Any = None,
    terminated: Any = None,
    truncated: Any = None,
    starts: Sequence[Mapping[str, Any] | None] | None = None,
    infos: Sequence[Any] | None = None,
) -> list[Any]:
    """Step many episodes at once; the action for each (None where the row ended its episode).

    Row ``i`` is episode ``episode_ids[i]`` observing ``observations[i]`` (a batch: an array of
    ``(n, *shape)``, or a sequence of single observations) after earning ``rewards[i]`` for its
    previous action. ``terminated[i]`` or ``truncated[i]`` ends the episode at that observation.
    ``starts[i]`` (``{}``, or with ``seed``, ``options``, ``training_enabled``) opens the episode
    first; None continues one opened before.
    """
    ids = list(episode_ids)
    n = len(ids)
    starts = [None] * n if starts is None else list(starts)
    ends = [_flags(terminated, n, "terminated"), _flags(truncated, n, "truncated")]
    for name, column in (("starts", starts), ("infos", infos)):
        if column is not None and len(column) != n:
            raise SchemaError.single(name, f"{n} entries (one per episode id)",
                                     f"{len(column)}")  # fmt: skip
    observations = _observation_rows(observations, n)
    if client._local is not None:
        return _local(client, ids, observations, _rewards(rewards, n), ends, starts, infos)
    return _remote(client, ids, observations, _rewards(rewards, n), ends, starts, infos)


def _observation_rows(observations: Any, n: int) -> Any:
    """An array of ``n`` rows as it is (the cheap body), anything else as ``n`` single ones."""
    if isinstance(observations, np.ndarray):
        if (len(observations) if observations.ndim else 0) != n:
            raise SchemaError.single("observations", f"{n} rows (one per episode id)",
                                     f"shape {observations.shape}")  # fmt: skip
        return observations
    if isinstance(observations, Mapping | tuple):  # a batch of a Dict or Tuple space
        return [row_of(observations, i) for i in range(n)]
    rows = list(observations)
    if len(rows) != n:
        raise SchemaError.single("observations", f"{n} rows (one per episode id)",
                                 f"{len(rows)}")  # fmt: skip
    return rows


def _remote(
    client: PolicyClient,
    ids: list[str],
    observations: Any,
    rewards: np.ndarray,
    ends: list[np.ndarray],
    starts: list[Any],
    infos: Sequence[Any] | None,
) -> list[Any]:
    states = []
    for episode_id, start in zip(ids, starts, strict=True):
        if start is not None and episode_id not in client._remote:
            client._remote[episode_id] = RemoteEpisode()
        states.append(client._remote_episode(episode_id))
    logged = [state.rewards.get(_AGENT, 0.0) for state in states]  # from log_returns
    body: dict[str, Any] = {
        "episode_ids": ids, "observations": observations, "rewards": rewards + logged,
        "terminated": ends[0], "truncated": ends[1],
        "starts": [None if start is None else {"client_id": client.client_id, **start}
                   for start in starts],
        "requests": [state.request + 1 for state in states],
    }  # fmt: skip
    if infos is not None:
        body["infos"] = [jsonable(info) for info in infos]
    response = client._http.call("POST", "/v1/actions", data=_encode(body), headers=_JSON)
    actions = orjson.loads(response.content)["actions"]
    for episode_id, state, end in zip(ids, states, ends[0] | ends[1], strict=True):
        state.sent()
        if end:
            del client._remote[episode_id]
    return [None if action is None else client._decode_one(action) for action in actions]


def _encode(body: dict[str, Any]) -> bytes:
    """The body as JSON: by orjson straight from numpy when every number is finite, else by
    ``json`` from lists (orjson would write NaN as null; the server must see, and name, NaN)."""
    observations = body["observations"]
    if isinstance(observations, np.ndarray) and observations.dtype.kind in "fiub" and (
        np.isfinite(observations).all() and np.isfinite(body["rewards"]).all()
    ):  # fmt: skip
        try:
            fast = {**body, "observations": np.ascontiguousarray(observations)}
            return orjson.dumps(fast, option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError:  # a dtype orjson does not write (float16)
            pass
    if isinstance(observations, np.ndarray):
        observations = observations.tolist()
    else:
        observations = [jsonable(observation) for observation in observations]
    plain = {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in body.items()}
    return json.dumps({**plain, "observations": observations}, separators=(",", ":")).encode()


def _local(
    client: PolicyClient,
    ids: list[str],
    observations: Any,
    rewards: np.ndarray,
    ends: list[np.ndarray],
    starts: list[Any],
    infos: Sequence[Any] | None,
) -> list[Any]:
    """Local inference: the one-episode verbs, row by row (no round trips to save)."""
    actions: list[Any] = []
    for i, episode_id in enumerate(ids):
        start, observation = starts[i], row_of(observations, i)
        if start is not None:
            client.start_episode(episode_id, bool(start.get("training_enabled", True)),
                                 start.get("seed"), start.get("options"))  # fmt: skip
        if rewards[i] != 0.0 or (infos is not None and infos[i] is not None):
            client.log_returns(episode_id, float(rewards[i]), None if infos is None else infos[i])
        if ends[0][i] or ends[1][i]:
            client.end_episode(episode_id, observation, truncated=not ends[0][i])
            actions.append(None)
        else:
            actions.append(client.get_action(episode_id, observation))
    return actions


def _rewards(values: Any, n: int) -> np.ndarray:
    if values is None:
        return np.zeros(n)
    try:
        rewards = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise SchemaError.single("rewards", f"{n} numbers", repr(values)[:80]) from None
    if rewards.shape != (n,):
        raise SchemaError.single("rewards", f"{n} numbers", f"shape {rewards.shape}")
    return rewards


def _flags(values: Any, n: int, name: str) -> np.ndarray:
    if values is None:
        return np.zeros(n, bool)
    flags = np.asarray(values)
    if flags.shape != (n,) or flags.dtype != np.bool_:
        raise SchemaError.single(name, f"{n} booleans", f"{flags.dtype} of shape {flags.shape}")
    return flags


class VectorEpisodes:
    """The sub-envs of a gymnasium vector env as episodes of one client: each vector step is one
    call of :func:`step_many` (one request in remote mode).

    Each sub-env is in one episode at a time; when it resets itself (``autoreset_mode``, the
    vector env's ``metadata["autoreset_mode"]``), its next observation opens a new episode. A
    sub-env whose episode ended still needs an action for the vector env's next step (which the
    env ignores under next-step autoreset): it gets its previous one.

    Args:
        client: the client the episodes belong to (remote or local inference).
        num_envs: the vector env's ``num_envs``.
        autoreset_mode: ``AutoresetMode.NEXT_STEP`` (gymnasium's default) or ``SAME_STEP``
            (the final observations ride in ``infos["final_obs"]``).
        training_enabled: recorded with every episode.
    """

    def __init__(self, client: PolicyClient, num_envs: int,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 training_enabled: bool = True) -> None:  # fmt: skip
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigError("VectorEpisodes", "num_envs", "an integer >= 1", num_envs)
        modes = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)
        mode = next((m for m in modes if autoreset_mode in (m, m.value)), None)
        if mode is None:
            raise ConfigError("VectorEpisodes", "autoreset_mode",
                              "AutoresetMode.NEXT_STEP or SAME_STEP", autoreset_mode)  # fmt: skip
        self.client = client
        self.num_envs = num_envs
        self.autoreset_mode = mode
        self.training_enabled = training_enabled
        self.episode_ids: list[str | None] = [None] * num_envs  # None: its episode ended
        self._actions: list[Any] = [None] * num_envs

    def reset(self, observations: Any, seeds: Sequence[int | None] | None = None,
              options: Mapping[str, Any] | None = None) -> Any:  # fmt: skip
        """Open an episode per sub-env at the observations ``reset`` returned; their actions.

        Record the seed each sub-env was reset with (``SyncVectorEnv.reset(seed=s)`` seeds
        sub-env ``i`` with ``s + i``), and the episodes can be replayed one by one.
        """
        seeds = [None] * self.num_envs if seeds is None else list(seeds)
        if len(seeds) != self.num_envs:
            raise SchemaError.single("seeds", f"{self.num_envs} seeds", f"{len(seeds)}")
        ids = [self._new_id() for _ in range(self.num_envs)]
        starts = [self._start(seed, options) for seed in seeds]
        actions = step_many(self.client, ids, observations, starts=starts)
        self.episode_ids = list(ids)
        return self._batch(actions)

    def step(self, observations: Any, rewards: Any, terminated: Any, truncated: Any,
             infos: Mapping[str, Any] | None = None) -> Any:  # fmt: skip
        """Log what the vector env's ``step`` returned; the actions for its next step."""
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            return self._same_step(observations, rewards, terminated, truncated, infos or {})
        ids: list[str] = []
        starts: list[dict[str, Any] | None] = []
        for i, episode_id in enumerate(self.episode_ids):
            if episode_id is None:  # it ended last step: this observation starts the next one
                self.episode_ids[i] = episode_id = self._new_id()
                starts.append(self._start(None, None))
            else:
                starts.append(None)
            ids.append(episode_id)
        fresh = np.array([start is not None for start in starts])
        rewards = np.where(fresh, 0.0, _rewards(rewards, self.num_envs))
        terminated = _flags(terminated, self.num_envs, "terminated") & ~fresh
        truncated = _flags(truncated, self.num_envs, "truncated") & ~fresh
        actions = step_many(self.client, ids, observations, rewards, terminated, truncated,
                            starts)  # fmt: skip
        for i in np.flatnonzero(terminated | truncated).tolist():
            self.episode_ids[i] = None
        return self._batch(actions)

    def close(self, observations: Any, rewards: Any, terminated: Any, truncated: Any,
              infos: Mapping[str, Any] | None = None) -> None:  # fmt: skip
        """Log the vector env's last step and end every episode there: those the envs ended as
        they say, the others as truncated (the simulator stopped, not the env)."""
        terminated = _flags(terminated, self.num_envs, "terminated")
        done = terminated | _flags(truncated, self.num_envs, "truncated")
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            finals = _final_observations(observations, done, infos or {})
            rows = list(range(self.num_envs))
        else:
            rows = [i for i, episode_id in enumerate(self.episode_ids) if episode_id is not None]
            finals = [row_of(observations, i) for i in rows]
        ids = [episode_id for episode_id in self.episode_ids if episode_id is not None]
        if ids:
            step_many(self.client, ids, _stacked(finals), _rewards(rewards, self.num_envs)[rows],
                      terminated[rows], ~terminated[rows])  # fmt: skip
        self.episode_ids = [None] * self.num_envs

    def _same_step(self, observations: Any, rewards: Any, terminated: Any, truncated: Any,
                   infos: Mapping[str, Any]) -> Any:  # fmt: skip
        """Each ended sub-env sends two rows: its final observation (``infos["final_obs"]``)
        ending the old episode, and the reset observation opening the new one."""
        terminated = _flags(terminated, self.num_envs, "terminated")
        truncated = _flags(truncated, self.num_envs, "truncated")
        ended = [int(i) for i in np.flatnonzero(terminated | truncated)]
        batch = _final_observations(observations, terminated | truncated, infos)
        ids = [episode_id for episode_id in self.episode_ids if episode_id is not None]
        fresh = [self._new_id() for _ in ended]
        batch += [row_of(observations, i) for i in ended]
        starts: list[dict[str, Any] | None] = [None] * self.num_envs
        starts += [self._start(None, None) for _ in ended]
        extra = np.zeros(len(ended), bool)
        actions = step_many(
            self.client, ids + fresh, _stacked(batch),
            np.concatenate([_rewards(rewards, self.num_envs), np.zeros(len(ended))]),
            np.concatenate([terminated, extra]), np.concatenate([truncated, extra]), starts,
        )  # fmt: skip
        for n, i in enumerate(ended):
            self.episode_ids[i] = fresh[n]
            actions[i] = actions[self.num_envs + n]
        return self._batch(actions[: self.num_envs])

    def _new_id(self) -> str:
        return f"{self.client.client_id}{next(self.client._episode_numbers):08x}"

    def _start(self, seed: int | None, options: Mapping[str, Any] | None) -> dict[str, Any]:
        start: dict[str, Any] = {"training_enabled": self.training_enabled}
        if seed is not None:
            start["seed"] = int(seed)
        if options is not None:
            start["options"] = jsonable(options)
        return start

    def _batch(self, actions: list[Any]) -> Any:
        """The actions as the vector env takes them; an ended sub-env repeats its last one."""
        for i, action in enumerate(actions):
            if action is not None:
                self._actions[i] = action
        space = self.client._space()[1]
        if isinstance(space, gym.spaces.Discrete | gym.spaces.Box | gym.spaces.MultiDiscrete
                      | gym.spaces.MultiBinary):  # fmt: skip
            return np.asarray(self._actions, dtype=space.dtype)
        out: Any = gym.vector.utils.create_empty_array(space, self.num_envs)
        return gym.vector.utils.concatenate(space, self._actions, out)


def _final_observations(observations: Any, done: np.ndarray,
                        infos: Mapping[str, Any]) -> list[Any]:  # fmt: skip
    """Per sub-env, the observation its episode is at: the final one (``infos["final_obs"]``)
    where it ended this step under same-step autoreset, else the one ``step`` returned."""
    final: Any = infos.get("final_obs")
    if done.any() and final is None:
        raise SchemaError.single("infos", "a 'final_obs' entry for the sub-envs that ended "
                                 "(same-step autoreset)", f"keys {sorted(infos)}")  # fmt: skip
    return [final[i] if done[i] else row_of(observations, i) for i in range(len(done))]


def _stacked(rows: list[Any]) -> Any:
    """Single observations as one array when they are arrays of one shape (the cheap body)."""
    if rows and all(isinstance(row, np.ndarray) for row in rows):
        try:
            return np.stack(rows)
        except ValueError:
            pass
    return rows

"""Vectorized simulators: many episodes' steps in one call, and a gymnasium vector env's sub-envs
as episodes.

:func:`step_many` sends N steps in the server's columnar batch form (``docs/protocol.md``,
"Vectorized simulators"): one request, one forward pass and one durable write instead of N round
trips. Its rows carry each episode's request number, so a batch sent again after its answer was
lost gets its first answer again and is stored once.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
import orjson
from gymnasium.vector import AutoresetMode

from pipeline.client import binary
from pipeline.client.remote import RemoteEpisode, RemoteInference, decoded_all
from pipeline.client.servers import ROUTE_HEADER
from pipeline.client.transport import jsonable
from pipeline.errors import ConfigError, SchemaError
from pipeline.format import layout
from pipeline.format.seeds import checked as checked_seed
from pipeline.recording.batches import row_of

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

    The episodes a batch opens travel under the client's route key, so the batch is one request
    however many servers the client has (``docs/deploy.md``). An episode opened by
    :meth:`~pipeline.client.PolicyClient.start_episode` travels under its own id, and a batch
    of such episodes is sent as one request per episode: open them with ``starts`` instead.
    """
    n = len(episode_ids)
    for name, column in (("starts", starts), ("infos", infos)):
        if column is not None and len(column) != n:
            raise SchemaError.single(name, f"{n} entries (one per episode id)", f"{len(column)}")
    rows: dict[str, Any] = {  # the server's batch form, checked; _send completes it
        "episode_ids": list(episode_ids),
        "observations": _observation_rows(observations, n),
        "rewards": _rewards(rewards, n),
        "terminated": _flags(terminated, n, "terminated"),
        "truncated": _flags(truncated, n, "truncated"),
        "starts": None if starts is None else list(starts),
        "infos": infos,
    }
    if client._remote is None:
        return _local(client, rows)
    actions = _send(client._remote, client.client_id, rows)
    return decoded_all(client._space()[1], actions)


def _send(remote: RemoteInference, client_id: str, rows: dict[str, Any]) -> list[Any]:
    """The rows as one request; the actions as JSON values."""
    ids, registry = rows["episode_ids"], remote.episodes
    for episode_id, start in zip(ids, rows["starts"] or (), strict=False):
        if start is not None and episode_id not in registry:  # a batch's own: by the client
            registry[episode_id] = remote.routed(client_id)
    states = [registry.get(i) or remote.episode(i) for i in ids]
    logged = [state.rewards.get(_AGENT, 0.0) if state.rewards else 0.0 for state in states]
    rewards = rows["rewards"] + logged if any(logged) else rows["rewards"]  # log_returns' own
    body = {key: value for key, value in rows.items() if value is not None}
    body.update(rewards=rewards, requests=[state.request + 1 for state in states])
    if "starts" in body:
        mine = {"client_id": client_id}
        body["starts"] = [None if start is None else {**mine, **start} for start in body["starts"]]
    if "infos" in body:
        body["infos"] = [jsonable(info) for info in body["infos"]]
    actions = _post(states, body, remote.spaces()[0])
    for state in states:
        state.sent()
    for i in np.flatnonzero(rows["terminated"] | rows["truncated"]).tolist():
        del registry[ids[i]]
    return actions


def _post(states: list[RemoteEpisode], body: dict[str, Any], space: gym.Space[Any]) -> list[Any]:
    """The body as one request per route key among its episodes: one for a vector client's own
    episodes, which all have its key; episodes started on their own each have theirs, and may
    be on other servers. Large observations go as Arrow (:mod:`pipeline.client.binary`)."""
    groups: dict[str, list[int]] = {}
    for i, state in enumerate(states):
        groups.setdefault(state.headers[ROUTE_HEADER], []).append(i)
    actions: list[Any] = [None] * len(states)
    for rows in groups.values():
        part = body if len(groups) == 1 else {k: _take(v, rows) for k, v in body.items()}
        state = states[rows[0]]
        data = None
        if binary.large(part["observations"], len(rows)):
            data = binary.batch_body(space, part)
        kind = _JSON if data is None else {"Content-Type": binary.ARROW_TYPE}
        data = _encode(part) if data is None else data
        headers = {**kind, **state.headers}
        response = state.http.call("POST", "/v1/actions", data=data, headers=headers)
        for i, action in zip(rows, orjson.loads(response.content)["actions"], strict=True):
            actions[i] = action
    return actions


def _take(column: Any, rows: list[int]) -> Any:
    return column[rows] if isinstance(column, np.ndarray) else [column[i] for i in rows]


def _encode(body: dict[str, Any]) -> bytes:
    """The body as JSON: by orjson straight from numpy when every number is finite, else by
    ``json`` from lists (orjson would write NaN as null; the server must see, and name, NaN)."""
    observations = body["observations"]
    numeric = isinstance(observations, np.ndarray) and observations.dtype.kind in "fiub"
    # a sum each: NaN or inf anywhere makes it non-finite (an overflow only costs speed)
    if numeric and math.isfinite(float(observations.sum()) + float(body["rewards"].sum())):
        try:
            fast = {**body, "observations": np.ascontiguousarray(observations)}
            return orjson.dumps(fast, option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError:  # a dtype orjson does not write (float16)
            pass
    return json.dumps(jsonable(body), separators=(",", ":")).encode()


def _local(client: PolicyClient, rows: dict[str, Any]) -> list[Any]:
    """Local inference: the one-episode verbs, row by row (no round trips to save)."""
    actions: list[Any] = []
    starts, infos = rows["starts"], rows["infos"]
    for i, episode_id in enumerate(rows["episode_ids"]):
        start, info = starts and starts[i], infos and infos[i]
        observation, reward = row_of(rows["observations"], i), float(rows["rewards"][i])
        if start is not None:
            client.start_episode(
                episode_id,
                bool(start.get("training_enabled", True)),
                start.get("seed"),
                start.get("options"),
            )
        if reward != 0.0 or info is not None:
            client.log_returns(episode_id, reward, info)
        if rows["terminated"][i] or rows["truncated"][i]:
            client.end_episode(episode_id, observation, truncated=not rows["terminated"][i])
            actions.append(None)
        else:
            actions.append(client.get_action(episode_id, observation))
    return actions


def _observation_rows(observations: Any, n: int) -> Any:
    """``n`` rows as one array where they are one (the cheap body), else as ``n`` single ones."""
    if isinstance(observations, np.ndarray):
        if (len(observations) if observations.ndim else 0) != n:
            raise SchemaError.single(
                "observations", f"{n} rows (one per episode id)", f"shape {observations.shape}"
            )
        return observations
    if isinstance(observations, Mapping | tuple):  # a batch of a Dict or Tuple space
        return [row_of(observations, i) for i in range(n)]
    rows = list(observations)
    if len(rows) != n:
        raise SchemaError.single("observations", f"{n} rows (one per episode id)", f"{len(rows)}")
    if rows and all(isinstance(row, np.ndarray) for row in rows):
        with contextlib.suppress(ValueError):  # arrays of different shapes stay a list
            return np.stack(rows)
    return rows


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
    """The sub-envs of a gymnasium vector env as episodes of one client (remote or local): each
    vector step is one call of :func:`step_many`.

    When a sub-env resets itself (``autoreset_mode``: the vector env's
    ``metadata["autoreset_mode"]``, ``NEXT_STEP`` or ``SAME_STEP``, whose final observations ride
    in ``infos["final_obs"]``), its next observation opens a new episode. A sub-env whose episode
    ended gets its previous action for the vector env's next step (which the env ignores).
    """

    def __init__(
        self,
        client: PolicyClient,
        num_envs: int,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        training_enabled: bool = True,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ConfigError("VectorEpisodes", "num_envs", "an integer >= 1", num_envs)
        modes = (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP)
        mode = next((m for m in modes if autoreset_mode in (m, m.value)), None)
        if mode is None:
            raise ConfigError(
                "VectorEpisodes",
                "autoreset_mode",
                "AutoresetMode.NEXT_STEP or SAME_STEP",
                autoreset_mode,
            )
        self.client = client
        self.num_envs = num_envs
        self.autoreset_mode = mode
        self.training_enabled = training_enabled
        self.episode_ids: list[str | None] = [None] * num_envs  # None: its episode ended
        self._actions: list[Any] = [None] * num_envs

    def reset(
        self,
        observations: Any,
        seeds: Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> Any:
        """Open an episode per sub-env at the observations ``reset`` returned; their actions.

        Record the seed each sub-env was reset with (``SyncVectorEnv.reset(seed=s)`` seeds
        sub-env ``i`` with ``s + i``), and the episodes can be replayed one by one.
        """
        n = self.num_envs
        seeds = [None] * n if seeds is None else list(seeds)
        if len(seeds) != n:
            raise SchemaError.single("seeds", f"{n} seeds", f"{len(seeds)}")
        ids = [self.client._new_episode_id() for _ in range(n)]
        starts = [self._start(seed, options) for seed in seeds]
        actions = step_many(self.client, ids, observations, starts=starts)
        self.episode_ids = list(ids)
        return self._batch(actions)

    def step(
        self,
        observations: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        infos: Mapping[str, Any] | None = None,
    ) -> Any:
        """Log what the vector env's ``step`` returned; the actions for its next step."""
        n = self.num_envs
        rewards, terminated = _rewards(rewards, n), _flags(terminated, n, "terminated")
        truncated = _flags(truncated, n, "truncated")
        if self.autoreset_mode is AutoresetMode.SAME_STEP:
            return self._same_step(observations, rewards, terminated, truncated, infos or {})
        fresh = np.array([episode_id is None for episode_id in self.episode_ids])
        starts = None
        if fresh.any():  # they ended last step: these observations start their next episodes
            starts = [self._start(None, None) if new else None for new in fresh]
            for i in np.flatnonzero(fresh).tolist():
                self.episode_ids[i] = self.client._new_episode_id()
            rewards = np.where(fresh, 0.0, rewards)
            terminated, truncated = terminated & ~fresh, truncated & ~fresh
        ids: list[str] = self.episode_ids  # type: ignore[assignment]  # every sub-env has one now
        actions = step_many(self.client, ids, observations, rewards, terminated, truncated, starts)
        for i in np.flatnonzero(terminated | truncated).tolist():
            self.episode_ids[i] = None
        return self._batch(actions)

    def close(
        self,
        observations: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        infos: Mapping[str, Any] | None = None,
    ) -> None:
        """Log the vector env's last step and end every episode there: those the envs ended as
        they say, the others as truncated (the simulator stopped, not the env)."""
        n = self.num_envs
        terminated = _flags(terminated, n, "terminated")
        done = terminated | _flags(truncated, n, "truncated")
        ids = [episode_id for episode_id in self.episode_ids if episode_id is not None]
        open_rows = [i for i, episode_id in enumerate(self.episode_ids) if episode_id]
        if self.autoreset_mode is AutoresetMode.SAME_STEP:  # every sub-env has an episode
            finals = _final_observations(observations, done, infos or {})
        else:
            finals = [row_of(observations, i) for i in open_rows]
        if open_rows:
            flags = terminated[open_rows]
            rewards = _rewards(rewards, n)[open_rows]
            step_many(self.client, ids, finals, rewards, flags, ~flags)
        self.episode_ids = [None] * n

    def _same_step(
        self,
        observations: Any,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: Mapping[str, Any],
    ) -> Any:
        """Each ended sub-env sends two rows: its final observation (``infos["final_obs"]``)
        ending the old episode, and the reset observation opening the new one."""
        n = self.num_envs
        done = terminated | truncated
        ended = np.flatnonzero(done).tolist()
        finals = _final_observations(observations, done, infos)
        fresh = [self.client._new_episode_id() for _ in ended]
        extra = np.zeros(len(ended), bool)
        actions = step_many(
            self.client,
            [i for i in self.episode_ids if i is not None] + fresh,
            finals + [row_of(observations, i) for i in ended],
            np.concatenate([rewards, np.zeros(len(ended))]),
            np.concatenate([terminated, extra]),
            np.concatenate([truncated, extra]),
            [None] * n + [self._start(None, None) for _ in ended],
        )
        for k, i in enumerate(ended):
            self.episode_ids[i] = fresh[k]
            actions[i] = actions[n + k]
        return self._batch(actions[:n])

    def _start(self, seed: int | None, options: Mapping[str, Any] | None) -> dict[str, Any]:
        start: dict[str, Any] = {"training_enabled": self.training_enabled}
        if seed is not None:
            start["seed"] = checked_seed(seed)
        if options is not None:
            start["options"] = jsonable(options)
        return start

    def _batch(self, actions: list[Any]) -> Any:
        """The actions as the vector env takes them; an ended sub-env repeats its last one."""
        actions = [self._actions[i] if a is None else a for i, a in enumerate(actions)]
        self._actions = actions
        space = self.client._space()[1]
        if not isinstance(space, gym.spaces.Dict | gym.spaces.Tuple):  # one array of actions
            return np.asarray(actions, dtype=space.dtype)
        out: Any = gym.vector.utils.create_empty_array(space, self.num_envs)
        return gym.vector.utils.concatenate(space, actions, out)


def _final_observations(observations: Any, done: np.ndarray, infos: Mapping[str, Any]) -> list[Any]:
    """Per sub-env, the observation its episode is at: the final one (``infos["final_obs"]``)
    where it ended this step under same-step autoreset, else the one ``step`` returned."""
    final: Any = infos.get("final_obs")
    if done.any() and final is None:
        raise SchemaError.single(
            "infos",
            "a 'final_obs' entry for the sub-envs that ended (same-step autoreset)",
            f"keys {sorted(infos)}",
        )
    return [final[i] if done[i] else row_of(observations, i) for i in range(len(done))]

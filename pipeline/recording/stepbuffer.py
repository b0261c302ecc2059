"""Local inference's step log: single-agent steps of a Box observation space, kept as numpy columns.

A local-inference client takes a step in tens of microseconds, so recording one as a dict (and
later converting thousands of dicts to Arrow) would cost more than the step. Here a step writes a
few values into preallocated arrays; the row of step ``t`` is complete when observation ``t+1``
(or the episode's end) arrives, and the upload thread takes the complete rows as one Arrow batch
of the step table, built column by column without touching a row in Python. Rows of episodes still
running stay behind for the next batch. The semantics are :mod:`pipeline.recording.recorder`'s
(rewards sum until the next action, a final row is ``terminated`` or ``truncated``), and so are the
rows.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.errors import SchemaError
from pipeline.format import codec, layout, schema, spaces
from pipeline.recording.recorder import AgentState, Episode, Pending

_AGENT = layout.DEFAULT_AGENT_ID
# a row's status: one small write completes it (three flags would be three numpy writes a step)
_PENDING, _COMPLETE, _TERMINATED, _TRUNCATED = 0, 1, 2, 3
# an agent's pending step while it lives here, as a row (what the recorder's rules look at)
_BUFFERED = Pending(None, None, None, None)


def fits(observation_space: gym.Space[Any]) -> bool:
    """Whether this log can hold an env's observations: a Box of floats."""
    return isinstance(observation_space, gym.spaces.Box) and observation_space.dtype.kind == "f"


class StepBuffer:
    """Steps of single-agent episodes, buffered as columns until uploaded.

    Args:
        observation_space: a Box of floats (see :func:`fits`).
        action_space: any space; a Discrete or a Box is kept as an array, others as objects.
        client_id: recorded in every row.
        ready_rows: complete rows that call ``on_ready`` (the uploader's wake-up).
        on_ready: called, without the buffer's lock, when ``ready_rows`` rows are complete.
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        client_id: str,
        ready_rows: int,
        on_ready: Callable[[], None],
    ) -> None:
        self._space = observation_space
        self._action_space = action_space
        self._schema = schema.step_schema(observation_space, action_space)
        self._client_id = client_id
        self._ready_rows, self._on_ready = ready_rows, on_ready
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # episode id -> the row of its pending step
        self._infos: dict[int, Any] = {}  # row -> info, for the few rows that have one
        self._n = 0
        self.ready = 0
        self._woken = False  # on_ready called since the last drain (once is enough)
        # a few values (CartPole's 4) are checked finite in Python in a fifth of the time of
        # isfinite().all(), whose two numpy calls cost more than the check itself
        shape = observation_space.shape or ()
        self._few = len(shape) == 1 and shape[0] <= 16
        self._allocate(1024)

    def check(self, observation: Any) -> np.ndarray:
        """The observation as an array of the space's dtype, or the error the server would send.

        Raises:
            SchemaError: naming the field, as :func:`pipeline.format.codec.to_arrow_rows` does.
        """
        space = self._space
        if isinstance(observation, np.ndarray) and observation.dtype == space.dtype:
            if observation.shape == space.shape and (
                all(map(math.isfinite, observation.tolist()))
                if self._few
                else np.isfinite(observation).all()
            ):
                return observation  # what envs hand out
        else:
            batch = codec.float_box_rows(space, [observation])
            if batch is not None:
                return batch[0]
        codec.to_arrow_rows(space, [observation], field="observation")  # raises, naming why
        raise SchemaError.single("observation", f"{space.dtype} of shape {space.shape}",
                                 "a value that does not fit")  # fmt: skip

    def step(self, episode: Episode, state: AgentState, x: np.ndarray, action: Any,
             logp: float | None, version: int | None) -> None:  # fmt: skip
        """Record an action taken at ``x``; ``x`` also completes the episode's pending step."""
        with self._lock:
            self._complete(episode.episode_id, state, x, False, False)
            i = self._n
            if i == len(self._t):
                self._grow()
            self._n = i + 1
            self._observation[i] = x
            self._action[i] = action
            self._logp[i] = math.nan if logp is None else logp
            self._version[i] = -1 if version is None else version
            self._t[i] = state.t
            self._episode[i] = episode.episode_id
            self._training[i] = episode.training_enabled
            self._pending[episode.episode_id] = i
            state.pending = _BUFFERED
            if self._woken or self.ready < self._ready_rows:
                return
            self._woken = True
        self._on_ready()

    def end(self, episode: Episode, state: AgentState, x: np.ndarray, truncated: bool) -> None:
        """The episode's last observation: its pending step becomes its final row."""
        with self._lock:
            self._complete(episode.episode_id, state, x, not truncated, truncated)

    def close(self, episode: Episode, state: AgentState) -> None:
        """The episode stops here: its pending step ends truncated at its own observation."""
        with self._lock:
            row = self._pending.get(episode.episode_id)
            if row is not None:
                self._complete(
                    episode.episode_id, state, self._observation[row].copy(), False, True
                )

    def pending(self, episode_id: str) -> bool:
        return episode_id in self._pending

    def drain(self) -> pa.RecordBatch | None:
        """The complete rows as one step batch, leaving the pending ones for later.

        The rows leave the buffer only once their batch is built: a batch that cannot be built
        raises and keeps them (to be surfaced, never dropped).
        """
        with self._lock:
            done = np.flatnonzero(self._status[: self._n] != _PENDING)
            if not len(done):
                return None
            columns = {name: array[done] for name, array in self._columns().items()}
            infos = [self._infos.get(int(i)) for i in done] if self._infos else None
        batch = self._batch(columns, infos)
        with self._lock:  # rows only ever get appended or completed meanwhile, never moved
            keep = np.ones(self._n, bool)
            keep[done] = False
            self._compact(np.flatnonzero(keep))
        return batch

    # --- inside the lock ---------------------------------------------------------------------

    def _complete(self, episode_id: str, state: AgentState, x: np.ndarray, terminal: bool,
                  truncated: bool) -> None:  # fmt: skip
        row = self._pending.pop(episode_id, None)
        if row is None:
            return
        terminal = terminal or state.terminated
        self._next_observation[row] = x
        self._reward[row] = state.reward
        self._status[row] = _TERMINATED if terminal else _TRUNCATED if truncated else _COMPLETE
        if state.info is not None:
            self._infos[row] = state.info
        self.ready += 1
        state.advance(state.reward, terminal)

    def _allocate(self, capacity: int) -> None:
        shape, dtype = (capacity, *(self._space.shape or ())), self._space.dtype
        self._observation = np.empty(shape, dtype)
        self._next_observation = np.empty(shape, dtype)
        discrete = isinstance(self._action_space, gym.spaces.Discrete)
        self._action = np.empty(capacity, np.int64 if discrete else object)
        self._reward = np.zeros(capacity, np.float64)
        self._logp = np.empty(capacity, np.float64)
        self._version = np.empty(capacity, np.int64)
        self._t = np.empty(capacity, np.int64)
        self._episode = np.empty(capacity, object)
        self._training = np.empty(capacity, bool)
        self._status = np.zeros(capacity, np.int8)

    def _columns(self) -> dict[str, np.ndarray]:
        return {
            "observation": self._observation, "next_observation": self._next_observation,
            "action": self._action, "reward": self._reward, "action_logp": self._logp,
            "policy_version": self._version, "t": self._t, "episode_id": self._episode,
            "training_enabled": self._training, "status": self._status,
        }  # fmt: skip

    def _grow(self) -> None:
        """Double the capacity (the server is away, or episodes run long): nothing is dropped."""
        old, n = self._columns(), self._n
        self._allocate(2 * len(self._t))
        for name, array in self._columns().items():
            array[:n] = old[name][:n]

    def _compact(self, keep: np.ndarray) -> None:
        """Move the pending rows to the front, renumbering what points at them."""
        for array in self._columns().values():
            array[: len(keep)] = array[keep]
        self._status[len(keep) : self._n] = _PENDING
        moved = {int(old): new for new, old in enumerate(keep)}
        self._pending = {episode_id: moved[row] for episode_id, row in self._pending.items()}
        self._infos = {moved[row]: info for row, info in self._infos.items() if row in moved}
        self._n = len(keep)
        self.ready = int(np.count_nonzero(self._status[: self._n] != _PENDING))
        self._woken = False

    # --- outside the lock --------------------------------------------------------------------

    def _batch(self, columns: dict[str, np.ndarray], infos: list[Any] | None) -> pa.RecordBatch:
        n = len(columns["t"])
        logp, version, status = columns["action_logp"], columns["policy_version"], columns["status"]
        arrays = {
            "episode_id": pa.array(columns["episode_id"], pa.string()),
            "agent_id": pa.repeat(pa.scalar(_AGENT, pa.string()), n),
            "t": pa.array(columns["t"]),
            "observation": _box_column(self._space, columns["observation"]),
            "action": _action_column(self._action_space, columns["action"]),
            "reward": pa.array(columns["reward"]),
            "next_observation": _box_column(self._space, columns["next_observation"]),
            "terminated": pa.array(status == _TERMINATED),
            "truncated": pa.array(status == _TRUNCATED),
            "action_logp": pa.array(logp, mask=np.isnan(logp)),
            "policy_version": pa.array(version, mask=version < 0),
            "training_enabled": pa.array(columns["training_enabled"]),
            "info": _info_column(infos, n),
            "client_id": pa.repeat(pa.scalar(self._client_id, pa.string()), n),
            "logged_at": pa.repeat(pa.scalar(datetime.now(UTC), schema.TIMESTAMP), n),
        }
        return pa.RecordBatch.from_arrays([arrays[f.name] for f in self._schema],
                                          schema=self._schema)  # fmt: skip


def _box_column(space: gym.Space[Any], batch: np.ndarray) -> pa.Array:
    flat = pa.array(batch.reshape(-1))
    arrow = spaces.space_to_arrow(space)
    if pa.types.is_fixed_size_list(arrow):
        return pa.FixedSizeListArray.from_arrays(flat, type=arrow)
    return flat


def _action_column(space: gym.Space[Any], actions: np.ndarray) -> pa.Array:
    if isinstance(space, gym.spaces.Discrete):
        return pa.array(actions)
    return codec.to_arrow_rows(space, list(actions), field="action")


def _info_column(infos: list[Any] | None, n: int) -> pa.Array:
    if not infos:
        return pa.nulls(n, pa.string())
    return pa.array([_text(info) for info in infos], pa.string())


def _text(info: Any) -> str | None:
    """``info`` as JSON text (a string that is JSON text already is kept as it is)."""
    if info is None:
        return None
    if isinstance(info, str):
        try:
            json.loads(info)
            return info
        except json.JSONDecodeError:
            pass
    return json.dumps(info, allow_nan=False, default=schema.json_default)

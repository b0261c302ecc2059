"""Local inference: the client acts with the policy it pulled and records the steps it takes.

Each call goes through the step core (:mod:`pipeline.recording.recorder`) as a request does on
the server: a step that cannot be stored is refused at the call, with a ``SchemaError``. The rows
wait in a :class:`RowBuffer` until the upload thread (:mod:`pipeline.client.spool`) drains them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.client import spool
from pipeline.client.remote import opened
from pipeline.client.transport import jsonable
from pipeline.errors import SchemaError
from pipeline.format import codec, layout, samples, schema
from pipeline.policy.network import NumpyPolicy
from pipeline.recording import batches, recorder
from pipeline.recording.episode import Episode, Returns
from pipeline.recording.recorder import CLOSED, Completion, Steps

_AGENT = layout.DEFAULT_AGENT_ID


BUFFER_BYTES = 32 * 2**20
"""About the most bytes of rows a client keeps in memory for its upload thread: a simulator
that plays faster than batches can be sent (or spooled) waits at its next call, rather than
growing the buffer without end (an 84x84x3 frame is a 42 KB row: observation and next one)."""


class RowBuffer:
    """Complete step rows and episode summaries waiting for the upload thread.

    Its bounds are in rows and in bytes, whatever an observation's size: ``ready_rows`` waiting
    steps, or a batch's worth (:data:`pipeline.client.spool.BATCH_ROWS` and ``BATCH_BYTES``),
    call ``on_ready`` (without the buffer's lock) to wake it; :meth:`drain` builds batches of
    at most a batch's worth (one Arrow array of every buffered frame passed Arrow's 2^31
    limit); and :meth:`add` waits while about ``buffer_bytes`` of rows are waiting.
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ready_rows: int,
        on_ready: Callable[[], None],
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self._spaces = observation_space, action_space
        self._schema = schema.step_schema(observation_space, action_space)
        row_bytes = _row_bytes(observation_space, action_space)
        self.batch_rows = max(1, min(spool.BATCH_ROWS, spool.BATCH_BYTES // row_bytes))
        self.wake_rows = min(ready_rows, self.batch_rows)
        self.max_rows = max(self.batch_rows, buffer_bytes // row_bytes)
        self._on_ready = on_ready
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)
        self._steps: list[tuple[Any, ...]] = []
        self._summaries: list[dict[str, Any]] = []
        self._stuck: BaseException | None = None  # the last build failed: waiting is in vain

    @property
    def ready(self) -> int:
        """Rows waiting: steps and summaries."""
        return len(self._steps) + len(self._summaries)

    def add(self, done: Completion) -> None:
        """Keep a call's rows; first wait (waking the upload thread) while the buffer is full."""
        if not done.rows and not done.summaries:
            return
        with self._lock:
            while len(self._steps) >= self.max_rows and self._stuck is None:
                self._lock.release()
                try:
                    self._on_ready()
                finally:
                    self._lock.acquire()
                self._taken.wait(0.1)
            self._steps += done.rows
            self._summaries += done.summaries
            wake = len(self._steps) >= self.wake_rows
        if wake:
            self._on_ready()

    def drain(self) -> list[tuple[str, pa.RecordBatch]]:
        """The waiting rows as batches of at most ``batch_rows`` steps, steps first (an
        episode's summary follows its steps). Rows leave the buffer only once built."""
        with self._lock:
            steps, summaries = self._steps[:], self._summaries[:]
        out = []
        try:
            for start in range(0, len(steps), self.batch_rows):
                columns = recorder.columns_of(steps[start : start + self.batch_rows])
                batch = schema.steps_from_columns(self._schema, columns, *self._spaces)
                out.append((layout.STEPS, batch))  # logged_at: the schema's default, now
            if summaries:
                batch = schema.episodes_from_columns(schema.rows_to_columns(summaries))
                out.append((layout.EPISODES, batch))
        except BaseException as error:
            self._stuck = error
            raise
        with self._lock:  # rows are only appended meanwhile
            del self._steps[: len(steps)]
            del self._summaries[: len(summaries)]
            self._stuck = None
            self._taken.notify_all()
        return out


def _row_bytes(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> int:
    """About the bytes of one step row: two observations, an action, and the rest (~100)."""
    sizes = [
        codec.to_arrow(space, samples.sample_batch(space, 1, 0)).nbytes
        for space in (observation_space, action_space)
    ]
    return 2 * sizes[0] + sizes[1] + 128


class LocalInference:
    """The episodes a local-inference client has open, and the policy it acts with; ``rng``
    samples actions, ``rows`` holds complete rows for the upload thread."""

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        env_id: str | None,
        client_id: str,
        rng: np.random.Generator,
        rows: RowBuffer,
    ) -> None:
        self.observation_space, self.action_space = observation_space, action_space
        self.env_id, self.client_id = env_id, client_id
        self.policy: NumpyPolicy | None = None
        self.rows = rows
        self._rng = rng
        self._episodes: dict[str, Episode] = {}
        self._random: list[Any] = []

    def start(
        self,
        episode_id: str,
        training_enabled: bool,
        seed: int | None,
        options: Mapping[str, Any] | None,
    ) -> None:
        self._episodes[episode_id] = Episode(
            episode_id,
            self.client_id,
            training_enabled,
            seed,
            None if options is None else json.dumps(jsonable(options)),
            self.env_id,
        )

    def episode(self, episode_id: str) -> Episode:
        return opened(self._episodes, episode_id)

    def step(self, episode_id: str, observation: Any, action: Any, multiagent: bool) -> Any:
        """get_action (``action`` None: the policy picks, and the action is returned) or
        log_action (the simulator's ``action`` is recorded)."""
        steps = self._steps(self.episode(episode_id), observation, multiagent, None)
        if action is not None:
            given = action if multiagent else {_AGENT: action}
            names = [_name("action", multiagent, a) for a in steps.agent_ids]
            missing = [a for a in steps.agent_ids if a not in given]
            if missing:
                raise SchemaError.single(
                    "actions", "an action for every observed agent", f"none for {missing}"
                )
            values = [given[a] for a in steps.agent_ids]
            checked = batches.checked(self.action_space, values, names)
            steps.actions = [batches.row_of(checked, i) for i in range(len(values))]
        done = recorder.complete(steps)
        actions, logp, version = self._actions(steps, done.acting)
        self.rows.add(done)
        recorder.commit(steps, done, actions, logp, version)
        steps.touched[0].multiagent = multiagent
        if action is not None:
            return None
        chosen = {steps.agent_ids[i]: a for i, a in zip(done.acting, actions, strict=True)}
        return chosen if multiagent else chosen.get(_AGENT)

    def add_returns(self, episode_id: str, returns: Returns) -> None:
        self.episode(episode_id).add_returns(returns)

    def add_reward(self, episode_id: str, reward: float) -> None:
        self.episode(episode_id).add_reward(_AGENT, reward)

    def end(self, episode_id: str, observation: Any, truncated: bool, multiagent: bool) -> None:
        end = recorder.TRUNCATED if truncated else recorder.TERMINATED
        steps = self._steps(self.episode(episode_id), observation, multiagent, end)
        done = recorder.complete(steps)
        self.rows.add(done)
        recorder.commit(steps, done, [], [], None)
        del self._episodes[episode_id]

    def close_all(self) -> bool:
        """Close the episodes still open, as the server closes abandoned ones: their pending
        steps truncated, ``end_reason`` ``closed``; their rows wait for the upload thread."""
        for episode_id in list(self._episodes):
            done = recorder.close(self._episodes.pop(episode_id), CLOSED)
            self.rows.add(done)
            recorder.settle(done)
        return True

    def _steps(
        self, episode: Episode, observation: Any, multiagent: bool, end: str | None
    ) -> Steps:
        """One call's rows, the observations checked (refused here, naming the field)."""
        episode.check_form(multiagent)
        observations = dict(observation) if multiagent else {_AGENT: observation}
        agent_ids = list(observations)
        names = [_name("observation", multiagent, a) for a in agent_ids]
        batch = batches.checked(self.observation_space, list(observations.values()), names)
        n = len(agent_ids)
        return Steps(
            [episode] * n,
            agent_ids,
            batch,
            [0.0] * n,
            ends={} if end is None else {episode.episode_id: end},
            touched=[episode],
        )

    def _actions(self, steps: Steps, acting: list[int]) -> tuple[list[Any], list[Any], Any]:
        """Logged actions as given; else the policy's (or uniform ones, before any policy)."""
        if steps.actions is not None:
            return [steps.actions[i] for i in acting], [None] * len(acting), None
        policy = self.policy
        if policy is None:
            return [self._random_action() for _ in acting], [None] * len(acting), None
        observations = steps.observations
        if len(acting) == 1 and isinstance(observations, np.ndarray):
            action, logp = policy.act_one(observations[acting[0]], self._rng)
            return [action], [logp], policy.version
        chosen, logps = policy.act(batches.take(observations, acting), self._rng)
        actions = [batches.row_of(chosen, n) for n in range(len(acting))]
        return actions, [float(lp) for lp in logps], policy.version

    def _random_action(self) -> Any:
        """Uniform actions, drawn a thousand at a time (a draw per step costs more than a step)."""
        if not self._random:
            batch = samples.sample_batch(self.action_space, 1000, int(self._rng.integers(2**63)))
            self._random = [batches.row_of(batch, i) for i in range(1000)]
        return self._random.pop()


def _name(field: str, multiagent: bool, agent_id: str) -> str:
    return f"{field}s.{agent_id}" if multiagent else field

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

from pipeline.client.remote import opened
from pipeline.client.transport import jsonable
from pipeline.errors import SchemaError
from pipeline.format import codec, layout, schema
from pipeline.policy.network import NumpyPolicy
from pipeline.recording import batches, recorder
from pipeline.recording.episode import Episode, Returns
from pipeline.recording.recorder import CLOSED, Completion, Steps

_AGENT = layout.DEFAULT_AGENT_ID


class RowBuffer:
    """Complete step rows and episode summaries waiting for the upload thread; ``ready_rows``
    waiting steps call ``on_ready`` (without the buffer's lock) to wake it."""

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ready_rows: int,
        on_ready: Callable[[], None],
    ) -> None:
        self._spaces = observation_space, action_space
        self._schema = schema.step_schema(observation_space, action_space)
        self._ready_rows, self._on_ready = ready_rows, on_ready
        self._lock = threading.Lock()
        self._steps: list[tuple[Any, ...]] = []
        self._summaries: list[dict[str, Any]] = []

    @property
    def ready(self) -> int:
        """Rows waiting: steps and summaries."""
        return len(self._steps) + len(self._summaries)

    def add(self, done: Completion) -> None:
        if not done.rows and not done.summaries:
            return
        with self._lock:
            self._steps += done.rows
            self._summaries += done.summaries
            wake = len(self._steps) >= self._ready_rows
        if wake:
            self._on_ready()

    def drain(self) -> list[tuple[str, pa.RecordBatch]]:
        """The waiting rows as batches, steps first (an episode's summary follows its steps).
        Rows leave the buffer only once their batch is built."""
        with self._lock:
            steps, summaries = self._steps[:], self._summaries[:]
        out = []
        if steps:  # logged_at: the schema's default, now
            columns = recorder.columns_of(steps)
            batch = schema.steps_from_columns(self._schema, columns, *self._spaces)
            out.append((layout.STEPS, batch))
        if summaries:
            batch = schema.episodes_from_columns(schema.rows_to_columns(summaries))
            out.append((layout.EPISODES, batch))
        with self._lock:  # rows are only appended meanwhile
            del self._steps[: len(steps)]
            del self._summaries[: len(summaries)]
        return out


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
            batch = codec.sample_batch(self.action_space, 1000, int(self._rng.integers(2**63)))
            self._random = [batches.row_of(batch, i) for i in range(1000)]
        return self._random.pop()


def _name(field: str, multiagent: bool, agent_id: str) -> str:
    return f"{field}s.{agent_id}" if multiagent else field

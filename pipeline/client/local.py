"""Local inference: the client acts with the policy it pulled and records the steps it takes.

:class:`~pipeline.client.PolicyClient` in ``"local"`` mode hands its verbs here and uploads
what comes out. Single-agent steps of a Box observation space (most simulators) take the fast
path: one numpy check of the observation, the policy run on one vector
(:meth:`~pipeline.policy.NumpyPolicy.act_one`), and a few values written into
:class:`~pipeline.recording.stepbuffer.StepBuffer`'s columns. Everything else (multi-agent dicts,
other spaces) goes through :mod:`pipeline.recording.recorder`'s rows. Both make the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from math import isfinite
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa

from pipeline.client.transport import jsonable, row_of
from pipeline.errors import EpisodeError
from pipeline.format import codec, layout, schema
from pipeline.policy.network import NumpyPolicy
from pipeline.recording.recorder import Episode, Pending, unattributed
from pipeline.recording.stepbuffer import StepBuffer, fits

_AGENT = layout.DEFAULT_AGENT_ID
Emit = Callable[[str, Sequence[Mapping[str, Any]]], None]  # (table, rows) to upload


class LocalInference:
    """The episodes a local-inference client has open, and how its steps become rows.

    Args:
        observation_space: the server's observation space.
        action_space: the server's action space.
        env_id: recorded with each episode.
        client_id: recorded with each row.
        rng: samples actions.
        emit: takes rows to upload (the uploader's ``add``).
        ready_rows: buffered complete steps that call ``on_ready``.
        on_ready: wakes the uploader.
    """

    def __init__(self, observation_space: gym.Space[Any], action_space: gym.Space[Any],
                 env_id: str | None, client_id: str, rng: np.random.Generator, emit: Emit,
                 ready_rows: int, on_ready: Callable[[], None]) -> None:  # fmt: skip
        self.observation_space, self.action_space = observation_space, action_space
        self.env_id, self.client_id = env_id, client_id
        self.policy: NumpyPolicy | None = None
        self._rng, self._emit = rng, emit
        self._episodes: dict[str, Episode] = {}
        self._random: list[Any] = []
        self.steps = (
            StepBuffer(observation_space, action_space, client_id, ready_rows, on_ready)
            if fits(observation_space)
            else None
        )  # fmt: skip

    def start(self, episode_id: str, training_enabled: bool, seed: int | None,
              options: Mapping[str, Any] | None) -> None:  # fmt: skip
        self._episodes[episode_id] = Episode(
            episode_id, self.client_id, training_enabled, seed,
            None if options is None else json.dumps(jsonable(options)), self.env_id,
        )  # fmt: skip

    def episode(self, episode_id: str) -> Episode:
        try:
            return self._episodes[episode_id]
        except KeyError:
            raise EpisodeError(404, f"episode '{episode_id}' is not open in this client; call "
                                    "start_episode() first") from None  # fmt: skip

    def step(self, episode_id: str, observation: Any, action: Any, multiagent: bool) -> Any:
        """get_action (``action`` None: the policy picks, and the action is returned) or
        log_action (the simulator's ``action`` is recorded)."""
        episode = self.episode(episode_id)
        episode.check_form(multiagent)
        if self.steps is not None and not multiagent:
            return self._fast_step(self.steps, episode, observation, action)
        return self._row_step(episode, observation, action, multiagent)

    def add_reward(self, episode_id: str, reward: float) -> None:
        """log_returns for one agent with nothing but a reward: the common case, kept short."""
        state = self.episode(episode_id).agents.get(_AGENT)
        if state is None or state.pending is None:
            unattributed(episode_id, _AGENT, reward)
            return
        total = state.reward + reward  # AgentState.with_reward's check, inlined: a step's cost
        if isfinite(total) and isfinite(state.episode_return + total):
            state.reward = total
        else:
            state.with_reward(reward)  # raises, naming the field

    def add_returns(self, episode_id: str, rewards: dict[str, float], infos: dict[str, Any],
                    dones: dict[str, bool]) -> None:  # fmt: skip
        self.episode(episode_id).add_rewards(rewards, infos, dones)

    def end(self, episode_id: str, observation: Any, truncated: bool, multiagent: bool) -> None:
        """The episode's last observation: its final rows and its episodes-table rows."""
        episode = self.episode(episode_id)
        episode.check_form(multiagent)
        observations = {_AGENT: observation} if not multiagent else dict(observation)
        if self.steps is not None and not multiagent:
            x = self.steps.check(observation)
            self.steps.end(episode, episode.agent(_AGENT), x, truncated)
        else:
            self._observation_batch(list(observations.values()))  # refuse a bad one at the call
        rows = episode.end_rows(observations, {}, {}, truncated)
        episode.commit(rows, {})
        del self._episodes[episode_id]
        if rows:
            self._emit(layout.STEPS, rows)
        reason = "truncated" if truncated else "terminated"
        self._emit(layout.EPISODES, episode.summary_rows(reason, (), set(observations)))

    def close_all(self) -> None:
        """Close the episodes still open, as the server closes abandoned ones: their pending
        steps truncated, ``end_reason`` ``closed``."""
        for episode_id in list(self._episodes):
            episode = self._episodes.pop(episode_id)
            if self.steps is not None and self.steps.pending(episode_id):
                self.steps.close(episode, episode.agent(_AGENT))
            rows = episode.close_rows({}, truncated=True)
            episode.commit(rows, {})
            if rows:
                self._emit(layout.STEPS, rows)
            self._emit(layout.EPISODES, episode.summary_rows("closed"))

    def build(self, table: str, rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
        """Rows of a table as a validated batch (the uploader calls this)."""
        columns = schema.rows_to_columns(rows)
        if table == layout.EPISODES:
            return schema.episodes_from_columns(columns)
        return schema.steps_from_columns(
            schema.step_schema(self.observation_space, self.action_space), columns,
            self.observation_space, self.action_space,
        )  # fmt: skip

    # --- the fast path -----------------------------------------------------------------------

    def _fast_step(self, steps: StepBuffer, episode: Episode, observation: Any,
                   action: Any) -> Any:  # fmt: skip
        state = episode.agent(_AGENT)
        x = steps.check(observation)
        if state.terminated:  # a done dict ended this agent: complete its step, act no more
            steps.end(episode, state, x, truncated=False)
            return None
        if action is not None:
            codec.to_arrow_rows(self.action_space, [action], field="action")  # refuse it now
            steps.step(episode, state, x, action, None, None)
            return None
        policy = self.policy
        if policy is None:
            chosen, logp, version = self._random_action(), None, None
        else:
            chosen, logp = policy.act_one(x, self._rng)
            version = policy.version
        steps.step(episode, state, x, chosen, logp, version)
        return chosen

    # --- rows, for everything else ------------------------------------------------------------

    def _row_step(self, episode: Episode, observation: Any, action: Any, multiagent: bool) -> Any:
        observations = dict(observation) if multiagent else {_AGENT: observation}
        batch = self._observation_batch(list(observations.values()))
        acting = [a for a in observations if not episode.agent(a).terminated]
        if action is None:
            if len(acting) < len(observations):
                keep = [list(observations).index(a) for a in acting]
                batch = batch[keep] if isinstance(batch, np.ndarray) else batch.take(keep)
            chosen = self._act(batch)
            pending = {a: Pending(observations[a], *chosen[i]) for i, a in enumerate(acting)}
        else:
            given = action if multiagent else {_AGENT: action}
            codec.to_arrow_rows(self.action_space, [given[a] for a in acting], field="action")
            pending = {a: Pending(observations[a], given[a], None, None) for a in acting}
        rows = episode.complete(observations, {}, {}, {})
        episode.commit(rows, pending)
        if rows:
            self._emit(layout.STEPS, rows)
        if action is not None:
            return None
        out = {a: p.action for a, p in pending.items()}
        return out if multiagent else out.get(_AGENT)

    def _observation_batch(self, values: list[Any]) -> np.ndarray | pa.Array:
        """The observations checked against the space: a numpy batch for a float Box (checked
        in a few microseconds), else an Arrow column.

        Raises:
            SchemaError: as the server would answer 400, naming the field.
        """
        batch = codec.float_box_rows(self.observation_space, values)
        if batch is not None:
            return batch
        return codec.to_arrow_rows(self.observation_space, values, field="observation")

    def _act(self, batch: np.ndarray | pa.Array) -> list[tuple[Any, float | None, int | None]]:
        n = len(batch)
        policy = self.policy
        if policy is None:
            return [(self._random_action(), None, None) for _ in range(n)]
        if isinstance(batch, pa.Array):
            batch = codec.from_arrow(self.observation_space, batch)
        actions, logp = policy.act(batch, self._rng)
        return [(row_of(actions, i), float(logp[i]), policy.version) for i in range(n)]

    def _random_action(self) -> Any:
        """Uniform actions, drawn a thousand at a time (a draw per step costs more than a step)."""
        if not self._random:
            batch = codec.sample_batch(self.action_space, 1000, int(self._rng.integers(2**63)))
            self._random = [row_of(batch, i) for i in range(1000)]
        return self._random.pop()

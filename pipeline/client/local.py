"""Local inference: the client acts with the policy it pulled and records the steps it takes.

Each call goes through the step core (:mod:`pipeline.recording.recorder`) as a request does on
the server: a step that cannot be stored is refused at the call, with a ``SchemaError``. The rows
wait in a :class:`RowBuffer` until the upload thread (:mod:`pipeline.client.spool`) drains them.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from pipeline.recording.episode import AgentState, Episode, Pending, Returns
from pipeline.recording.recorder import CLOSED, Steps

_AGENT = layout.DEFAULT_AGENT_ID
_OBSERVATION, _ACTION = ("observation",), ("action",)  # a single agent's fields, in errors
_ALONE = frozenset([_AGENT])  # the agent a single-agent end observes

BUFFER_BYTES = 32 * 2**20
"""About the most bytes of rows a client keeps in memory for its upload thread: a simulator
that plays faster than batches can be sent (or spooled) waits at its next call, rather than
growing the buffer without end (an 84x84x3 frame is a 42 KB row: observation and next one)."""


class RowBuffer:
    """Complete step rows and episode summaries waiting for the upload thread.

    Its bounds are in rows and in bytes, whatever an observation's size: once ``ready_rows``
    steps (or a batch's worth: :data:`pipeline.client.spool.BATCH_ROWS` and ``BATCH_BYTES``)
    wait, or the oldest has waited ``build_after_s``, :meth:`add` builds them into Arrow batches
    in the caller's thread (unless the upload thread is building) and calls ``on_ready`` to wake
    the upload thread; :meth:`drain` hands over the batches built (building rows that waited
    that long, or all of them); and :meth:`add` waits while about ``buffer_bytes`` of rows are
    waiting.

    Why the simulator's thread builds: a build is many short calls into pyarrow and numpy that
    release the GIL, and the simulator's own numpy calls release it too, so a build in a second
    thread hands the GIL back and forth thousands of times. Measured with one CartPole client,
    that cost the build 15 us of CPU a row instead of 3, and the simulator's steps a third
    more. The upload thread now only sends bytes, which releases the GIL for as long as the
    network takes.
    """

    def __init__(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ready_rows: int,
        on_ready: Callable[[], None],
        build_after_s: float = 0.5,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self._spaces = observation_space, action_space
        self._schema = schema.step_schema(observation_space, action_space)
        row_bytes = _row_bytes(observation_space, action_space)
        self.batch_rows = max(1, min(spool.BATCH_ROWS, spool.BATCH_BYTES // row_bytes))
        self.wake_rows = min(ready_rows, self.batch_rows)
        self.max_rows = max(self.batch_rows, buffer_bytes // row_bytes)
        self._on_ready = on_ready
        self._build_after = build_after_s
        self._due_at = math.inf  # when the oldest row not yet built has waited build_after_s
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)
        self._building = threading.Lock()  # one build at a time
        self._steps: list[tuple[Any, ...]] = []
        self._summaries: list[dict[str, Any]] = []
        self._built: list[tuple[str, pa.RecordBatch]] = []
        self._built_rows = 0
        self._stuck: BaseException | None = None  # the last build failed: waiting is in vain

    @property
    def ready(self) -> int:
        """Rows waiting: steps and summaries, built or not."""
        return len(self._steps) + len(self._summaries) + self._built_rows

    def add(self, rows: list[tuple[Any, ...]], summaries: Sequence[dict[str, Any]] = ()) -> None:
        """Keep a call's step rows (in the step core's column order) and episode summaries;
        first wait (waking the upload thread) while the buffer is full. Once enough wait, build
        them (a failed build keeps them: :meth:`drain` raises it)."""
        if not rows and not summaries:
            return
        with self._lock:
            steps = self._steps
            while len(steps) + self._built_rows >= self.max_rows and self._stuck is None:
                self._lock.release()
                try:
                    self._on_ready()
                finally:
                    self._lock.acquire()
                self._taken.wait(0.1)
            now = time.monotonic()
            if self._due_at == math.inf:  # none waited
                self._due_at = now + self._build_after
            steps += rows
            if summaries:
                self._summaries += summaries
            due = len(steps) >= self.wake_rows or now >= self._due_at
        if due and self._stuck is None:
            woken = True  # by a batch built, or a build failed (the upload thread raises it)
            with contextlib.suppress(Exception):  # kept in _stuck, raised by the next drain
                woken = self._build(wait=False)
            if woken:
                self._on_ready()

    def drain(self, everything: bool) -> list[tuple[str, pa.RecordBatch]]:
        """The waiting rows as batches of at most ``batch_rows`` steps, steps first (an
        episode's summary follows its steps): all of them, or (``everything=False``) those
        built, and the rest once the oldest has waited ``build_after_s`` (a simulator that calls
        builds them itself). Rows leave the buffer only once built; a failed build is tried
        again here, and raised."""
        if everything or self._stuck is not None or self.due_in() <= 0:
            self._build()
        with self._lock:
            out, self._built, self._built_rows = self._built, [], 0
            self._taken.notify_all()
        return out

    def due_in(self) -> float:
        """Seconds until the oldest row not yet built has waited ``build_after_s`` (inf: none
        waits, or the last build failed)."""
        if self._stuck is not None:
            return math.inf
        return self._due_at - time.monotonic()

    def _build(self, wait: bool = True) -> bool:
        """Turn the rows waiting now into batches, appended to those built before; without
        ``wait``, only when no build is under way (False: none was made). A simulator does not
        wait for the upload thread's build: on 2 cores shared by 8 clients, waiting for it took
        a fifth of the simulator's time spent building."""
        if not self._building.acquire(blocking=wait):
            return False
        try:
            self._build_waiting()
        finally:
            self._building.release()
        return True

    def _build_waiting(self) -> None:
        """:meth:`_build`'s work, one build at a time (batches keep the rows' order)."""
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
            self._built += out
            self._built_rows += len(steps) + len(summaries)
            waiting = self._steps or self._summaries
            self._due_at = time.monotonic() + self._build_after if waiting else math.inf
            self._stuck = None


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
        episode = self.episode(episode_id)
        if multiagent:
            return self._step_agents(episode, observation, action)
        current, state, row = self._observe(episode, observation, None)
        logged = None if action is None else self._logged([action], _ACTION)[0]
        chosen = logp = version = None
        if not state.terminated:  # flagged done, the agent acts no more
            if logged is None:
                chosen, logp, version = self._chosen_one(current)
            else:
                chosen = logged
        self.rows.add([row] if row is not None else [])
        if row is not None:  # safe: the step core's commit, for one row
            recorder.advance(state, row)
        if chosen is not None:
            episode.agent(_AGENT).pending = Pending(current, chosen, logp, version)
        episode.multiagent = False
        return chosen if logged is None else None

    def _step_agents(self, episode: Episode, observation: Any, action: Any) -> Any:
        """:meth:`step` of a multi-agent episode, through the step core's batch form."""
        steps = self._steps(episode, observation, None)
        if action is not None:
            missing = [a for a in steps.agent_ids if a not in action]
            if missing:
                raise SchemaError.single(
                    "actions", "an action for every observed agent", f"none for {missing}"
                )
            names = [f"actions.{a}" for a in steps.agent_ids]
            steps.actions = self._logged([action[a] for a in steps.agent_ids], names)
        done = recorder.complete(steps)
        logp: list[Any]
        if steps.actions is not None:
            actions = [steps.actions[i] for i in done.acting]
            logp, version = [None] * len(actions), None
        else:
            actions, logp, version = self._chosen(steps.observations, done.acting)
        self.rows.add(done.rows, done.summaries)
        recorder.commit(steps, done, actions, logp, version)
        episode.multiagent = True
        if action is not None:
            return None
        return {steps.agent_ids[i]: a for i, a in zip(done.acting, actions, strict=True)}

    def add_returns(self, episode_id: str, returns: Returns) -> None:
        self.episode(episode_id).add_returns(returns)

    def add_reward(self, episode_id: str, reward: float) -> None:
        self.episode(episode_id).add_reward(_AGENT, reward)

    def end(self, episode_id: str, observation: Any, truncated: bool, multiagent: bool) -> None:
        end = recorder.TRUNCATED if truncated else recorder.TERMINATED
        episode = self.episode(episode_id)
        if multiagent:
            steps = self._steps(episode, observation, end)
            done = recorder.complete(steps)
            self.rows.add(done.rows, done.summaries)
            recorder.commit(steps, done, [], [], None)
        else:  # the episode goes: the agent need not advance
            row = self._observe(episode, observation, end)[2]
            rows = [row] if row is not None else []
            self.rows.add(rows, recorder.summary_rows(episode, end, rows, _ALONE))
        del self._episodes[episode_id]

    def close_all(self) -> bool:
        """Close the episodes still open, as the server closes abandoned ones: their pending
        steps truncated, ``end_reason`` ``closed``; their rows wait for the upload thread."""
        for episode_id in list(self._episodes):
            done = recorder.close(self._episodes.pop(episode_id), CLOSED)
            self.rows.add(done.rows, done.summaries)
            recorder.settle(done)
        return True

    def _observe(
        self, episode: Episode, observation: Any, end: str | None
    ) -> tuple[Any, AgentState, tuple[Any, ...] | None]:
        """A single agent's observation checked (refused here, naming the field) as the env
        gave it, the agent's state, and the row it completes by the step core's rule
        (:func:`~pipeline.recording.recorder.completed_row`), nothing changed."""
        episode.check_form(False)
        current = batches.one(self.observation_space, observation, _OBSERVATION)
        state = episode.seen(_AGENT)
        return (
            current,
            state,
            recorder.completed_row(
                episode, _AGENT, state, current, 0.0, None, end, state.terminated
            ),
        )

    def _steps(self, episode: Episode, observation: Any, end: str | None) -> Steps:
        """A multi-agent call's rows, the observations checked (refused here, naming the
        field)."""
        episode.check_form(True)
        agent_ids, values = list(observation), list(observation.values())
        names = [f"observations.{a}" for a in agent_ids]
        batch = batches.checked(self.observation_space, values, names)
        n = len(agent_ids)
        ends = recorder.NOTHING if end is None else {episode.episode_id: end}
        return Steps([episode] * n, agent_ids, batch, [0.0] * n, ends=ends, touched=(episode,))

    def _logged(self, values: list[Any], names: Sequence[str]) -> list[Any]:
        """Logged actions, checked (refused here, naming the field), as the env takes them."""
        checked = batches.checked(self.action_space, values, names)
        return [batches.row_of(checked, i) for i in range(len(values))]

    def _chosen_one(self, observation: Any) -> tuple[Any, float | None, int | None]:
        """:meth:`_chosen` for one observation, as the env gave it (a single agent's step)."""
        policy = self.policy
        if policy is None:
            return self._random_action(), None, None
        action, logp = policy.act_one(observation, self._rng)
        return action, logp, policy.version

    def _chosen(self, observations: Any, acting: list[int]) -> tuple[list[Any], list[Any], Any]:
        """The policy's actions for rows ``acting`` of a batch of observations, with their
        log-probabilities (uniform ones, before any policy)."""
        if len(acting) == 1 and type(observations) is np.ndarray:
            action, logp, version = self._chosen_one(observations[acting[0]])
            return [action], [logp], version
        policy = self.policy
        if policy is None:
            return [self._random_action() for _ in acting], [None] * len(acting), None
        chosen, logps = policy.act(batches.take(observations, acting), self._rng)
        actions = [batches.row_of(chosen, n) for n in range(len(acting))]
        return actions, [float(lp) for lp in logps], policy.version

    def _random_action(self) -> Any:
        """Uniform actions, drawn a thousand at a time (a draw per step costs more than a step)."""
        if not self._random:
            batch = samples.sample_batch(self.action_space, 1000, int(self._rng.integers(2**63)))
            self._random = [batches.row_of(batch, i) for i in range(1000)]
        return self._random.pop()

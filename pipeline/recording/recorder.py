"""The step core: how a simulator's calls become step-table rows, once, for every mode.

The server (one episode or many per request), the local-inference client and ``VectorEpisodes``
all hand their steps here as :class:`Steps`: a row per agent observed, the observations one
validated batch. :func:`complete` works out the step rows they finish, without changing any
state; the caller picks the actions, makes the rows safe (the server: durable in the writer)
and only then calls :func:`commit`, so a failed write changes nothing and the call can be
retried. A local client's single-agent step and end, a simulator's every call, apply the same
rules to their one observation without the batch form (:func:`completed_row`, and
:func:`summary_rows` at an end): for one row, the batch form's objects cost an eighth of a
local CartPole step.

The rules (``docs/protocol.md``, "What a step row holds") are here, with the state they advance
(:mod:`pipeline.recording.episode`), and nowhere else:

- An action opens an agent's *pending* step; the agent's next observation (its next step, or
  the episode's end) completes it into the row of step ``t``.
- Rewards accrue to the pending step; none logged means 0.0. A reward logged while the agent has
  no pending step (before its first action, or after its last) belongs to no transition: it is
  not stored, and :func:`~pipeline.recording.episode.unattributed` logs a warning. A reward that
  would make the step's sum or the return non-finite is refused at the call that gave it.
- An end completes the observed agents' pending steps as it says (terminated or truncated); an
  agent it does not observe is cut off: its pending step ends truncated at its own last
  observation, unless a done flag says it terminated.
- An agent flagged done acts no more; its next observation completes its last step, terminated.
- An episode is single-agent or multi-agent from its first step on.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence, Set
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import numpy as np

from pipeline.format import layout, schema
from pipeline.recording import batches
from pipeline.recording.episode import (
    AgentState,
    Episode,
    Pending,
    Returns,
    reward_sum,
    unattributed,
)

TERMINATED, TRUNCATED, CLOSED = "terminated", "truncated", "closed"
NOTHING: Mapping[str, Any] = MappingProxyType({})  # no ends, no returns: shared, read-only
STEP_COLUMNS = schema.STEP_COLUMNS[:-1]  # the rows made here; the writer stamps logged_at
_EPISODE_ID, _AGENT_ID, _REWARD, _TERMINATED = 0, 1, 5, 7  # positions in STEP_COLUMNS


class Steps:
    """Observations of one or more calls, a row per (episode, agent) observed: arrays in.

    ``observations`` is one batch of ``len(episodes)`` rows, validated against the observation
    space, in :mod:`pipeline.format.codec`'s layout (an array ``(n, *shape)`` for a Box).
    ``rewards[i]`` was logged with row ``i``'s observation, for the agent's pending step.
    ``ends`` (by episode id: TERMINATED or TRUNCATED) ends episodes at these observations.
    ``actions`` holds logged actions (log_action); without it the rows that act get the
    policy's. ``returns`` are what rides on a call for agents it does not observe (a multi-agent
    request's rewards, infos and done flags), by episode id. ``touched`` lists every episode of
    the calls, those that observe no agent included (an end with no observations).

    A plain class, not a dataclass: a simulator makes one a step, and the default factories
    cost more than the rest of it.
    """

    __slots__ = (
        "_rows",
        "actions",
        "agent_ids",
        "dones",
        "ends",
        "episodes",
        "infos",
        "observations",
        "returns",
        "rewards",
        "touched",
    )

    def __init__(
        self,
        episodes: list[Episode],
        agent_ids: list[str],
        observations: Any,
        rewards: list[float],
        infos: list[Any] | None = None,
        ends: Mapping[str, str] = NOTHING,
        dones: list[bool] | None = None,
        actions: list[Any] | None = None,
        returns: Mapping[str, Returns] = NOTHING,
        touched: Sequence[Episode] = (),
    ) -> None:
        self.episodes, self.agent_ids, self.observations = episodes, agent_ids, observations
        self.rewards, self.infos, self.ends, self.dones = rewards, infos, ends, dones
        self.actions, self.returns, self.touched = actions, returns, touched
        self._rows: list[Any] | None = None

    def __len__(self) -> int:
        return len(self.episodes)

    def observation(self, i: int) -> Any:
        """Row ``i``'s observation, as the env would take it."""
        if self._rows is None:
            self._rows = batches.rows_of(self.observations)
        return self._rows[i]


class Completion:
    """What :func:`complete` works out: the rows to write, and how to advance the agents."""

    __slots__ = ("acting", "advancing", "ending", "rows", "summaries", "sums")

    def __init__(self, ending: list[Episode] | None = None) -> None:
        self.rows: list[tuple[Any, ...]] = []  # values in STEP_COLUMNS order
        self.advancing: list[AgentState] = []  # per row, the agent it advances
        self.acting: list[int] = []  # rows of the Steps that open a pending step
        self.summaries: list[dict[str, Any]] = []  # of the episodes that end
        self.ending = [] if ending is None else ending
        self.sums: list[tuple[AgentState, float]] = []  # unobserved agents' reward sums

    @property
    def columns(self) -> dict[str, list[Any]]:
        """The rows column by column, as the writer takes them."""
        return columns_of(self.rows)


def columns_of(rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Step rows (tuples in STEP_COLUMNS order) column by column."""
    if not rows:
        return {name: [] for name in STEP_COLUMNS}
    transposed = zip(*rows, strict=True)
    return {name: list(values) for name, values in zip(STEP_COLUMNS, transposed, strict=True)}


def complete(steps: Steps) -> Completion:
    """The rows ``steps`` complete, the rows that act and the summaries of the episodes that
    end, with every agent's state unchanged (a SchemaError for a non-finite reward sum)."""
    done = Completion()
    ends, dones, infos, rewards = steps.ends, steps.dones, steps.infos, steps.rewards
    for i, (episode, agent_id) in enumerate(zip(steps.episodes, steps.agent_ids, strict=True)):
        state = episode.seen(agent_id)
        end = ends.get(episode.episode_id) if ends else None
        flagged = (dones is not None and dones[i]) or state.terminated
        info = infos[i] if infos is not None else None
        observation = steps.observation(i)
        row = completed_row(episode, agent_id, state, observation, rewards[i], info, end, flagged)
        if row is not None:
            done.rows.append(row)
            done.advancing.append(state)
        if end is None and not flagged:
            done.acting.append(i)
    if steps.returns or ends:
        _unobserved(steps, done)
    return done


def completed_row(
    episode: Episode,
    agent_id: str,
    state: AgentState,
    observation: Any,
    reward: float,
    info: Any,
    end: str | None,
    flagged: bool,
) -> tuple[Any, ...] | None:
    """The row an agent's ``observation`` completes, with ``reward`` logged with it, ended as
    ``end`` says or, ``flagged`` by a done flag, terminated; None when the agent has no pending
    step (the reward belongs to no transition, and is reported).

    The one rule of an observed agent's row, whatever the call: :func:`complete` applies it
    to each row of its calls, a local client's single-agent step to its one observation.
    Nothing changes: the caller advances the agent (:meth:`AgentState.advance`) once the row is
    safe. A SchemaError when the step's reward sum or the return would not be finite.
    """
    pending = state.pending
    if pending is None:
        unattributed(episode.episode_id, agent_id, reward)
        return None
    total = reward_sum(state.reward, reward, state.episode_return, agent_id)
    ended = end == TERMINATED or flagged, end == TRUNCATED and not flagged
    return _row(episode, agent_id, state, pending, total, observation, info, *ended)


def close(episode: Episode, reason: str = CLOSED) -> Completion:
    """An abandoned episode's rows and summary: every pending step ends truncated at its own
    last observation (terminated where a done flag says so)."""
    done = Completion(ending=[episode])
    _close_rows(episode, done, frozenset(), {}, Returns())
    done.summaries = summary_rows(episode, reason, done.rows, frozenset())
    return done


def commit(
    steps: Steps,
    done: Completion,
    actions: list[Any],
    action_logp: list[float | None],
    policy_version: int | None,
) -> None:
    """Advance the agents once ``done``'s rows are safe; ``actions`` are those of the rows in
    ``done.acting`` (logged ones, or the policy's with their log-probabilities)."""
    settle(done)
    for n, i in enumerate(done.acting):
        state = steps.episodes[i].agent(steps.agent_ids[i])
        state.pending = Pending(steps.observation(i), actions[n], action_logp[n], policy_version)
    if steps.dones is not None:
        for i in np.flatnonzero(steps.dones).tolist():
            steps.episodes[i].agent(steps.agent_ids[i]).terminated = True
    for state, total in done.sums:
        state.reward = total
    now = time.monotonic()
    for episode in steps.touched or steps.episodes:
        episode.last_seen = now
    if steps.returns:
        observed = _observed(steps, steps.returns.keys())
        for episode in _episodes(steps, steps.returns.keys()):
            returns = steps.returns.get(episode.episode_id)
            if returns is not None:
                returns.apply(episode, observed.get(episode.episode_id, frozenset()))


def settle(done: Completion) -> None:
    """Advance the agents of ``done``'s rows, once they are safe (all :func:`close` needs)."""
    for state, row in zip(done.advancing, done.rows, strict=True):
        advance(state, row)


def advance(state: AgentState, row: tuple[Any, ...]) -> None:
    """Advance an agent past its pending step, whose row (made of its state) is safe."""
    state.advance(row[_REWARD], row[_TERMINATED])


def summary_rows(
    episode: Episode, reason: str, rows: list[tuple[Any, ...]], observed: frozenset[str]
) -> list[dict[str, Any]]:
    """One episodes-table row per agent, counting ``rows`` (step rows) as written. An agent's
    own termination wins over ``reason``; at a terminated end an agent the end did not observe
    was cut off, and its reason is ``truncated``, as its last row says."""
    now = datetime.now(UTC)
    agents = episode.agents or {layout.DEFAULT_AGENT_ID: AgentState(started_at=episode.started_at)}
    written: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        if row[_EPISODE_ID] == episode.episode_id:
            written.setdefault(row[_AGENT_ID], []).append(row)
    out = []
    for agent_id, state in agents.items():
        mine = written.get(agent_id, [])
        terminated = state.terminated or any(row[_TERMINATED] for row in mine)
        cut = reason == TERMINATED and agent_id not in observed
        out.append(
            {
                "episode_id": episode.episode_id,
                "agent_id": agent_id,
                "client_id": episode.client_id,
                "started_at": state.started_at,
                "ended_at": now,
                "length": state.length + len(mine),
                "return": state.episode_return + sum(row[_REWARD] for row in mine),
                "env_id": episode.env_id,
                "seed": episode.seed,
                "reset_options": episode.reset_options,
                "end_reason": TERMINATED if terminated else TRUNCATED if cut else reason,
                "training_enabled": episode.training_enabled,
            }
        )
    return out


def _row(
    episode: Episode,
    agent_id: str,
    state: AgentState,
    pending: Pending,
    reward: float,
    next_observation: Any,
    info: Any,
    terminated: bool,
    truncated: bool,
) -> tuple[Any, ...]:
    """The row of ``state``'s ``pending`` step, ended at ``next_observation``, in
    STEP_COLUMNS order."""
    return (
        episode.episode_id,
        agent_id,
        state.t,
        pending.observation,
        pending.action,
        reward,
        next_observation,
        terminated,
        truncated,
        pending.action_logp,
        pending.policy_version,
        episode.training_enabled,
        info if info is not None else state.info,
        episode.client_id,
    )


def _unobserved(steps: Steps, done: Completion) -> None:
    """What calls carry for agents they do not observe (reward sums, checked now and set at
    commit), the rows of the agents an end cuts off, and the summaries of ending episodes."""
    named = steps.ends.keys() | steps.returns.keys()  # the episodes with anything to do here
    observed = _observed(steps, named)
    for episode in _episodes(steps, named):
        returns = steps.returns.get(episode.episode_id)
        mine = observed.get(episode.episode_id, frozenset())
        sums = returns.sums(episode, mine) if returns is not None else {}
        if episode.episode_id in steps.ends:
            _close_rows(episode, done, mine, sums, returns or Returns())
            done.ending.append(episode)
        else:
            done.sums += [(episode.agents[agent_id], total) for agent_id, total in sums.items()]
    for episode in done.ending:
        reason = steps.ends[episode.episode_id]
        mine = observed.get(episode.episode_id, frozenset())
        done.summaries += summary_rows(episode, reason, done.rows, mine)


def _episodes(steps: Steps, named: Set[str]) -> list[Episode]:
    """The episodes of the calls whose ids are ``named``, each once, in order (a pass names a
    few of its many episodes: the test is all the others cost)."""
    found: dict[int, Episode] = {}
    for episode in itertools.chain(steps.episodes, steps.touched):
        if episode.episode_id in named:
            found.setdefault(id(episode), episode)
    return list(found.values())


def _close_rows(
    episode: Episode,
    done: Completion,
    observed: frozenset[str],
    sums: dict[str, float],
    returns: Returns,
) -> None:
    """Rows for the agents an end cuts off: each pending step ends at its own observation."""
    for agent_id, state in episode.agents.items():
        pending = state.pending
        if agent_id in observed or pending is None:
            continue
        terminated = state.terminated or returns.dones.get(agent_id, False)
        reward, info = sums.get(agent_id, state.reward), returns.infos.get(agent_id)
        ended = terminated, not terminated
        row = _row(episode, agent_id, state, pending, reward, pending.observation, info, *ended)
        done.rows.append(row)
        done.advancing.append(state)


def _observed(steps: Steps, named: Set[str]) -> dict[str, frozenset[str]]:
    """The agents each ``named`` episode's rows observe."""
    found: dict[str, set[str]] = {}
    for episode, agent_id in zip(steps.episodes, steps.agent_ids, strict=True):
        if episode.episode_id in named:
            found.setdefault(episode.episode_id, set()).add(agent_id)
    return {episode_id: frozenset(agents) for episode_id, agents in found.items()}

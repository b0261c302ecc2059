"""One episode's bookkeeping: a small state machine per agent that turns steps into table rows.

The server runs it for remote inference and the client for local inference, so both write the
same rows.

The step row for ``t`` needs ``next_observation``, which only arrives with the next request of the
same episode (get_action, log_action or end). So each agent holds one *pending* step (observation,
action, how it was chosen) and the rewards logged since; the next observation completes it into a
row. An episode, once ended (by the client, or closed by the server as idle or at shutdown), takes
no more steps: the row of its last step has been written with ``terminated`` or ``truncated``.

Nothing here writes: methods return the rows to write, and the caller commits the new state with
:meth:`Episode.commit` only after the rows are safe (the server: acknowledged by the writer), so
a failed write changes nothing and the request can be retried.

The rules (``docs/protocol.md``, "What a step row holds") live here, once, for every mode:
rewards accrue to the agent's pending step (none logged means 0.0); a reward (or info) logged
while an agent has no pending step, before its first action or after its last, belongs to no
transition: it is not stored, and :func:`unattributed` logs a warning; a reward that would make
the pending sum or the agent's return non-finite is refused at the call that gave it; agent ids
of any JSON scalar type the client uses become text once, in :class:`AgentIds`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from pipeline.errors import SchemaError
from pipeline.format import layout

Row = dict[str, Any]
_log = logging.getLogger("rlpipe.recorder")


def reward_field(agent_id: str) -> str:
    """How a reward is named in errors: ``reward`` single-agent, ``rewards.{id}`` per agent."""
    return "reward" if agent_id == layout.DEFAULT_AGENT_ID else f"rewards.{agent_id}"


def unattributed(episode_id: str, agent_id: str, reward: float) -> None:
    """Report a reward that belongs to no transition (the agent has no pending step)."""
    if reward:
        _log.warning(
            "episode '%s', agent '%s': reward %r was logged while the agent had no "
            "pending action (before its first, or after its last); it belongs to no "
            "transition and is not stored",
            episode_id,
            agent_id,
            reward,
        )


class AgentIds:
    """One episode's agent ids: any JSON scalar the simulator uses (a string or an integer,
    as RLlib's multi-agent envs do) becomes the text the wire and the ``agent_id`` column
    carry, and answers are keyed by the ids as given again."""

    def __init__(self) -> None:
        self._given: dict[str, Any] = {}

    def encode(self, mapping: Mapping[Any, Any], field: str) -> dict[str, Any]:
        """``mapping`` keyed by text; 1 and "1" in one episode are refused (one column value).

        Raises:
            SchemaError: naming ``field``, for an id of another type or one that clashes.
        """
        out = {}
        for key, value in mapping.items():
            given = int(key) if isinstance(key, np.integer) else key
            if isinstance(given, bool) or not isinstance(given, int | str) or given == "":
                raise SchemaError.single(
                    field,
                    "agent ids that are non-empty strings or integers",
                    f"{type(key).__name__} {key!r}",
                )
            text = str(given)
            known = self._given.setdefault(text, given)
            if type(known) is not type(given):
                raise SchemaError.single(
                    field,
                    f"one agent per agent_id: {known!r} and {given!r} are both stored as '{text}'",
                    repr(given),
                )
            out[text] = value
        return out

    def decode(self, mapping: Mapping[str, Any]) -> dict[Any, Any]:
        return {self._given.get(key, key): value for key, value in mapping.items()}


@dataclass
class Pending:
    """A step whose action is known and whose next observation is not."""

    observation: Any
    action: Any
    action_logp: float | None
    policy_version: int | None


@dataclass
class AgentState:
    t: int = 0
    pending: Pending | None = None
    reward: float = 0.0
    info: Any = None
    terminated: bool = False  # from a multi-agent done dict; the agent acts no more
    episode_return: float = 0.0
    length: int = 0
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def with_reward(self, reward: float, field: str = "reward") -> float:
        """The pending reward plus ``reward``, refused when it or the return is not finite.

        Raises:
            SchemaError: naming ``field``: accepted, the sum would fail a later call instead.
        """
        total = self.reward + reward
        if not (math.isfinite(total) and math.isfinite(self.episode_return + total)):
            raise SchemaError.single(
                field,
                "a reward that keeps the step's reward sum and the return finite",
                f"{reward!r} (pending {self.reward!r}, return {self.episode_return!r})",
            )
        return total

    def advance(self, reward: float, terminated: bool) -> None:
        """The pending step's row is written (with ``reward``): count it, clear what it held."""
        self.t += 1
        self.length += 1
        self.episode_return += reward
        self.pending, self.reward, self.info = None, 0.0, None
        self.terminated = self.terminated or terminated


@dataclass
class Episode:
    """One episode's agents and what the server must record when it ends."""

    episode_id: str
    client_id: str
    training_enabled: bool
    seed: int | None
    reset_options: Any
    env_id: str | None
    multiagent: bool | None = None
    agents: dict[str, AgentState] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    last_seen: float = field(default_factory=time.monotonic)
    ended: bool = False
    last_request: tuple[int, Any] | None = None  # (request number, response) for retries
    requests: int = 0
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def check_form(self, multiagent: bool) -> None:
        """An episode is single-agent or multi-agent from its first step on, not both.

        Raises:
            SchemaError: naming the field the episode's form takes.
        """
        if self.multiagent is None:
            self.multiagent = multiagent
        elif self.multiagent != multiagent:
            want, got = (
                ("observations", "observation")
                if self.multiagent
                else ("observation", "observations")
            )
            raise SchemaError.single(
                want,
                f"'{want}': episode '{self.episode_id}' is "
                f"{'multi' if self.multiagent else 'single'}-agent",
                f"'{got}'",
            )

    def agent(self, agent_id: str) -> AgentState:
        state = self.agents.get(agent_id)
        if state is None:  # not setdefault: a new AgentState per call costs a clock read
            state = self.agents[agent_id] = AgentState()
        return state

    def complete(
        self,
        observations: dict[str, Any],
        rewards: dict[str, float],
        infos: dict[str, Any],
        terminated: dict[str, bool],
        truncated: bool = False,
    ) -> list[Row]:
        """Rows for every pending step the new observations complete (state not yet changed)."""
        rows = []
        for agent_id, observation in observations.items():
            state = self.agents.get(agent_id)
            if state is None or state.pending is None:
                unattributed(self.episode_id, agent_id, rewards.get(agent_id, 0.0))
                continue
            rows.append(self._row(agent_id, state, state.pending, observation, rewards, infos,
                                  terminated, truncated))  # fmt: skip
        return rows

    def close_rows(
        self,
        rewards: dict[str, float],
        truncated: bool,
        terminated: dict[str, bool] | None = None,
        infos: dict[str, Any] | None = None,
    ) -> list[Row]:
        """Rows for agents still pending after an end request that did not observe them."""
        flags, infos = terminated or {}, infos or {}
        return [
            self._row(
                agent_id, state, pending, pending.observation, rewards, infos, flags, truncated
            )
            for agent_id, state in self.agents.items()
            if (pending := state.pending) is not None
        ]

    def _row(
        self,
        agent_id: str,
        state: AgentState,
        pending: Pending,
        next_observation: Any,
        rewards: dict[str, float],
        infos: dict[str, Any],
        terminated: dict[str, bool],
        truncated: bool,
    ) -> Row:
        is_terminal = terminated.get(agent_id, False) or state.terminated
        return {
            "episode_id": self.episode_id,
            "agent_id": agent_id,
            "t": state.t,
            "observation": pending.observation,
            "action": pending.action,
            "reward": state.with_reward(rewards.get(agent_id, 0.0), reward_field(agent_id)),
            "next_observation": next_observation,
            "terminated": is_terminal,
            "truncated": truncated and not is_terminal,
            "action_logp": pending.action_logp,
            "policy_version": pending.policy_version,
            "training_enabled": self.training_enabled,
            "info": infos.get(agent_id, state.info),
            "client_id": self.client_id,
        }

    def end_rows(
        self,
        observations: dict[str, Any],
        rewards: dict[str, float],
        infos: dict[str, Any],
        truncated: bool,
        dones: dict[str, bool] | None = None,
    ) -> list[Row]:
        """Rows of an end request: the observed agents' pending steps end as it says; any other
        agent's pending step ends truncated at its own observation (it was cut, not ended),
        unless a done flag (``dones``, or logged before) says it terminated."""
        terminated = dict(dones or {})
        for agent_id in observations:
            terminated[agent_id] = not truncated or terminated.get(agent_id, False)
        rows = self.complete(observations, rewards, infos, terminated, truncated=truncated)
        unobserved = {k: v for k, v in rewards.items() if k not in observations}
        for agent_id, reward in unobserved.items():
            if (state := self.agents.get(agent_id)) is None or state.pending is None:
                unattributed(self.episode_id, agent_id, reward)
        observed = {row["agent_id"] for row in rows}
        rows += [
            row
            for row in self.close_rows(unobserved, True, terminated, infos)
            if row["agent_id"] not in observed
        ]
        return rows

    def commit(self, written: list[Row], pending: dict[str, Pending]) -> None:
        """Advance the agents once ``written`` is durable; ``pending`` are the new actions."""
        for row in written:
            self.agents[row["agent_id"]].advance(row["reward"], row["terminated"])
        for agent_id, step in pending.items():
            self.agent(agent_id).pending = step
        self.last_seen = time.monotonic()

    def add_rewards(self, rewards: dict[str, float], infos: dict[str, Any],
                    terminated: dict[str, bool]) -> None:  # fmt: skip
        """log_returns: rewards and infos for the agents' pending steps, and done flags.

        Raises:
            SchemaError: a reward that would make a sum non-finite; nothing is added then.
        """
        self.set_rewards(self.reward_sums(rewards))
        for agent_id, info in infos.items():
            state = self.agents.get(agent_id)
            if state is not None and state.pending is not None:
                state.info = info
        self.mark_terminated(terminated)
        self.last_seen = time.monotonic()

    def reward_sums(self, rewards: dict[str, float]) -> dict[str, float]:
        """The pending reward sums with ``rewards`` added, checked, state unchanged; rewards of
        agents with no pending step belong to no transition (reported, left out).

        Raises:
            SchemaError: a reward that would make a sum non-finite.
        """
        sums = {}
        for agent_id, reward in rewards.items():
            state = self.agents.get(agent_id)
            if state is None or state.pending is None:
                unattributed(self.episode_id, agent_id, reward)
            else:
                sums[agent_id] = state.with_reward(reward, reward_field(agent_id))
        return sums

    def set_rewards(self, sums: dict[str, float]) -> None:
        """Commit what :meth:`reward_sums` computed."""
        for agent_id, total in sums.items():
            self.agents[agent_id].reward = total

    def mark_terminated(self, terminated: dict[str, bool]) -> None:
        """Done flags: an agent flagged acts no more (its pending step ends terminated)."""
        for agent_id, flag in terminated.items():
            if flag:
                self.agent(agent_id).terminated = True

    def summary_rows(
        self, end_reason: str, uncommitted: Sequence[Row] = (), observed: set[str] | None = None
    ) -> list[Row]:
        """One episodes-table row per agent; an agent's own termination wins over the reason.

        ``uncommitted``: step rows of this episode written with the summaries but not yet
        committed to its state (a server writes both in one append, then commits); they count
        as if they were. ``observed``: the agents an end request observed (None: all); at a
        ``terminated`` end the others were cut off, so their reason is ``truncated``, as their
        last rows say.
        """
        summaries = self._summary_rows(end_reason)
        if end_reason == "terminated" and observed is not None:
            for summary in summaries:
                state = self.agents.get(summary["agent_id"])
                if summary["agent_id"] not in observed and not (state and state.terminated):
                    summary["end_reason"] = "truncated"
        for summary in summaries:
            mine = [row for row in uncommitted if row["agent_id"] == summary["agent_id"]]
            summary["length"] += len(mine)
            summary["return"] += sum(row["reward"] for row in mine)
            if any(row["terminated"] for row in mine):
                summary["end_reason"] = "terminated"
        return summaries

    def _summary_rows(self, end_reason: str) -> list[Row]:
        now = datetime.now(UTC)
        agents = self.agents or {layout.DEFAULT_AGENT_ID: AgentState(started_at=self.started_at)}
        return [
            {
                "episode_id": self.episode_id,
                "agent_id": agent_id,
                "client_id": self.client_id,
                "started_at": state.started_at,
                "ended_at": now,
                "length": state.length,
                "return": state.episode_return,
                "env_id": self.env_id,
                "seed": self.seed,
                "reset_options": self.reset_options,
                "end_reason": "terminated" if state.terminated else end_reason,
                "training_enabled": self.training_enabled,
            }
            for agent_id, state in agents.items()
        ]

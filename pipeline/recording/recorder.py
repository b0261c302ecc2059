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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline.format import layout

Row = dict[str, Any]


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
                continue
            rows.append(self._row(agent_id, state, state.pending, observation, rewards, infos,
                                  terminated, truncated))  # fmt: skip
        return rows

    def close_rows(self, rewards: dict[str, float], truncated: bool) -> list[Row]:
        """Rows for agents still pending after an end request that did not observe them."""
        return [
            self._row(agent_id, state, pending, pending.observation, rewards, {}, {}, truncated)
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
            "reward": state.reward + rewards.get(agent_id, 0.0),
            "next_observation": next_observation,
            "terminated": is_terminal,
            "truncated": truncated and not is_terminal,
            "action_logp": pending.action_logp,
            "policy_version": pending.policy_version,
            "training_enabled": self.training_enabled,
            "info": infos.get(agent_id, state.info),
            "client_id": self.client_id,
        }

    def commit(self, written: list[Row], pending: dict[str, Pending]) -> None:
        """Advance the agents once ``written`` is durable; ``pending`` are the new actions."""
        for row in written:
            self.agents[row["agent_id"]].advance(row["reward"], row["terminated"])
        for agent_id, step in pending.items():
            self.agent(agent_id).pending = step
        self.last_seen = time.monotonic()

    def add_rewards(self, rewards: dict[str, float], infos: dict[str, Any],
                    terminated: dict[str, bool]) -> None:  # fmt: skip
        for agent_id, reward in rewards.items():
            self.agent(agent_id).reward += reward
        for agent_id, info in infos.items():
            self.agent(agent_id).info = info
        for agent_id, flag in terminated.items():
            self.agent(agent_id).terminated = self.agent(agent_id).terminated or flag
        self.last_seen = time.monotonic()

    def summary_rows(self, end_reason: str, uncommitted: Sequence[Row] = ()) -> list[Row]:
        """One episodes-table row per agent; an agent's own termination wins over the reason.

        ``uncommitted``: step rows of this episode written with the summaries but not yet
        committed to its state (a server writes both in one append, then commits); they count
        as if they were.
        """
        summaries = self._summary_rows(end_reason)
        for summary in summaries:
            mine = [row for row in uncommitted if row["agent_id"] == summary["agent_id"]]
            summary["length"] += len(mine)
            summary["return"] += sum(row["reward"] for row in mine)
            if any(row["terminated"] for row in mine):
                summary["end_reason"] = "terminated"
        return summaries

    def _summary_rows(self, end_reason: str) -> list[Row]:
        now = datetime.now(UTC)
        agents = self.agents or {layout.DEFAULT_AGENT_ID: AgentState()}
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

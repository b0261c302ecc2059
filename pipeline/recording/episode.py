"""An open episode's state: its agents, their pending steps and what they have earned.

The step core (:mod:`pipeline.recording.recorder`) reads and advances this state; the server
keeps one :class:`Episode` per open episode (:mod:`server.episodes`), a local-inference client
its own (:mod:`pipeline.client.local`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline.errors import SchemaError
from pipeline.format import layout

_log = logging.getLogger("rlpipe.recorder")


@dataclass(slots=True)
class Pending:
    """A step whose action is known and whose next observation is not."""

    observation: Any
    action: Any
    action_logp: float | None
    policy_version: int | None


@dataclass(slots=True)
class AgentState:
    """One agent of an open episode: its next ``t``, its pending step and what it has earned."""

    t: int = 0
    pending: Pending | None = None
    reward: float = 0.0  # logged since the pending step's action
    info: Any = None
    terminated: bool = False  # a done flag: the agent acts no more
    episode_return: float = 0.0
    length: int = 0
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    def advance(self, reward: float, terminated: bool) -> None:
        """The pending step's row is safe (with ``reward``): count it, clear what it held."""
        self.t += 1
        self.length += 1
        self.episode_return += reward
        self.pending, self.reward, self.info = None, 0.0, None
        self.terminated = self.terminated or terminated


_UNSEEN = AgentState()  # an agent not yet observed, as Episode.seen() reads it (never changed)


@dataclass(slots=True)
class Episode:
    """An open episode: its agents, what its summary records, and what the server needs to
    recognise a retried request."""

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
    last_request: tuple[int, Any] | None = None  # (request number, answer) for retries
    requests: int = 0
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    recorded: bool = True  # its start is in the server's journal (a batch's: with its pass)

    def check_form(self, multiagent: bool) -> None:
        """A SchemaError unless the step has the episode's form, single- or multi-agent (the
        caller sets :attr:`multiagent` once the first step is safe: a refused one fixes nothing)."""
        if self.multiagent is not None and self.multiagent != multiagent:
            want, got = ("observations", "observation")[:: 1 if self.multiagent else -1]
            form = "multi" if self.multiagent else "single"
            raise SchemaError.single(
                got, f"'{want}' (episode '{self.episode_id}' is {form}-agent)", f"'{got}'"
            )

    def seen(self, agent_id: str) -> AgentState:
        """The agent's state as the step core reads it before a call's rows are safe: an agent
        not yet observed reads as one shared empty state, never changed, so that a refused
        call adds no agent (:meth:`agent` adds it once they are)."""
        return self.agents.get(agent_id, _UNSEEN)

    def agent(self, agent_id: str) -> AgentState:
        state = self.agents.get(agent_id)
        if state is None:  # not setdefault: a new AgentState per call costs a clock read
            state = self.agents[agent_id] = AgentState()
        return state

    def add_reward(self, agent_id: str, reward: float) -> None:
        """:meth:`add_returns` of one reward alone (a simulator's every step: kept short)."""
        state = self.agents.get(agent_id)
        if state is None or state.pending is None:
            unattributed(self.episode_id, agent_id, reward)
        else:
            state.reward = reward_sum(state.reward, reward, state.episode_return, agent_id)

    def add_returns(self, returns: Returns) -> None:
        """log_returns: rewards and infos for the agents' pending steps, and done flags (none
        added when a reward would make a sum non-finite: a SchemaError)."""
        sums = returns.sums(self)
        for agent_id, total in sums.items():
            self.agents[agent_id].reward = total
        returns.apply(self)
        self.last_seen = time.monotonic()


@dataclass
class Returns:
    """What log_returns carries for an episode's agents: rewards, infos and done flags."""

    rewards: dict[str, float] = field(default_factory=dict)
    infos: dict[str, Any] = field(default_factory=dict)
    dones: dict[str, bool] = field(default_factory=dict)

    def sums(self, episode: Episode, skip: frozenset[str] = frozenset()) -> dict[str, float]:
        """Each pending agent's reward sum with these rewards added, checked (see
        :func:`reward_sum`), state unchanged; a reward of an agent with no pending step belongs
        to no transition (reported)."""
        sums = {}
        for agent_id, reward in self.rewards.items():
            state = episode.agents.get(agent_id)
            if agent_id in skip:
                continue
            if state is None or state.pending is None:
                unattributed(episode.episode_id, agent_id, reward)
            else:
                sums[agent_id] = reward_sum(state.reward, reward, state.episode_return, agent_id)
        return sums

    def apply(self, episode: Episode, skip: frozenset[str] = frozenset()) -> None:
        """The infos (of pending agents) and done flags, once the sums are in."""
        for agent_id, info in self.infos.items():
            state = episode.agents.get(agent_id)
            if agent_id not in skip and state is not None and state.pending is not None:
                state.info = info
        for agent_id, flag in self.dones.items():
            if flag:
                episode.agent(agent_id).terminated = True


def unattributed(episode_id: str, agent_id: str, reward: float) -> None:
    """Report a reward that belongs to no transition (the agent has no pending step)."""
    if reward:
        _log.warning(
            "episode '%s', agent '%s': reward %r was logged while the agent had no pending "
            "action (before its first, or after its last); it belongs to no transition and is "
            "not stored",
            episode_id,
            agent_id,
            reward,
        )


def reward_sum(pending: float, reward: float, episode_return: float, agent_id: str) -> float:
    """An agent's ``pending`` reward plus ``reward``; a SchemaError, naming ``reward`` (or
    ``rewards.{id}`` per agent), when it or the return would not be finite (accepted, the sum
    would fail a later call instead)."""
    total = pending + reward
    if not (math.isfinite(total) and math.isfinite(episode_return + total)):
        raise SchemaError.single(
            "reward" if agent_id == layout.DEFAULT_AGENT_ID else f"rewards.{agent_id}",
            "a reward that keeps the step's reward sum and the return finite",
            f"{reward!r} (pending {pending!r}, return {episode_return!r})",
        )
    return total


def episode_id_of(value: Any, name: str = "episode_id") -> str:
    """An episode id as every mode takes it: any string a URL can carry once quoted ('.' and
    '..' are path steps to HTTP clients), of 1 to 200 characters."""
    if not isinstance(value, str) or not value or len(value) > 200 or value in (".", ".."):
        expected = "a non-empty string of at most 200 characters, not '.' or '..'"
        raise SchemaError.single(name, expected, repr(value))
    return value

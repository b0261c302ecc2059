"""The columnar step path: single-agent steps of a Box observation space, many at once.

Remote inference for one env (``POST /v1/episodes/{id}/actions`` and ``.../end``) and for many
(``POST /v1/actions``) does the same thing per row: complete the episode's pending step with the
new observation, pick an action, make the row durable, advance the episode. Done per row through
dicts (:mod:`server.service`), that cost more CPU than the HTTP round trip around it. Here every
request's rows are arrays: the observations are checked in one numpy pass, and the rows of all
requests that arrive together (:mod:`server.combiner`) share one forward pass, one Arrow batch
built column by column and one durable append. Multi-agent steps, logged actions and spaces other
than a Box of floats take the general path; both keep the same
:class:`~pipeline.recording.recorder.Episode` state, so one episode may use either.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import SchemaError
from pipeline.format import layout
from pipeline.recording.recorder import Episode, Pending, unattributed
from server import replays
from server.combiner import Combiner
from server.episodes import refuse_repeats
from server.errors import ApiError

_AGENT = layout.DEFAULT_AGENT_ID
TERMINATED, TRUNCATED = "terminated", "truncated"


@dataclass
class ColumnStep:
    """One request's rows: episode ``i`` observed ``observations[i]`` after earning ``rewards[i]``.

    ``ends[i]`` is None to ask for an action, else how the episode ended (its observation is the
    final one). ``requests[i]`` is the client's number of the request in episode ``i`` (None when
    unnumbered): what a retry is recognised by (:mod:`server.replays`).
    """

    episode_ids: list[str]
    observations: np.ndarray  # (n, *shape) in the space's dtype, checked finite
    rewards: list[float]
    infos: list[Any] | None
    ends: list[str | None]
    requests: list[int | None]
    answers: bool = True  # an answer object per row (the columnar batch form needs none)


@dataclass
class ColumnAnswer:
    """Per row: the action (None for an ended episode), its log-probability, and the answer a
    numbered request keeps for a retry."""

    actions: list[Any]
    action_logp: list[float | None]
    policy_version: int | None
    answers: list[dict[str, Any]]


class _Overlap(Exception):
    """Two requests of one pass touch the same episode: each must run in its own pass."""


class ColumnStepper:
    """Runs :class:`ColumnStep` requests, those arriving together in one pass.

    Args:
        service: the server's state (episodes, policy, writer, metrics); duck-typed to avoid
            an import cycle with :mod:`server.service`.
    """

    def __init__(self, service: Any) -> None:
        self._service = service
        self._combiner: Combiner[ColumnStep, ColumnAnswer] = Combiner(
            self._run,
            retry_alone=lambda error: isinstance(error, ApiError | SchemaError | _Overlap),
        )

    def submit(self, step: ColumnStep) -> ColumnAnswer:
        """Make the rows durable and answer them; concurrent requests share the pass."""
        return self._combiner.submit(step)

    def _run(self, steps: list[ColumnStep]) -> list[ColumnAnswer]:
        ids = [episode_id for step in steps for episode_id in step.episode_ids]
        if len(set(ids)) != len(ids):
            if len(steps) > 1:
                raise _Overlap()
            refuse_repeats(ids, "episodes" if steps[0].answers else "episode_ids")
        episodes = self._service.episodes.get_many(ids)
        held = []
        try:
            for episode in sorted(episodes, key=lambda e: e.episode_id):  # one order: no deadlock
                episode.lock.acquire()
                held.append(episode.lock)
            for episode in episodes:
                if episode.ended:
                    self._service.episodes.get(episode.episode_id)  # raises the 409
            return self._locked(steps, episodes)
        finally:
            for lock in held:
                lock.release()

    def _locked(self, steps: list[ColumnStep], episodes: list[Episode]) -> list[ColumnAnswer]:
        out: list[ColumnAnswer | None] = []
        fresh: list[ColumnStep] = []
        fresh_episodes: list[Episode] = []
        start = 0
        for step in steps:
            mine = episodes[start : start + len(step.episode_ids)]
            start += len(mine)
            replayed = _replay(step, mine)
            out.append(replayed)
            if replayed is None:
                fresh.append(step)
                fresh_episodes += mine
        if fresh:
            answers = iter(self._step(fresh, fresh_episodes))
            return [answer if answer is not None else next(answers) for answer in out]
        return [answer for answer in out if answer is not None]

    def _step(self, steps: list[ColumnStep], episodes: list[Episode]) -> list[ColumnAnswer]:
        service = self._service
        service.check_backlog()
        observations = np.concatenate([step.observations for step in steps])
        rewards = [reward for step in steps for reward in step.rewards]
        infos = [info for step in steps for info in (step.infos or [None] * len(step.rewards))]
        ends = [end for step in steps for end in step.ends]
        for episode in episodes:
            episode.check_form(multiagent=False)
        states = [episode.agent(_AGENT) for episode in episodes]
        for episode, state, reward in zip(episodes, states, rewards, strict=True):
            if state.pending is None:  # the episode's first observation: no transition yet
                unattributed(episode.episode_id, _AGENT, reward)
        acting = [
            i for i, state in enumerate(states) if ends[i] is None and not state.terminated
        ]  # fmt: skip
        actions, logp, version = service.runner.act_array(observations[acting])
        done = [i for i, state in enumerate(states) if state.pending is not None]
        written = self._columns(done, episodes, states, observations, rewards, infos, ends)
        summaries = [
            summary
            for i, end in enumerate(ends)
            if end is not None
            for summary in episodes[i].summary_rows(end, _mine(i, done, written))
        ]
        service.write_rows(written, summaries)
        now = time.monotonic()
        for i, reward, terminal in zip(done, written["reward"], written["terminated"],
                                       strict=True):  # fmt: skip
            states[i].advance(reward, terminal)
        for n, i in enumerate(acting):
            states[i].pending = Pending(observations[i], actions[n], logp[n], version)
        for episode in episodes:
            episode.last_seen = now
        return self._answers(steps, episodes, acting, actions, logp, version)

    def _columns(
        self,
        done: list[int],
        episodes: list[Episode],
        states: list[Any],
        observations: np.ndarray,
        rewards: list[float],
        infos: list[Any],
        ends: list[str | None],
    ) -> dict[str, Any]:
        """The step rows the new observations complete, column by column: the writer logs
        numeric columns as arrays (:meth:`pipeline.dataset.rowlog.RowEncoder.encode_columns`)."""
        mine = [episodes[i] for i in done]
        agents = [states[i] for i in done]
        pending = [state.pending for state in agents]
        closing = [ends[i] for i in done]
        terminal = [end == TERMINATED or state.terminated
                    for end, state in zip(closing, agents, strict=True)]  # fmt: skip
        return {
            "episode_id": [episode.episode_id for episode in mine],
            "agent_id": [_AGENT] * len(done),
            "t": [state.t for state in agents],
            "observation": [step.observation for step in pending],
            "action": [step.action for step in pending],
            "reward": [
                state.with_reward(rewards[i]) for i, state in zip(done, agents, strict=True)
            ],
            "next_observation": observations[done],
            "terminated": terminal,
            "truncated": [
                end == TRUNCATED and not t for end, t in zip(closing, terminal, strict=True)
            ],
            "action_logp": [step.action_logp for step in pending],
            "policy_version": [step.policy_version for step in pending],
            "training_enabled": [episode.training_enabled for episode in mine],
            "info": [_info(infos[i], state.info) for i, state in zip(done, agents, strict=True)]
            if any(info is not None for info in infos) or any(s.info is not None for s in agents)
            else [None] * len(done),
            "client_id": [episode.client_id for episode in mine],
        }

    def _answers(
        self,
        steps: list[ColumnStep],
        episodes: list[Episode],
        acting: list[int],
        actions: list[Any],
        logp: list[float | None],
        version: int | None,
    ) -> list[ColumnAnswer]:
        row_actions: list[Any] = [None] * len(episodes)
        row_logp: list[float | None] = [None] * len(episodes)
        for n, i in enumerate(acting):
            row_actions[i], row_logp[i] = actions[n], logp[n]
        out, start = [], 0
        for step in steps:
            end = start + len(step.episode_ids)
            answers = []
            for i in range(start, end):
                episode, request, end_ = episodes[i], step.requests[i - start], step.ends[i - start]
                episode.requests += 1
                episode.last_request = None
                if step.answers or request is not None:
                    answer = _answer(episode.episode_id, end_, row_actions[i], row_logp[i], version)
                    answers.append(answer)
                    if request is not None:
                        episode.last_request = (episode.requests, answer)
            out.append(ColumnAnswer(row_actions[start:end], row_logp[start:end], version,
                                    answers))  # fmt: skip
            start = end
        # ended only now: a copy of a request that finds one of its episodes ended finds every
        # answer of the first try in place (handlers._late_replay)
        ends = [end for step in steps for end in step.ends]
        for episode, end_ in zip(episodes, ends, strict=True):
            if end_ is not None:
                self._service.episodes.finish(episode)
        return out


def _nothing_done(error: BaseException) -> bool:
    """Errors a pass raises before it writes: each request of it may be rerun by itself."""
    return isinstance(error, ApiError | SchemaError | _Overlap)


def _replay(step: ColumnStep, episodes: list[Episode]) -> ColumnAnswer | None:
    """The answers a retried request already got, or None to run it (a 409 if it is neither)."""
    if step.requests.count(None) == len(step.requests):
        return None
    field = "request" if step.answers else "requests"  # the columnar batch form's name
    answers = replays.replayed(episodes, step.requests, field)
    return None if answers is None else column_answer(answers)


def column_answer(answers: list[dict[str, Any]]) -> ColumnAnswer:
    """The per-row answers a request got, as the columns of its answer again."""
    versions = [a["policy_version"] for a in answers if a.get("policy_version") is not None]
    return ColumnAnswer([answer.get("action") for answer in answers],
                        [answer.get("action_logp") for answer in answers],
                        versions[0] if versions else None, answers)  # fmt: skip


def _answer(episode_id: str, end: str | None, action: Any, logp: float | None,
            version: int | None) -> dict[str, Any]:  # fmt: skip
    if end is not None:
        return {"episode_id": episode_id, "ended": True}
    return {"episode_id": episode_id, "action": action, "action_logp": logp,
            "policy_version": None if action is None else version}  # fmt: skip


def _mine(i: int, done: list[int], written: dict[str, Any]) -> list[dict[str, Any]]:
    """Episode ``i``'s step among the columns being written, as :meth:`Episode.summary_rows`
    counts it."""
    if i not in done:
        return []
    n = done.index(i)
    return [{"agent_id": _AGENT, "reward": written["reward"][n],
             "terminated": written["terminated"][n]}]  # fmt: skip


def _info(given: Any, logged: Any) -> Any:
    """The step's info: the request's, else what log_returns left; JSON text must parse."""
    value = given if given is not None else logged
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            raise SchemaError.single("info", "an object or JSON text", repr(value[:40])) from None
    return value

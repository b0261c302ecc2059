"""The server's step pass: requests' rows in, durable rows out, actions back.

Requests that arrive together share one pass (:mod:`server.combiner`): their episodes are locked,
retries recognised (:mod:`server.episodes`), the rows completed by the step core
(:func:`~pipeline.recording.recorder.complete`), every observation that needs an action goes
through one forward pass, all rows are made durable with one writer append, and only then do the
episodes advance. A pass that fails changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.dataset.batch import join
from pipeline.errors import SchemaError
from pipeline.recording import batches, recorder
from pipeline.recording.episode import Episode
from pipeline.recording.recorder import Steps
from server.combiner import Combiner
from server.episodes import EpisodeBook, refuse_repeats, replayed
from server.errors import ApiError

Answer = dict[str, Any]


@dataclass
class Request:
    """One request's rows as :mod:`server.requests` parsed them, its episodes not yet looked up.

    ``rows[i]`` is the index in ``episode_ids`` of the episode of row ``i`` of ``steps`` (an
    episode's rows are contiguous). ``numbers`` are the client's request numbers, per episode
    (None: unnumbered), which ``field`` names in a 409.
    """

    episode_ids: list[str]
    rows: list[int]
    steps: Steps
    numbers: list[int | None]
    forms: list[bool]  # per episode: whether its body was multi-agent (keyed by agent id)
    field: str = "request"
    ids_field: str = "episodes"  # the field that lists the episodes, named in a 400

    def bind(self, episodes: list[Episode]) -> None:
        self.steps.episodes = [episodes[k] for k in self.rows]
        self.steps.touched = episodes


class _Overlap(Exception):
    """Two requests of one pass touch the same episode: each must run in its own pass."""


def _nothing_done(error: BaseException) -> bool:
    """Errors a pass raises before it writes: each request of it may be rerun by itself."""
    return isinstance(error, ApiError | SchemaError | _Overlap)


class Stepper:
    """Runs :class:`Request` s, those arriving together in one pass, for ``service`` (duck-typed:
    :mod:`server.service` imports this module)."""

    def __init__(self, service: Any) -> None:
        self._service = service
        self._combiner: Combiner[Request, list[Answer]] = Combiner(
            self._run, retry_alone=_nothing_done
        )

    def submit(self, request: Request) -> list[Answer]:
        return self._combiner.submit(request)

    def _run(self, requests: list[Request]) -> list[list[Answer]]:
        ids = [episode_id for request in requests for episode_id in request.episode_ids]
        if len(set(ids)) != len(ids):
            if len(requests) > 1:
                raise _Overlap()
            refuse_repeats(ids, requests[0].ids_field)
        book = self._service.episodes
        episodes = book.get_many(ids)
        held = []
        try:
            for episode in sorted(episodes, key=lambda e: e.episode_id):  # one order: no deadlock
                episode.lock.acquire()
                held.append(episode.lock)
            for episode in episodes:
                if episode.ended:
                    book.get(episode.episode_id)  # raises the 409
            return self._locked(requests, episodes)
        finally:
            for lock in held:
                lock.release()

    def _locked(self, requests: list[Request], episodes: list[Episode]) -> list[list[Answer]]:
        out: list[list[Answer] | None] = []
        fresh: list[Request] = []
        start = 0
        for request in requests:
            mine = episodes[start : start + len(request.episode_ids)]
            start += len(mine)
            answers = replayed(mine, request.numbers, request.field)
            out.append(answers)
            if answers is None:
                for episode, multiagent in zip(mine, request.forms, strict=True):
                    episode.check_form(multiagent)
                request.bind(mine)
                fresh.append(request)
        answered = iter(self._step(fresh, episodes) if fresh else [])
        return [answers if answers is not None else next(answered) for answers in out]

    def _step(self, requests: list[Request], episodes: list[Episode]) -> list[list[Answer]]:
        service = self._service
        service.check_backlog()
        steps = joined(requests)
        done = recorder.complete(steps)
        actions, logp, version = self._actions(steps, done.acting)
        with service.journal.stepping(requests, actions, logp, version):  # before the rows
            service.write_rows(done.columns, done.summaries)
            return settle(requests, steps, done, actions, logp, version, service.episodes)

    def _actions(self, steps: Steps, acting: list[int]) -> tuple[list[Any], list[Any], int | None]:
        """The actions of the rows that act: logged ones as given, the rest from one forward
        pass over their observations."""
        logged = steps.actions
        chosen = acting if logged is None else [i for i in acting if logged[i] is None]
        everyone = len(chosen) == len(steps)  # then the batch is the rows, in order
        observations = steps.observations if everyone else batches.take(steps.observations, chosen)
        actions, logp, version = self._service.runner.act(observations)
        if logged is None:
            return actions, logp, version
        by_row = dict(zip(chosen, zip(actions, logp, strict=True), strict=True))
        picked = [by_row.get(i, (logged[i], None)) for i in acting]
        return [a for a, _ in picked], [p for _, p in picked], version


def joined(requests: list[Request]) -> Steps:
    """The rows of a pass's requests as one :class:`Steps`."""
    return _join([request.steps for request in requests])


def settle(
    requests: list[Request],
    steps: Steps,
    done: recorder.Completion,
    actions: list[Any],
    logp: list[Any],
    version: int | None,
    book: EpisodeBook,
) -> list[list[Answer]]:
    """Advance the episodes of a pass whose rows are safe, and answer each request; a server
    that takes over a dead one's episodes replays its passes through here
    (:mod:`server.revival`)."""
    recorder.commit(steps, done, actions, logp, version)
    for request in requests:
        for episode, multiagent in zip(request.steps.touched, request.forms, strict=True):
            episode.multiagent = multiagent
    row_actions: list[Any] = [None] * len(steps)
    row_logp: list[float | None] = [None] * len(steps)
    for n, i in enumerate(done.acting):
        row_actions[i], row_logp[i] = actions[n], logp[n]
    answers, start = [], 0
    for request in requests:
        end = start + len(request.steps)
        answers.append(_answers(request, row_actions[start:end], row_logp[start:end], version))
        start = end
    # ended only now: a copy of a request that finds one of its episodes ended finds every
    # answer of the first try in place (handlers.late_replay)
    for episode in done.ending:
        book.finish(episode)
    return answers


def _answers(
    request: Request, actions: list[Any], logp: list[float | None], version: int | None
) -> list[Answer]:
    """Each episode's answer, kept on it for a retry when the request is numbered."""
    steps, out = request.steps, []
    by_episode: dict[int, list[int]] = {}
    for i, k in enumerate(request.rows):
        by_episode.setdefault(k, []).append(i)
    for k, (episode_id, episode) in enumerate(zip(request.episode_ids, steps.touched, strict=True)):
        rows = by_episode.get(k, [])
        if episode_id in steps.ends:
            answer: Answer = {"episode_id": episode_id, "ended": True}
        elif request.forms[k]:
            acted = [i for i in rows if actions[i] is not None]
            answer = {
                "episode_id": episode_id,
                "actions": {steps.agent_ids[i]: actions[i] for i in acted},
                "action_logp": {steps.agent_ids[i]: logp[i] for i in acted},
                "policy_version": version if acted else None,
            }
        else:
            i = rows[0]
            answer = {
                "episode_id": episode_id,
                "action": actions[i],
                "action_logp": logp[i],
                "policy_version": None if actions[i] is None else version,
            }
        episode.requests += 1
        number = request.numbers[k]
        episode.last_request = None if number is None else (episode.requests, answer)
        out.append(answer)
    return out


def _join(parts: list[Steps]) -> Steps:
    if len(parts) == 1:
        return parts[0]
    n = [len(part) for part in parts]

    def column(name: str, default: Any) -> list[Any] | None:
        values = [getattr(part, name) for part in parts]
        if all(value is None for value in values):
            return None
        return [
            x
            for value, size in zip(values, n, strict=True)
            for x in (value if value is not None else [default] * size)
        ]

    return Steps(
        episodes=[e for part in parts for e in part.episodes],
        agent_ids=[a for part in parts for a in part.agent_ids],
        observations=join([part.observations for part in parts]),
        rewards=[r for part in parts for r in part.rewards],
        infos=column("infos", None),
        ends={k: v for part in parts for k, v in part.ends.items()},
        dones=column("dones", False),
        actions=column("actions", None),
        returns={k: v for part in parts for k, v in part.returns.items()},
        touched=[e for part in parts for e in part.touched],
    )

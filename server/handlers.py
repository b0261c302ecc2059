"""What each step and upload resource does with a request, apart from any web framework.

Both front ends (:mod:`server.app`, :mod:`server.wsgi`) call these through the route table
(:mod:`server.routes`), so they answer every request, good or bad, the same way. Every step
request becomes one :class:`~server.stepper.Request` (:mod:`server.requests`) and takes the one
step pass (:mod:`server.stepper`). ``counts.steps`` is set as soon as a request's number of steps
is known, so a refused request's steps are counted as rejected.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from pipeline.errors import StorageError
from pipeline.format import layout, seeds
from pipeline.recording.episode import Episode, episode_id_of
from server import binary, errors, requests
from server.config import ServerConfig
from server.episodes import ended_message, replayed_rows
from server.errors import ApiError
from server.messages import (
    ARROW_TYPE,
    client_id_of,
    flag,
    json_value,
    parse_json,
)
from server.service import Service
from server.stepper import Answer, Request
from server.uploads import check_ids, json_table, parse_seq, read_arrow

Reply = tuple[Any, int]  # the JSON answer and its status


class Counts(Protocol):
    steps: int


@dataclass
class Incoming:
    """One request, as either front end hands it to a handler."""

    body: bytes
    content_type: str | None
    remote_addr: str | None
    header: Callable[[str], str | None]
    episode_id: str = ""

    def json(self) -> dict[str, Any]:
        return parse_json(self.body, self.content_type)

    @property
    def arrow(self) -> bool:
        """Whether the body is an Arrow IPC stream (else it must be JSON)."""
        return (self.content_type or "").split(";")[0].strip() == ARROW_TYPE


def guard(config: ServerConfig, authorization: str | None, length: int | None) -> None:
    """401 without the token (when one is set; a public resource passes None), 413 for a body
    past the limit: before any work."""
    if (
        authorization is not None
        and config.token is not None
        and not hmac.compare_digest(authorization.encode(), f"Bearer {config.token}".encode())
    ):
        raise ApiError(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'")
    if length is not None and length > config.max_body_bytes:
        raise ApiError(
            413,
            f"request body of {length} bytes is larger than the server's "
            f"limit of {config.max_body_bytes} bytes",
        )


def start_episode(service: Service, incoming: Incoming, counts: Counts) -> Reply:
    """Open (or, for a retry, find) an episode; 201 when created, 200 when it was open."""
    counts.steps = 0
    doc = incoming.json()
    episode_id = doc.get("episode_id")
    episode = _episode(
        service,
        episode_id_of(episode_id) if episode_id is not None else secrets.token_hex(8),
        doc,
        incoming.remote_addr,
    )
    episode, created = service.journal.start(episode)
    return {"episode_id": episode.episode_id}, 201 if created else 200


def _episode(
    service: Service, episode_id: str, doc: dict[str, Any], remote_addr: str | None
) -> Episode:
    return Episode(
        episode_id=episode_id,
        client_id=client_id_of(doc.get("client_id")) or remote_addr or "",
        training_enabled=flag(doc.get("training_enabled", True), "training_enabled"),
        seed=seeds.checked(doc.get("seed")),
        reset_options=json_value(doc.get("options"), "options"),
        env_id=service.env_id,
    )


def episode_step(verb: str, service: Service, incoming: Incoming, counts: Counts) -> Reply:
    """get_action, log_action or end_episode for one episode."""
    counts.steps = 1
    spaces = service.observation_space, service.action_space
    doc = binary.step_doc(incoming.body, verb, *spaces) if incoming.arrow else incoming.json()
    request = requests.one_episode(doc, incoming.episode_id, verb, *spaces)
    counts.steps = len(request.steps)
    return _run(service, request, [None])[0], 200


def log_returns(service: Service, incoming: Incoming, counts: Counts) -> Reply:
    counts.steps = 1
    episode = service.episodes.get(incoming.episode_id)
    returns = requests.returns_of(incoming.json())
    with episode.lock:
        if episode.ended:
            raise ApiError(409, ended_message(incoming.episode_id))
        service.journal.add_returns(episode, returns)
    return {"episode_id": incoming.episode_id}, 200


def batch_step(service: Service, incoming: Incoming, counts: Counts) -> Reply:
    """The batch forms: many episodes' observations in one request, many actions back."""
    counts.steps = 1
    space, action_space = service.observation_space, service.action_space
    doc = binary.batch_doc(incoming.body, space) if incoming.arrow else incoming.json()
    remote_addr = incoming.remote_addr
    if "episode_ids" in doc:
        request, starts = requests.columns(doc, space, action_space)
        answers = _run(service, request, starts, remote_addr)
        versions = [a["policy_version"] for a in answers if a.get("policy_version") is not None]
        return {
            "episode_ids": request.episode_ids,
            "actions": [answer.get("action") for answer in answers],
            "action_logp": [answer.get("action_logp") for answer in answers],
            "policy_version": versions[0] if versions else None,
        }, 200
    request, starts = requests.entries(doc, space, action_space)
    counts.steps = len(request.steps)
    return {"episodes": _run(service, request, starts, remote_addr)}, 200


def _run(
    service: Service,
    request: Request,
    starts: list[dict[str, Any] | None],
    remote_addr: str | None = None,
) -> list[Answer]:
    """Open the episodes the request starts, then step: a refusal withdraws what it opened (so
    that it writes nothing, not even an empty episode), and a numbered request that finds its
    episodes ended by its own first try gets that answer."""
    started: list[Episode] = []
    try:
        for episode_id, start in zip(request.episode_ids, starts, strict=True):
            if start is not None:
                episode = _episode(service, episode_id, start, remote_addr)
                episode, created = service.journal.start(episode, record=False)
                if created:
                    started.append(episode)
        return service.stepper.submit(request)
    except BaseException as error:
        for episode in started:
            service.journal.withdraw(episode)
        if isinstance(error, ApiError):
            return late_replay(service, error, request)
        raise


def late_replay(service: Service, error: ApiError, request: Request) -> list[Answer]:
    """A numbered request that met an episode it ended itself, in its first try (a retry after
    the answer was lost, or a copy that arrived while the first try ran): that try's answers,
    else the error. A request that met an open episode was recognised in its step, under the
    episode's lock (:mod:`server.episodes`); a try keeps all its answers before it ends an
    episode, so this look finds them all."""
    numbers = request.numbers
    if error.status == 409 and numbers.count(None) != len(numbers):
        lasts = service.episodes.last_requests(request.episode_ids)
        answers = replayed_rows(request.episode_ids, numbers, lasts, request.field)
        if answers is not None:
            return answers
    raise error


def upload(service: Service, incoming: Incoming, counts: Counts) -> Reply:
    """A local-inference client's numbered batch (Arrow IPC or JSON), stored once."""
    client_id = incoming.header("X-Rlpipe-Client") or ""
    if not client_id:
        raise errors.bad_request("X-Rlpipe-Client", "the client's id", "nothing")
    seq = parse_seq(incoming.header("X-Rlpipe-Upload"))
    table_name = incoming.header("X-Rlpipe-Table") or layout.STEPS  # checked for JSON too
    if table_name not in layout.TABLES:
        raise errors.bad_request(
            "X-Rlpipe-Table", f"one of {list(layout.TABLES)}", repr(table_name)
        )
    if incoming.arrow:
        tables = {table_name: read_arrow(incoming.body)}
        timed = "logged_at" in tables[table_name].column_names
    else:
        doc = incoming.json()
        tables = _json_tables(service, doc)  # a dict of lists of row objects, once checked
        timed = all("logged_at" in row for row in doc.get(layout.STEPS, []))
    check_ids(tables)
    counts.steps = tables[layout.STEPS].num_rows if layout.STEPS in tables else 0
    service.check_backlog()
    try:
        result = service.uploads.store(client_id, seq, tables, steps_timed=timed)
    except StorageError as error:  # nothing of this upload is acknowledged: it may be retried
        raise errors.storage_refused(error, service.config.retry_after_s) from error
    service.metrics.accepted(result["stored"].get(layout.STEPS, 0))
    if not result["duplicate"]:
        service.metrics.ended(result["stored"].get(layout.EPISODES, 0))
        service.stats.uploaded(client_id, tables)
    return result, 200


def _json_tables(service: Service, doc: dict[str, Any]) -> dict[str, pa.Table]:
    unknown = sorted(set(doc) - set(layout.TABLES))
    if unknown:
        raise errors.bad_request(
            unknown[0], f"one of the tables {list(layout.TABLES)}", "an unknown key"
        )
    return {
        name: json_table(service.writer, name, rows) for name, rows in doc.items() if rows != []
    }

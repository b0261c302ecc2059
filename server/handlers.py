"""What each step and upload resource does with a parsed request, apart from any web framework.

The Flask routes (:mod:`server.app`) and the WSGI fast path (:mod:`server.wsgi`) both call these,
so the two answer every request, good or bad, the same way. ``counts.steps`` is set as soon as the
number of steps in the request is known, so a refused request's steps are counted as rejected.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import pyarrow as pa

from pipeline.format import layout
from pipeline.recording.recorder import Episode
from server import errors, replays
from server.bodies import parse_json
from server.columns import (
    TERMINATED,
    TRUNCATED,
    ColumnAnswer,
    ColumnStep,
    ColumnStepper,
    column_answer,
)
from server.config import ServerConfig
from server.errors import ApiError
from server.messages import (
    ARROW_TYPE,
    checked_observations,
    client_id_of,
    column_batch,
    episode_id_of,
    json_value,
    optional_bool,
    optional_int,
    parse_returns,
    parse_step,
    rows_as_columns,
    single_agent_rows,
    single_column_step,
)
from server.service import ACT, END, LOG, Service, StepItem
from server.uploads import json_table, parse_seq, read_arrow

VERBS = {"actions": ACT, "logged-actions": LOG, "end": END}


class Counts(Protocol):
    steps: int


def guard(config: ServerConfig, authorization: str | None, length: int | None,
          check_token: bool = True) -> None:  # fmt: skip
    """401 without the token (when one is set), 413 for a body past the limit: before any work."""
    if (
        check_token
        and config.token is not None
        and not hmac.compare_digest(
            (authorization or "").encode(), f"Bearer {config.token}".encode()
        )
    ):
        raise ApiError(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'")
    if length is not None and length > config.max_body_bytes:
        raise ApiError(413, f"request body of {length} bytes is larger than the server's "
                            f"limit of {config.max_body_bytes} bytes")  # fmt: skip


def start_episode(service: Service, doc: dict[str, Any], remote_addr: str | None,
                  counts: Counts) -> tuple[dict[str, Any], int]:  # fmt: skip
    """Open (or, for a retry, find) an episode; 201 when created, 200 when it was open."""
    counts.steps = 0
    episode_id = doc.get("episode_id")
    episode = _episode(
        service, episode_id_of(episode_id) if episode_id is not None else secrets.token_hex(8),
        doc, remote_addr,
    )  # fmt: skip
    episode, created = service.start(episode)
    return {"episode_id": episode.episode_id}, 201 if created else 200


def _episode(service: Service, episode_id: str, doc: dict[str, Any],
             remote_addr: str | None) -> Episode:  # fmt: skip
    return Episode(
        episode_id=episode_id,
        client_id=client_id_of(doc.get("client_id")) or remote_addr or "",
        training_enabled=optional_bool(doc, "training_enabled", True),
        seed=optional_int(doc, "seed"),
        reset_options=json_value(doc.get("options"), "options"),
        env_id=service.env_id,
    )


def episode_step(service: Service, episode_id: str, kind: str, doc: dict[str, Any],
                 counts: Counts) -> dict[str, Any]:  # fmt: skip
    """get_action, log_action or end_episode for one episode."""
    counts.steps = 1
    request = optional_int(doc, "request")
    try:
        return _episode_step(service, episode_id, kind, doc, request, counts)
    except ApiError as error:
        return _late_replay(service, error, [episode_id], [request], "request")[0]


def _episode_step(service: Service, episode_id: str, kind: str, doc: dict[str, Any],
                  request: int | None, counts: Counts) -> dict[str, Any]:  # fmt: skip
    episode = service.episodes.get(episode_id)
    truncated = optional_bool(doc, "truncated", False)
    if service.columns is not None and kind != LOG and _single_agent(doc):
        end = None if kind == ACT else TRUNCATED if truncated else TERMINATED
        column_step = single_column_step(doc, service.observation_space, episode_id, end)
        return service.columns.submit(column_step).answers[0]
    step = parse_step(doc, service.observation_space,
                      service.action_space if kind == LOG else None)  # fmt: skip
    counts.steps = len(step.observations)
    return service.step([StepItem(episode, step, kind, truncated, request)])[0]


def _single_agent(doc: dict[str, Any]) -> bool:
    return "observation" in doc and "observations" not in doc


def log_returns(service: Service, episode_id: str, doc: dict[str, Any],
                counts: Counts) -> dict[str, Any]:  # fmt: skip
    counts.steps = 1
    episode = service.episodes.get(episode_id)
    step = parse_returns(doc)
    with episode.lock:
        if episode.ended:
            service.episodes.get(episode_id)  # raises the 409
        service.returns(episode, step)
    return {"episode_id": episode_id}


def batch_step(service: Service, doc: dict[str, Any], remote_addr: str | None,
               counts: Counts) -> dict[str, Any]:  # fmt: skip
    """The batch form: many episodes' observations in one request, many actions back."""
    counts.steps = 1
    if "episode_ids" in doc:
        return _column_batch(service, doc, remote_addr, counts)
    entries = doc.get("episodes")
    if isinstance(entries, list) and entries and service.columns is not None and (
        single_agent_rows(entries)
    ):  # fmt: skip
        step, starts = rows_as_columns(entries, service.observation_space)
        answer = _run_columns(service, service.columns, step, starts, remote_addr, counts)
        return {"episodes": answer.answers}
    if not isinstance(entries, list) or not entries:
        raise errors.bad_request("episodes", "a non-empty list of episode steps",
                                 type(entries).__name__)  # fmt: skip
    checked = checked_observations(service.observation_space, entries)
    counts.steps = len(entries)
    numbered = [_numbered(entry, f"episodes[{i}]") for i, entry in enumerate(entries)]
    ids, requests = [i for i, _ in numbered], [request for _, request in numbered]
    try:
        with _starts_withdrawn_on_error(service) as started:
            items = [
                _batch_item(service, entry, i, remote_addr, checked[i], started, *numbered[i])
                for i, entry in enumerate(entries)
            ]
            return {"episodes": service.step(items)}
    except ApiError as error:
        return {"episodes": _late_replay(service, error, ids, requests, "request")}


def _column_batch(service: Service, doc: dict[str, Any], remote_addr: str | None,
                  counts: Counts) -> dict[str, Any]:  # fmt: skip
    """The columnar batch form: lists of one entry per episode in, lists of actions out."""
    if service.columns is None:  # the general path takes it row by row
        entries = _column_entries(doc)
        ids = [entry["episode_id"] for entry in entries]
        answers = batch_step(service, {"episodes": entries}, remote_addr, counts)["episodes"]
        answer = column_answer(answers)
    else:
        step, starts = column_batch(doc, service.observation_space)
        ids = step.episode_ids
        answer = _run_columns(service, service.columns, step, starts, remote_addr, counts)
    return {"episode_ids": ids, "actions": answer.actions, "action_logp": answer.action_logp,
            "policy_version": answer.policy_version}  # fmt: skip


def _run_columns(service: Service, columns: ColumnStepper, step: ColumnStep, starts: list[Any],
                 remote_addr: str | None, counts: Counts) -> ColumnAnswer:  # fmt: skip
    counts.steps = len(step.episode_ids)
    try:
        with _starts_withdrawn_on_error(service) as started:
            for episode_id, start in zip(step.episode_ids, starts, strict=True):
                if start is not None:
                    _start(service, _episode(service, episode_id, start, remote_addr), started)
            return columns.submit(step)
    except ApiError as error:
        return column_answer(_late_replay(service, error, step.episode_ids, step.requests,
                                          "requests"))  # fmt: skip


@contextmanager
def _starts_withdrawn_on_error(service: Service) -> Iterator[list[Episode]]:
    """The episodes a batch request opens, withdrawn again if the request is refused after it
    opened them (another row's unknown episode, say), so that the refusal writes nothing."""
    started: list[Episode] = []
    try:
        yield started
    except BaseException:
        for episode in started:
            service.episodes.withdraw(episode)
        raise


def _start(service: Service, episode: Episode, started: list[Episode]) -> None:
    episode, created = service.start(episode)
    if created:
        started.append(episode)


def _column_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The columnar batch form as ``episodes`` entries, for a space the columns do not take."""
    ids = doc.get("episode_ids")
    if not isinstance(ids, list) or not ids:
        raise errors.bad_request("episode_ids", "a non-empty list of episode ids",
                                 type(ids).__name__)  # fmt: skip
    entries: list[dict[str, Any]] = [{"episode_id": episode_id} for episode_id in ids]
    plural = {"observations": "observation", "rewards": "reward", "terminated": "terminated",
              "truncated": "truncated", "starts": "start", "infos": "info",
              "requests": "request"}  # fmt: skip
    for key, name in plural.items():
        values = doc.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != len(ids):
            raise errors.bad_request(key, f"a list of {len(ids)} entries (one per episode id)",
                                     type(values).__name__)  # fmt: skip
        for entry, value in zip(entries, values, strict=True):
            if value is not None:
                entry[name] = value
    return entries


def _late_replay(service: Service, error: ApiError, episode_ids: list[str],
                 requests: list[int | None], field: str) -> list[dict[str, Any]]:  # fmt: skip
    """A numbered request that met an episode it ended itself, in its first try (a retry after
    the answer was lost, or a copy that arrived while the first try ran): that try's answers,
    else the error. A request that met an open episode was recognised in its step, under the
    episode's lock (:mod:`server.replays`); a try keeps all its answers before it ends an
    episode, so this look finds them all."""
    if error.status == 409 and requests.count(None) != len(requests):
        lasts = service.episodes.last_requests(episode_ids)
        answers = replays.replayed_rows(episode_ids, requests, lasts, field)
        if answers is not None:
            return answers
    raise error


def _numbered(entry: Any, name: str) -> tuple[str, int | None]:
    """An entry of the batch form's episode id and request number, checked."""
    if not isinstance(entry, dict):
        raise errors.bad_request(name, "an object", type(entry).__name__)
    episode_id = episode_id_of(entry.get("episode_id"), name + ".episode_id")
    return episode_id, optional_int(entry, "request", name + ".request")


def _batch_item(service: Service, entry: dict[str, Any], index: int, remote_addr: str | None,
                checked: pa.Array | None, started: list[Episode], episode_id: str,
                request: int | None) -> StepItem:  # fmt: skip
    """One entry of the batch form: starts its episode if asked, ends it when it says so."""
    start = {} if entry.get("start") is True else entry.get("start")
    if isinstance(start, dict):
        _start(service, _episode(service, episode_id, start, remote_addr), started)
    episode = service.episodes.get(episode_id)
    step = parse_step(entry, service.observation_space, None, f"episodes[{index}].", checked)
    terminated = optional_bool(entry, "terminated", False)
    truncated = optional_bool(entry, "truncated", False)
    kind = END if terminated or truncated else ACT
    return StepItem(episode, step, kind, truncated and not terminated, request)


def upload(service: Service, header: Callable[[str], str | None], content_type: str | None,
           body: bytes, counts: Counts) -> dict[str, Any]:  # fmt: skip
    """A local-inference client's numbered batch (Arrow IPC or JSON), stored once."""
    client_id = header("X-Rlpipe-Client") or ""
    if not client_id:
        raise errors.bad_request("X-Rlpipe-Client", "the client's id", "nothing")
    seq = parse_seq(header("X-Rlpipe-Upload"))
    media_type = (content_type or "").split(";")[0].strip()
    if media_type == ARROW_TYPE:
        table_name = header("X-Rlpipe-Table")
        table_name = layout.STEPS if table_name is None else table_name
        if table_name not in layout.TABLES:
            raise errors.bad_request("X-Rlpipe-Table", f"one of {list(layout.TABLES)}",
                                     repr(table_name))  # fmt: skip
        tables = {table_name: read_arrow(body)}
    else:
        tables = _json_tables(service, parse_json(body, content_type))
    counts.steps = tables[layout.STEPS].num_rows if layout.STEPS in tables else 0
    service.check_backlog()
    result = service.uploads.store(client_id, seq, tables)
    service.metrics.accepted(result["stored"].get(layout.STEPS, 0))
    return result


def _json_tables(service: Service, doc: dict[str, Any]) -> dict[str, pa.Table]:
    unknown = sorted(set(doc) - set(layout.TABLES))
    if unknown:
        raise errors.bad_request(unknown[0], f"one of the tables {list(layout.TABLES)}",
                                 "an unknown key")  # fmt: skip
    return {
        name: json_table(service.writer, name, rows) for name, rows in doc.items() if rows != []
    }

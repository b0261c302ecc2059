"""The Flask app: HTTP in front of :class:`~server.service.Service`, JSON resources under ``/v1``.

``create_app(config)`` opens the dataset and returns the app; ``app.extensions["rlpipe"]`` is the
service, whose ``close()`` ends open episodes as truncated and closes the writer (the ``serve``
command calls it at shutdown). The server serves no files and lists no directories: anything not
routed here is a JSON 404.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

import pyarrow as pa
from flask import Flask, Response, g, jsonify, request

from pipeline import layout, spaces
from pipeline.recorder import Episode
from server import errors, openapi
from server.config import ServerConfig
from server.errors import ApiError
from server.messages import (
    ARROW_TYPE,
    episode_id_of,
    optional_bool,
    optional_int,
    parse_json,
    parse_returns,
    parse_step,
)
from server.service import ACT, END, LOG, Service, StepItem
from server.uploads import json_table, parse_seq, read_arrow
from server.weights import weights_response

_PUBLIC = {"health", "openapi_document"}


def create_app(config: ServerConfig) -> Flask:
    """Open the dataset named by ``config`` and build the app that serves it."""
    app = Flask("rlpipe.server")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    service = Service(config)
    app.extensions["rlpipe"] = service
    errors.register(app)
    _guards(app, config, service)
    _episode_routes(app, service)
    _data_routes(app, service)
    _info_routes(app, service)
    return app


def _guards(app: Flask, config: ServerConfig, service: Service) -> None:
    @app.before_request
    def _check() -> None:
        if config.token is not None and request.endpoint not in _PUBLIC:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {config.token}".encode()):
                raise ApiError(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'")
        length = request.content_length
        if length is not None and length > config.max_body_bytes:
            raise ApiError(413, f"request body of {length} bytes is larger than the server's "
                                f"limit of {config.max_body_bytes} bytes")  # fmt: skip

    @app.after_request
    def _count(response: Response) -> Response:
        service.metrics.response(response.status_code, getattr(g, "steps", 0))
        return response


def _body() -> dict[str, Any]:
    doc = parse_json(request.get_data(cache=False), request.content_type)
    g.steps = 1
    return doc


def _episode_routes(app: Flask, service: Service) -> None:
    @app.post("/v1/episodes")
    def start_episode() -> tuple[Response, int]:
        doc = _body()
        g.steps = 0
        episode_id = doc.get("episode_id")
        episode = Episode(
            episode_id=episode_id_of(episode_id) if episode_id is not None else _new_id(),
            client_id=str(doc.get("client_id") or request.remote_addr or ""),
            training_enabled=optional_bool(doc, "training_enabled", True),
            seed=optional_int(doc, "seed"),
            reset_options=doc.get("options"),
            env_id=service.env_id,
        )
        episode, created = service.start(episode)
        return jsonify({"episode_id": episode.episode_id}), 201 if created else 200

    def _one(episode_id: str, kind: str) -> Response:
        doc = _body()
        replayed = service.episodes.replay(episode_id, optional_int(doc, "request"))
        if replayed is not None:
            return jsonify(replayed)
        episode = service.episodes.get(episode_id)
        step = parse_step(doc, service.observation_space,
                          service.action_space if kind == LOG else None)  # fmt: skip
        g.steps = len(step.observations)
        item = StepItem(episode, step, kind, optional_bool(doc, "truncated", False),
                        optional_int(doc, "request"))  # fmt: skip
        return jsonify(service.step([item])[0])

    @app.post("/v1/episodes/<episode_id>/actions")
    def get_action(episode_id: str) -> Response:
        return _one(episode_id, ACT)

    @app.post("/v1/episodes/<episode_id>/logged-actions")
    def log_action(episode_id: str) -> Response:
        return _one(episode_id, LOG)

    @app.post("/v1/episodes/<episode_id>/end")
    def end_episode(episode_id: str) -> Response:
        return _one(episode_id, END)

    @app.post("/v1/episodes/<episode_id>/returns")
    def log_returns(episode_id: str) -> Response:
        doc = _body()
        episode = service.episodes.get(episode_id)
        step = parse_returns(doc)
        with episode.lock:
            if episode.ended:
                service.episodes.get(episode_id)  # raises the 409
            service.returns(episode, step)
        return jsonify({"episode_id": episode_id})

    @app.post("/v1/actions")
    def get_actions() -> Response:
        doc = _body()
        entries = doc.get("episodes")
        if not isinstance(entries, list) or not entries:
            raise errors.bad_request("episodes", "a non-empty list of episode steps",
                                     type(entries).__name__)  # fmt: skip
        items = [_batch_item(service, entry, f"episodes[{i}].") for i, entry in enumerate(entries)]
        g.steps = len(items)
        return jsonify({"episodes": service.step(items)})


def _batch_item(service: Service, entry: Any, prefix: str) -> StepItem:
    """One entry of the batch form: starts its episode if asked, ends it when it says so."""
    if not isinstance(entry, dict):
        raise errors.bad_request(prefix.rstrip("."), "an object", type(entry).__name__)
    episode_id = episode_id_of(entry.get("episode_id"), prefix + "episode_id")
    start = {} if entry.get("start") is True else entry.get("start")
    if isinstance(start, dict):
        service.start(Episode(
            episode_id=episode_id,
            client_id=str(start.get("client_id") or request.remote_addr or ""),
            training_enabled=optional_bool(start, "training_enabled", True),
            seed=optional_int(start, "seed"),
            reset_options=start.get("options"),
            env_id=service.env_id,
        ))  # fmt: skip
    episode = service.episodes.get(episode_id)
    step = parse_step(entry, service.observation_space, None, prefix)
    terminated = optional_bool(entry, "terminated", False)
    truncated = optional_bool(entry, "truncated", False)
    kind = END if terminated or truncated else ACT
    return StepItem(episode, step, kind, truncated and not terminated)


def _data_routes(app: Flask, service: Service) -> None:
    @app.post("/v1/uploads")
    def upload() -> Response:
        client_id = request.headers.get("X-Rlpipe-Client", "")
        if not client_id:
            raise errors.bad_request("X-Rlpipe-Client", "the client's id", "nothing")
        seq = parse_seq(request.headers.get("X-Rlpipe-Upload"))
        content_type = (request.content_type or "").split(";")[0].strip()
        if content_type == ARROW_TYPE:
            table_name = request.headers.get("X-Rlpipe-Table", layout.STEPS)
            if table_name not in layout.TABLES:
                raise errors.bad_request("X-Rlpipe-Table", f"one of {list(layout.TABLES)}",
                                         repr(table_name))  # fmt: skip
            tables = {table_name: read_arrow(request.get_data(cache=False))}
        else:
            tables = _json_tables(service, parse_json(request.get_data(cache=False), content_type))
        g.steps = tables[layout.STEPS].num_rows if layout.STEPS in tables else 0
        service.check_backlog()
        result = service.uploads.store(client_id, seq, tables)
        service.metrics.accepted(result["stored"].get(layout.STEPS, 0))
        return jsonify(result)

    @app.get("/v1/weights")
    def weights() -> Response:
        return weights_response(service.runner, request.args.get("version"))


def _json_tables(service: Service, doc: dict[str, Any]) -> dict[str, pa.Table]:
    unknown = sorted(set(doc) - set(layout.TABLES))
    if unknown:
        raise errors.bad_request(unknown[0], f"one of the tables {list(layout.TABLES)}",
                                 "an unknown key")  # fmt: skip
    return {
        name: json_table(service.writer, name, rows) for name, rows in doc.items() if rows != []
    }


def _info_routes(app: Flask, service: Service) -> None:
    @app.get("/v1/health")
    def health() -> Response:
        service.runner.refresh()
        version = service.runner.version
        return jsonify({
            "status": "ok",
            "policy_version": version,
            "acting_at_random": version is None,
            "open_episodes": len(service.episodes),
            "queue_depth": service.writer.backlog,
        })  # fmt: skip

    @app.get("/v1/spaces")
    def spaces_document() -> Response:
        return jsonify({
            "observation_space": spaces.space_to_json(service.observation_space),
            "action_space": spaces.space_to_json(service.action_space),
            "env_id": service.env_id,
        })  # fmt: skip

    @app.get("/v1/metrics")
    def metrics() -> Response:
        text = service.metrics.render(
            len(service.episodes), service.writer.backlog,
            service.writer.last_commit_seconds, service.runner.version,
        )  # fmt: skip
        return Response(text, mimetype="text/plain; version=0.0.4")

    @app.get("/v1/openapi.json")
    def openapi_document() -> Response:
        return jsonify(openapi.document())


def _new_id() -> str:
    return secrets.token_hex(8)

"""The Flask app: HTTP in front of :class:`~server.service.Service`, JSON resources under ``/v1``.

``create_app(config)`` opens the dataset and returns the app; ``app.extensions["rlpipe"]`` is the
service, whose ``close()`` ends open episodes as truncated and closes the writer (the ``serve``
command calls it at shutdown). The server serves no files and lists no directories (its one
page, the live dashboard at ``/``, is built in memory: :mod:`server.dashboard`): anything not
routed here is a JSON 404. The step and upload resources are those of
:data:`server.routes.ROUTES`, which :class:`server.wsgi.FastPath` answers in front of Flask.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, current_app, g, jsonify, request

from pipeline.format import spaces
from server import dashboard, errors, handlers, openapi, routes
from server.config import ServerConfig
from server.inference import PolicyRunner
from server.service import Service
from server.wsgi import FastPath

_PUBLIC = {"health", "openapi_document", "dashboard"}  # the page holds no data


def create_app(config: ServerConfig) -> Flask:
    """Open the dataset named by ``config`` and build the app that serves it."""
    app = Flask("rlpipe.server", static_folder=None)  # no files served, from anywhere
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    service = Service(config)
    app.extensions["rlpipe"] = service
    errors.register(app)
    _guards(app, config, service)
    _step_routes(app, service)
    _weights_route(app, service.runner)
    _info_routes(app, service)
    dashboard.register(app, service)
    app.wsgi_app = FastPath(app.wsgi_app, service)  # type: ignore[method-assign]
    return app


def _guards(app: Flask, config: ServerConfig, service: Service) -> None:
    @app.before_request
    def _check() -> None:
        g.started = time.perf_counter()
        public = request.endpoint in _PUBLIC
        authorization = None if public else request.headers.get("Authorization", "")
        handlers.guard(config, authorization, request.content_length)

    @app.after_request
    def _count(response: Response) -> Response:
        rule = request.url_rule
        route = routes.template(rule.rule) if rule is not None else "unrouted"
        seconds = time.perf_counter() - g.get("started", time.perf_counter())
        service.metrics.response(response.status_code, g.get("steps", 0), route, seconds)
        if response.status_code >= 400:
            service.stats.refused(response.status_code, route, response.get_json(silent=True))
        return response


def _raw_body() -> bytes:
    """The request body. One sent without a length (chunked) is read to a byte past the limit
    and refused with 413 when it is longer: werkzeug's own stream cuts it at the limit without
    a word, which would turn an oversized body into a confusing 400 for malformed content."""
    if request.content_length is not None or not request.environ.get("wsgi.input_terminated"):
        return request.get_data(cache=False)  # the guard has checked the length already
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    body: bytes = request.environ["wsgi.input"].read(limit + 1)
    if len(body) > limit:
        raise errors.ApiError(
            413,
            f"request body of more than {limit} bytes is larger than the "
            f"server's limit of {limit} bytes",
        )
    return body


def _step_routes(app: Flask, service: Service) -> None:
    """The table of :mod:`server.routes`, the one the fast path answers from, as Flask routes."""
    for route in routes.ROUTES:

        def view(route: routes.Route = route, episode_id: str = "") -> tuple[Response, int]:
            incoming = handlers.Incoming(
                _raw_body(),
                request.content_type,
                request.remote_addr,
                request.headers.get,
                episode_id,
            )
            answer, status = route.handle(service, incoming, g)
            return jsonify(answer), status

        app.add_url_rule(route.rule, route.endpoint, view, methods=["POST"])


def _weights_route(app: Flask, runner: PolicyRunner) -> None:
    @app.get("/v1/weights")
    def weights() -> Response:
        """The newest checkpoint file's own bytes (an ``.npz`` read with ``allow_pickle=False``)
        with its version, or 304 when ``?version=N`` names the version the client holds."""
        runner.refresh()
        path, version = runner.checkpoint_path, runner.version
        if path is None or version is None:
            raise errors.ApiError(
                404,
                "no checkpoint has been published yet; act at random until one is "
                "(GET /v1/health says when)",
            )
        have = request.args.get("version")
        if have is not None and _version(have) == version:
            response = Response(status=304)
        else:
            response = Response(path.read_bytes(), mimetype="application/x-npz")
            response.headers["Content-Disposition"] = f'attachment; filename="{path.name}"'
        response.headers["X-Rlpipe-Policy-Version"] = str(version)
        return response


def _version(have: str) -> int:
    try:
        version = int(have)
    except ValueError:
        version = None
    if version is None or not -(2**63) <= version < 2**63:
        raise errors.bad_request("version", "a 64-bit integer", repr(have[:40]))
    return version


def _info_routes(app: Flask, service: Service) -> None:
    @app.get("/v1/health")
    def health() -> Response:
        service.runner.refresh()
        version = service.runner.version
        return jsonify(
            {
                "policy_version": version,
                "acting_at_random": version is None,
                "refused_checkpoint": service.runner.refused,
                "open_episodes": len(service.episodes),
                "queue_depth": service.writer.backlog,
                **_storage(service),
            }
        )

    document = {  # spaces do not change: built once (an 84x84x3 Box's bounds took ~0.1 s)
        "observation_space": spaces.space_to_json(service.observation_space),
        "action_space": spaces.space_to_json(service.action_space),
        "env_id": service.env_id,
    }

    @app.get("/v1/spaces")
    def spaces_document() -> Response:
        return jsonify(document)

    @app.get("/v1/metrics")
    def metrics() -> Response:
        version = service.runner.version
        text, content_type = service.metrics.render(
            request.headers.get("Accept", ""),
            open_episodes=len(service.episodes),
            queue_depth=service.writer.backlog,
            commit_seconds=service.writer.last_commit_seconds,
            policy_version=-1 if version is None else version,
            storage_failing=service.writer.disk.error is not None,
            storage_errors=service.writer.disk.failures,
        )
        return Response(text, content_type=content_type)

    @app.get("/v1/openapi.json")
    def openapi_document() -> Response:
        spaces = service.observation_space, service.action_space
        return jsonify(openapi.document(*spaces, token=service.config.token is not None))


def _storage(service: Service) -> dict[str, Any]:
    """Health's word on the dataset's disk: "degraded" while it refuses writes, and why."""
    refused = service.writer.disk.error
    if refused is None:
        return {"status": "ok", "storage_error": None}
    since = datetime.fromtimestamp(refused.since, UTC).isoformat()
    return {"status": "degraded", "storage_error": {"message": refused.reason, "since": since}}

"""The Flask app: HTTP in front of :class:`~server.service.Service`, JSON resources under ``/v1``.

``create_app(config)`` opens the dataset and returns the app; ``app.extensions["rlpipe"]`` is the
service, whose ``close()`` ends open episodes as truncated and closes the writer (the ``serve``
command calls it at shutdown). The server serves no files and lists no directories: anything not
routed here is a JSON 404.

The step and upload resources are declared once, in :data:`server.routes.ROUTES`: registered
here as Flask routes (the URL map the OpenAPI document is checked against, and what answers a
body sent without a ``Content-Length``), and answered by :class:`server.wsgi.FastPath` in front
of Flask otherwise.
"""

from __future__ import annotations

import re
import time

from flask import Flask, Response, current_app, g, jsonify, request

from pipeline.format import spaces
from server import errors, handlers, openapi, routes
from server.config import ServerConfig
from server.service import Service
from server.weights import weights_response
from server.wsgi import FastPath

_PUBLIC = {"health", "openapi_document"}
_RULE_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")  # <path:episode_id> -> {episode_id}


def create_app(config: ServerConfig) -> Flask:
    """Open the dataset named by ``config`` and build the app that serves it."""
    app = Flask("rlpipe.server", static_folder=None)  # no files served, from anywhere
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    service = Service(config)
    app.extensions["rlpipe"] = service
    errors.register(app)
    _guards(app, config, service)
    _step_routes(app, service)
    _data_routes(app, service)
    _info_routes(app, service)
    app.wsgi_app = FastPath(app.wsgi_app, service)  # type: ignore[method-assign]
    return app


def _guards(app: Flask, config: ServerConfig, service: Service) -> None:
    @app.before_request
    def _check() -> None:
        g.started = time.perf_counter()
        public = request.endpoint in _PUBLIC
        handlers.guard(
            config,
            None if public else request.headers.get("Authorization", ""),
            request.content_length,
            check_token=not public,
        )

    @app.after_request
    def _count(response: Response) -> Response:
        rule = request.url_rule
        route = _RULE_PARAMETER.sub(r"{\1}", rule.rule) if rule is not None else "unrouted"
        seconds = time.perf_counter() - g.get("started", time.perf_counter())
        service.metrics.response(response.status_code, g.get("steps", 0), route, seconds)
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


def _data_routes(app: Flask, service: Service) -> None:
    @app.get("/v1/weights")
    def weights() -> Response:
        return weights_response(service.runner, request.args.get("version"))


def _info_routes(app: Flask, service: Service) -> None:
    @app.get("/v1/health")
    def health() -> Response:
        service.runner.refresh()
        version = service.runner.version
        return jsonify(
            {
                "status": "ok",
                "policy_version": version,
                "acting_at_random": version is None,
                "refused_checkpoint": service.runner.refused,
                "open_episodes": len(service.episodes),
                "queue_depth": service.writer.backlog,
            }
        )

    @app.get("/v1/spaces")
    def spaces_document() -> Response:
        return jsonify(
            {
                "observation_space": spaces.space_to_json(service.observation_space),
                "action_space": spaces.space_to_json(service.action_space),
                "env_id": service.env_id,
            }
        )

    @app.get("/v1/metrics")
    def metrics() -> Response:
        text, content_type = service.metrics.render(
            request.headers.get("Accept", ""),
            len(service.episodes),
            service.writer.backlog,
            service.writer.last_commit_seconds,
            service.runner.version,
        )
        return Response(text, content_type=content_type)

    @app.get("/v1/openapi.json")
    def openapi_document() -> Response:
        return jsonify(openapi.document(service.observation_space, service.action_space))

"""The WSGI fast path: the step and upload resources answered without Flask's per-request work.

A bare Flask route costs more here than a whole step should (about 1,100 requests a second on
this machine, below what the step bars need), so ``create_app`` installs :class:`FastPath` as the
app's ``wsgi_app`` (Flask's documented middleware hook). It takes ``POST`` on the hot resources,
dispatches on ``PATH_INFO``, and calls the same :mod:`server.handlers` as the Flask routes, with
the same guards, error bodies and metrics; anything else (other methods, other paths, requests
without a ``Content-Length``) goes to Flask unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from server import handlers
from server.bodies import parse_json
from server.errors import error_answer
from server.service import Service

_PREFIX = "/v1/episodes/"
_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type",
            429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}  # fmt: skip

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Counts:
    steps = 0


class FastPath:
    """WSGI middleware: hot routes answered here, everything else by ``app``."""

    def __init__(self, app: WsgiApp, service: Service) -> None:
        self.app = app
        self.service = service

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        route = self._route(environ) if environ.get("REQUEST_METHOD") == "POST" else None
        if route is None or not environ.get("CONTENT_LENGTH"):
            return self.app(environ, start_response)
        started = time.perf_counter()
        counts = _Counts()
        headers: list[tuple[str, str]] = []
        try:
            status, answer = route(environ, counts)
        except Exception as error:  # the same answers as the Flask routes' errorhandler
            status, answer, retry_after = error_answer(error)
            if retry_after is not None:
                headers.append(("Retry-After", str(retry_after)))
        try:
            body = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError as error:  # a bug; still answered as JSON, and logged
            status, answer, _ = error_answer(error)
            body = orjson.dumps(answer)
        seconds = time.perf_counter() - started
        self.service.metrics.response(status, counts.steps, _template(environ), seconds)
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response(f"{status} {_REASONS.get(status, '')}", headers)
        return [body]

    def _route(self, environ: dict[str, Any]) -> Callable[..., tuple[int, Any]] | None:
        path: str = environ.get("PATH_INFO", "")
        if path.startswith(_PREFIX):
            episode_id, _, verb = path[len(_PREFIX) :].rpartition("/")  # the id may hold '/'
            if not episode_id or (verb not in handlers.VERBS and verb != "returns"):
                return None
            episode_id = episode_id.encode("latin-1").decode("utf-8", "replace")  # as werkzeug
            return lambda environ, counts: self._episode(environ, counts, episode_id, verb)
        return {"/v1/episodes": self._start, "/v1/actions": self._batch,
                "/v1/uploads": self._upload}.get(path)  # fmt: skip

    def _body(self, environ: dict[str, Any]) -> bytes:
        length = int(environ["CONTENT_LENGTH"])
        handlers.guard(self.service.config, environ.get("HTTP_AUTHORIZATION", ""), length)
        body: bytes = environ["wsgi.input"].read(length)
        return body

    def _json(self, environ: dict[str, Any]) -> dict[str, Any]:
        return parse_json(self._body(environ), environ.get("CONTENT_TYPE"))

    def _episode(self, environ: dict[str, Any], counts: _Counts, episode_id: str,
                 verb: str) -> tuple[int, Any]:  # fmt: skip
        doc = self._json(environ)
        if verb == "returns":
            return 200, handlers.log_returns(self.service, episode_id, doc, counts)
        return 200, handlers.episode_step(self.service, episode_id, verb, doc, counts)

    def _start(self, environ: dict[str, Any], counts: _Counts) -> tuple[int, Any]:
        doc = self._json(environ)
        answer, status = handlers.start_episode(self.service, doc, environ.get("REMOTE_ADDR"),
                                                counts)  # fmt: skip
        return status, answer

    def _batch(self, environ: dict[str, Any], counts: _Counts) -> tuple[int, Any]:
        doc = self._json(environ)
        return 200, handlers.batch_step(self.service, doc, environ.get("REMOTE_ADDR"), counts)

    def _upload(self, environ: dict[str, Any], counts: _Counts) -> tuple[int, Any]:
        body = self._body(environ)

        def header(name: str) -> str | None:
            value: str | None = environ.get("HTTP_" + name.upper().replace("-", "_"))
            return value

        content_type = environ.get("CONTENT_TYPE")
        return 200, handlers.upload(self.service, header, content_type, body, counts)


def _template(environ: dict[str, Any]) -> str:
    """The route's template, as the Flask routes' metrics name it (an episode's id left out)."""
    path: str = environ.get("PATH_INFO", "")
    if path.startswith(_PREFIX):
        return _PREFIX + "{episode_id}/" + path.rpartition("/")[2]
    return path

"""The WSGI fast path: the step and upload resources answered without Flask's per-request work.

A bare Flask route costs more here than a whole step should (about 1,100 requests a second on
this machine, below what the step bars need), so ``create_app`` installs :class:`FastPath` as the
app's ``wsgi_app`` (Flask's documented middleware hook). It takes ``POST`` on the routes of
:data:`server.routes.ROUTES`, the table Flask's own routes are registered from, with the same
guards, error bodies and metrics; anything else (other methods, other paths, requests without a
``Content-Length``) goes to Flask unchanged.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import orjson

from server import handlers, routes
from server.errors import error_answer
from server.service import Service

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Counts:
    steps = 0


class FastPath:
    """WSGI middleware: the routes of :data:`server.routes.ROUTES` answered here, everything
    else by ``app``."""

    def __init__(self, app: WsgiApp, service: Service) -> None:
        self.app = app
        self.service = service

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        found = routes.match(environ.get("PATH_INFO", ""))
        if found is None or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        if not environ.get("CONTENT_LENGTH"):
            return self.app(environ, start_response)  # Flask reads a chunked body
        started = time.perf_counter()
        counts = _Counts()
        headers: list[tuple[str, str]] = []
        try:
            answer, status = found[0].handle(
                self.service, self._incoming(environ, found[1]), counts
            )
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
        route = routes.template(found[0].rule)
        self.service.metrics.response(status, counts.steps, route, seconds)
        if status >= 400:
            self.service.stats.refused(status, route, answer)
        headers += [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        start_response(_status_line(status), headers)
        return [body]

    def _incoming(self, environ: dict[str, Any], episode_id: str) -> handlers.Incoming:
        length = int(environ["CONTENT_LENGTH"])
        handlers.guard(self.service.config, environ.get("HTTP_AUTHORIZATION", ""), length)

        def header(name: str) -> str | None:
            value: str | None = environ.get("HTTP_" + name.upper().replace("-", "_"))
            return value

        return handlers.Incoming(
            environ["wsgi.input"].read(length),
            environ.get("CONTENT_TYPE"),
            environ.get("REMOTE_ADDR"),
            header,
            episode_id,
        )


@functools.cache
def _status_line(status: int) -> str:
    """``"200 OK"``: HTTPStatus(status) is an Enum lookup, 1.6% of the server's Python time
    under 8x16 vector clients."""
    return f"{status} {HTTPStatus(status).phrase}"

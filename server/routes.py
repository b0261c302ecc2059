"""The step and upload resources, declared once: the table both front ends are built from.

:func:`server.app.create_app` registers each :class:`Route` with Flask, and the WSGI fast path
(:mod:`server.wsgi`) answers the same routes by :func:`match`, so a resource is named, parsed
and handled in one place. Each route's handler takes the request as an :class:`Incoming`, whichever
front end read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from server import handlers
from server.bodies import parse_json
from server.handlers import Counts
from server.requests import ACT, END, LOG
from server.service import Service

Answer = tuple[Any, int]  # the JSON answer and its status


@dataclass
class Incoming:
    """One request, as either front end hands it to a route."""

    body: bytes
    content_type: str | None
    remote_addr: str | None
    header: Callable[[str], str | None]
    episode_id: str = ""

    def json(self) -> dict[str, Any]:
        return parse_json(self.body, self.content_type)


@dataclass(frozen=True)
class Route:
    """``POST`` on ``rule`` (Flask's syntax), answered by ``handle``."""

    endpoint: str
    rule: str
    handle: Callable[[Service, Incoming, Counts], Answer]

    @property
    def template(self) -> str:
        """The path as OpenAPI and the metrics name it: ``/v1/episodes/{episode_id}/end``."""
        return self.rule.replace("<path:episode_id>", "{episode_id}")


def _start(service: Service, incoming: Incoming, counts: Counts) -> Answer:
    return handlers.start_episode(service, incoming.json(), incoming.remote_addr, counts)


def _step(verb: str) -> Callable[[Service, Incoming, Counts], Answer]:
    def handle(service: Service, incoming: Incoming, counts: Counts) -> Answer:
        doc = incoming.json()
        return handlers.episode_step(service, incoming.episode_id, verb, doc, counts), 200

    return handle


def _returns(service: Service, incoming: Incoming, counts: Counts) -> Answer:
    return handlers.log_returns(service, incoming.episode_id, incoming.json(), counts), 200


def _batch(service: Service, incoming: Incoming, counts: Counts) -> Answer:
    return handlers.batch_step(service, incoming.json(), incoming.remote_addr, counts), 200


def _upload(service: Service, incoming: Incoming, counts: Counts) -> Answer:
    answer = handlers.upload(service, incoming.header, incoming.content_type, incoming.body, counts)
    return answer, 200


_EPISODE = "/v1/episodes/<path:episode_id>"
ROUTES = (
    Route("start_episode", "/v1/episodes", _start),
    Route("get_action", f"{_EPISODE}/{ACT}", _step(ACT)),
    Route("log_action", f"{_EPISODE}/{LOG}", _step(LOG)),
    Route("end_episode", f"{_EPISODE}/{END}", _step(END)),
    Route("log_returns", f"{_EPISODE}/returns", _returns),
    Route("get_actions", "/v1/actions", _batch),
    Route("upload", "/v1/uploads", _upload),
)
_EXACT = {route.rule: route for route in ROUTES if "<" not in route.rule}
_PREFIX = _EPISODE.partition("<")[0]
_VERBS = {
    route.rule.rpartition("/")[2]: route for route in ROUTES if route.rule.startswith(_EPISODE)
}


def match(path: str) -> tuple[Route, str] | None:
    """The route of a request path, and the episode id it names (as werkzeug reads it)."""
    route = _EXACT.get(path)
    if route is not None:
        return route, ""
    if not path.startswith(_PREFIX):
        return None
    episode_id, _, verb = path[len(_PREFIX) :].rpartition("/")  # the id may hold '/'
    route = _VERBS.get(verb)
    if route is None or not episode_id:
        return None
    return route, episode_id.encode("latin-1").decode("utf-8", "replace")

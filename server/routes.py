"""The step and upload resources, declared once: the table both front ends are built from.

:func:`server.app.create_app` registers each :class:`Route` with Flask, and the WSGI fast path
(:mod:`server.wsgi`) answers the same routes by :func:`match`, so a resource is named, parsed
and handled in one place. Each route's handler takes the request as a
:class:`~server.handlers.Incoming`, whichever front end read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from server import handlers
from server.handlers import Counts, Incoming, Reply
from server.requests import ACT, END, LOG
from server.service import Service


@dataclass(frozen=True)
class Route:
    """``POST`` on ``rule`` (Flask's syntax), answered by ``handle``."""

    endpoint: str
    rule: str
    handle: Callable[[Service, Incoming, Counts], Reply]


def template(rule: str) -> str:
    """A rule as OpenAPI and the metrics name it: ``/v1/episodes/{episode_id}/end``."""
    return rule.replace("<path:episode_id>", "{episode_id}")


_EPISODE = "/v1/episodes/<path:episode_id>"
UPLOADS = "/v1/uploads"
ROUTES = (
    Route("start_episode", "/v1/episodes", handlers.start_episode),
    Route("get_action", f"{_EPISODE}/{ACT}", partial(handlers.episode_step, ACT)),
    Route("log_action", f"{_EPISODE}/{LOG}", partial(handlers.episode_step, LOG)),
    Route("end_episode", f"{_EPISODE}/{END}", partial(handlers.episode_step, END)),
    Route("log_returns", f"{_EPISODE}/returns", handlers.log_returns),
    Route("get_actions", "/v1/actions", handlers.batch_step),
    Route("upload", UPLOADS, handlers.upload),
)
_EXACT = {route.rule: route for route in ROUTES if "<" not in route.rule}
_PREFIX = _EPISODE.partition("<")[0]
_VERBS = {
    route.rule.rpartition("/")[2]: route for route in ROUTES if route.rule.startswith(_EPISODE)
}


def by_endpoint(endpoint: str) -> Route:
    """The route of an endpoint name."""
    return next(route for route in ROUTES if route.endpoint == endpoint)


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

"""The live page: ``GET /`` (one HTML file, script and styles inline) and ``GET /v1/stats``.

The page is built once per app from ``dashboard.html`` and the chart script of
:mod:`pipeline.charts`: nothing is fetched from elsewhere (simulators often run on networks
without internet), and no other file is served. Its Content-Security-Policy lets it talk to
this server alone. The page itself is public, as health is: it holds no data. It reads
``/v1/stats`` every second, with the token when the server has one; the server says in the
page whether it does, so the page asks for the token before its first request rather than
after a 401.
"""

from __future__ import annotations

import json
from importlib.resources import files

from flask import Flask, Response, jsonify

from pipeline import charts
from server.service import Service
from server.stats import snapshot

_POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def page(token_required: bool) -> str:
    """The page's HTML."""
    template = files("server").joinpath("dashboard.html").read_text(encoding="utf-8")
    return (
        template.replace("/*__CHART_STYLE__*/", charts.STYLE)
        .replace("/*__CHART_SCRIPT__*/", charts.script())
        .replace("/*__TOKEN_REQUIRED__*/false", json.dumps(token_required))
    )


def register(app: Flask, service: Service) -> None:
    """``GET /`` and ``GET /v1/stats`` on ``app``."""
    html = page(service.config.token is not None).encode()

    @app.get("/")
    def dashboard() -> Response:
        response = Response(html, mimetype="text/html")
        response.headers["Content-Security-Policy"] = _POLICY
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/v1/stats")
    def stats() -> Response:
        service.runner.refresh()
        response = jsonify(snapshot(service))
        response.headers["Cache-Control"] = "no-store"
        return response

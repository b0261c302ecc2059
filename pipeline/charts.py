"""The chart script and styles of rlpipe's HTML pages: inline SVG, no library, nothing fetched.

The server's live page (:mod:`server.dashboard`) and ``rlpipe inspect --html``
(:mod:`pipeline.commands.report`) put both in the page itself, so the page works on a network
without internet and a report can be mailed as one file. ``charts.js`` beside this module
defines ``RlCharts.line`` (lines, with a p10-p90 band) and ``RlCharts.bars``.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

STYLE = """
.rl-chart { width: 100%; height: auto; display: block; }
.rl-grid { stroke: #e5e7eb; stroke-width: 1; }
.rl-axis { stroke: #9ca3af; stroke-width: 1; }
.rl-tick, .rl-legend { font: 11px system-ui, sans-serif; fill: #4b5563; }
.rl-label { font: 11px system-ui, sans-serif; fill: #6b7280; }
.rl-empty { font: 13px system-ui, sans-serif; fill: #9ca3af; }
"""


@cache
def script() -> str:
    """The chart script's text (``pipeline/charts.js``)."""
    return files("pipeline").joinpath("charts.js").read_text(encoding="utf-8")

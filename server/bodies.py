"""Reading a request's JSON body: one object, or a 400 that names what no dataset can hold.

orjson reads a good body; what it refuses, Python's json reads again to say why and where.
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

from server.errors import ApiError, bad_request

JSON_TYPE = "application/json"

MAX_DEPTH = 64
"""How deep a body's arrays and objects may nest (numpy's own limit of dimensions): deeper
bodies are refused before anything reads them, as Python's json and the writers would fail on
them mid-request."""


def parse_json(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that names the first field no dataset can hold:
    NaN and Infinity (also 1e999), strings with lone surrogates (not UTF-8, so not storable),
    and nesting deeper than :data:`MAX_DEPTH`."""
    if (content_type or "").split(";")[0].strip() != JSON_TYPE:
        raise ApiError(415, f"Content-Type: expected {JSON_TYPE}, got {content_type or 'none'}")
    body = body or b"{}"
    try:  # orjson parses a step's body in a fifth of the time; what it refuses, json explains
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = _parse_refused(body)
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH:  # in C: only such a body can be deep
        _refuse_deep(doc)
    return _object(doc)


def _parse_refused(body: bytes) -> Any:
    """What orjson refused, read by json to say why: malformed JSON, a non-finite number or a
    lone surrogate (json reads the last two, so that the 400 can name their field)."""
    try:
        doc = json.loads(body, parse_constant=_refuse_constant)
    except _NonFinite:
        doc = json.loads(body)  # NaN and Infinity read this time, to name where they are
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ApiError(400, f"body: expected a JSON object, got malformed JSON ({error})") from None
    _refuse_unstorable(doc)
    return doc


def _too_deep() -> ApiError:
    return bad_request(
        "body", f"arrays and objects nested at most {MAX_DEPTH} deep", "deeper nesting"
    )


def _refuse_deep(doc: Any) -> None:
    """The 400 for nesting deeper than :data:`MAX_DEPTH`, found a level at a time (no recursion)."""
    level = [doc] if isinstance(doc, dict | list) else []
    for _ in range(MAX_DEPTH):
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, dict | list)
        ]
    if level:
        raise _too_deep()


def _object(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise bad_request("body", "a JSON object", type(doc).__name__)
    return doc


class _NonFinite(Exception):
    """NaN, Infinity or -Infinity in a body: JSON has no such numbers, Python's json reads them."""


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


def _refuse_unstorable(doc: Any) -> None:
    """The 400 naming the first non-finite number's or lone surrogate's field
    (``observations[1][2]``, ``episodes[0].reward``), in the order the body gives them."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            got = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
            raise bad_request(path or "body", "finite numbers", got)
        if isinstance(value, str) and not _utf8(value):
            raise bad_request(
                path or "body", "text that is valid UTF-8 (no lone surrogates)", ascii(value)[:40]
            )
        if isinstance(value, dict):
            for key in value:
                if not _utf8(key):
                    where = f"{path}.{key!a}" if path else ascii(key)
                    raise bad_request(
                        where, "keys that are valid UTF-8 (no lone surrogates)", ascii(key)[:40]
                    )
            stack += reversed([(f"{path}.{key}" if path else key, v) for key, v in value.items()])
        elif isinstance(value, list):
            stack += reversed([(f"{path}[{i}]", item) for i, item in enumerate(value)])


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True

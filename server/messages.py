"""Reading request bodies: one JSON object, and checked values out of it, or a 400 that names
the field.

orjson reads a good body; what it refuses, Python's json reads again to say why and where. Every
value a step request carries is checked here, once: observations and logged actions against the
spaces through :func:`batch` (:mod:`pipeline.recording.batches`, one numpy pass for a Box of
floats), rewards, flags, request numbers, infos and ids by the small functions below.
:mod:`server.requests` puts them together into the rows of a request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import orjson

from pipeline.errors import SchemaError
from pipeline.recording import batches
from server.errors import ApiError, bad_request

ARROW_TYPE = "application/vnd.apache.arrow.stream"
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
    if body.count(b"[") + body.count(b"{") > MAX_DEPTH and not _nests_within(body, MAX_DEPTH):
        raise _too_deep()  # only a body with that many brackets can be so deep
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


def _nests_within(body: bytes, limit: int) -> bool:
    """Whether a well-formed JSON body's arrays and objects nest at most ``limit`` deep, read
    from its bytes by bytes methods: about 10x faster than walking the parsed document (a
    64-env batch's body: 15-21 us against 140-190).

    Escaped backslashes and quotes go first, then every byte but brackets and quotes, and
    braces become brackets (in well-formed JSON each closes its own kind). Two adjacent quotes
    go next (an empty string, or two strings joined into one: the quotes left still
    alternate), and what lies between a quote and the next is inside a string. The structure
    left loses its innermost empty pairs a level at a time."""
    if b"\\" in body:  # only inside strings
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    shape = body.translate(_BRACKETS, _NOT_STRUCTURE).replace(b'""', b"")
    if b'"' in shape:
        shape = b"".join(shape.split(b'"')[::2])
    for _ in range(limit):
        if not shape:
            return True
        shape = shape.replace(b"[]", b"")
    return not shape


_BRACKETS = bytes.maketrans(b"{}", b"[]")
_NOT_STRUCTURE = bytes(range(256)).translate(None, b'[]{}"')  # every byte but these


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


def batch(space: gym.Space[Any], values: list[Any], names: list[str] | str) -> Any:
    """The values as one checked batch of the space's layout
    (:func:`pipeline.recording.batches.checked`); else a 400 naming every bad value (for one
    name, the field and its rows)."""
    try:
        return batches.checked(space, values, names)
    except SchemaError as error:
        if isinstance(names, str):
            raise
        problems = error.problems
    raise ApiError(
        400, "; ".join(f"field '{p.field}': expected {p.expected}, got {p.got}" for p in problems)
    )


def keyed(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise bad_request(name, "an object keyed by agent id", type(value).__name__)
    return value


def required(doc: dict[str, Any], key: str, prefix: str) -> Any:
    if key not in doc:
        raise bad_request(prefix + key, "a value", "nothing")
    return doc[key]


def reward(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise bad_request(name, "a finite number", repr(value)[:40])
    return float(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def int64(value: Any, name: str) -> int | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63
    ):
        raise bad_request(name, "a 64-bit integer or null", repr(value))
    return value


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise bad_request(name, "true or false", repr(value))
    return value


def client_id_of(value: Any) -> str | None:
    """A start's ``client_id``: a string of at most 200 characters, or null for the caller's
    address. It is stored in every row as text, so nothing else is taken in its place."""
    if value is not None and (not isinstance(value, str) or len(value) > 200):
        expected = "a string of at most 200 characters or null"
        raise bad_request("client_id", expected, ascii(value)[:40])
    return value


def column(
    doc: dict[str, Any],
    key: str,
    n: int,
    check: Callable[[Any, str], Any] | None = None,
    fast: Callable[[list[Any]], bool] = lambda values: False,
    default: Any = None,
    required: bool = False,
) -> list[Any]:
    """``doc[key]``, a list of ``n`` values (``default`` each when it is left out), each checked
    by ``check`` unless ``fast`` finds them all good at once: the batch form's rows would spend
    more on checks made one by one than on their log."""
    values = doc.get(key)
    if values is None and not required:
        return [default] * n
    if not isinstance(values, list) or len(values) != n:
        got = f"{len(values)} entries" if isinstance(values, list) else type(values).__name__
        raise bad_request(key, f"a list of {n} entries (one per episode id)", got)
    if check is None or fast(values):
        return values
    return [check(value, f"{key}[{i}]") for i, value in enumerate(values)]


def plain_ids(ids: list[Any]) -> bool:
    """Whether every id is a string of 1 to 200 characters, not '.' or '..'."""
    if set(map(type, ids)) != {str} or "." in ids or ".." in ids:
        return False
    lengths = list(map(len, ids))
    return min(lengths) > 0 and max(lengths) <= 200


def nulls(values: list[Any]) -> bool:
    return values.count(None) == len(values)


def no_text(values: list[Any]) -> bool:
    return str not in set(map(type, values))


def floats(values: list[Any]) -> bool:
    return set(map(type, values)) <= {float} and all(map(math.isfinite, values))


def bools(values: list[Any]) -> bool:
    return set(map(type, values)) <= {bool}


def int64s(values: list[Any]) -> bool:
    """Whether every value is null, or every value a 64-bit integer."""
    if nulls(values):
        return True
    return set(map(type, values)) == {int} and min(values) >= -(2**63) and max(values) < 2**63


def json_value(value: Any, name: str) -> Any:
    """An info or a start's options (any JSON value, stored as JSON text); a string must be
    JSON text already, as the writer takes it (docs/format.md, section 4)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            raise bad_request(name, "an object or JSON text", repr(value[:40])) from None
    return value

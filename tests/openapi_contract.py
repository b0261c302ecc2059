"""The server's OpenAPI document read as a contract: request schemas to build bodies from, and
the check that an answer is one the document lists, with a body that matches its schema."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import jsonschema
import requests
from hypothesis import strategies as st

JSON = "application/json"


def resolved(document: dict[str, Any], schema: Any) -> Any:
    """``schema`` with every ``#/components/schemas/...`` reference replaced by its target (the
    document's references never loop), so that hypothesis-jsonschema and jsonschema read it."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            name = schema["$ref"].removeprefix("#/components/schemas/")
            return resolved(document, document["components"]["schemas"][name])
        return {key: resolved(document, value) for key, value in schema.items()}
    if isinstance(schema, list):
        return [resolved(document, value) for value in schema]
    return schema


def schema(document: dict[str, Any], name: str) -> Any:
    return resolved(document, document["components"]["schemas"][name])


def request_schema(document: dict[str, Any], template: str, method: str = "post") -> Any:
    body = document["paths"][template][method]["requestBody"]["content"][JSON]["schema"]
    return resolved(document, body)


def template_of(document: dict[str, Any], path: str) -> str:
    """The document's path template that ``path`` (percent-encoded) falls under."""
    for template in document["paths"]:
        if re.fullmatch(re.sub(r"\{[a-z_]+\}", "[^/]+", template), path):
            return template
    raise AssertionError(f"no path of the document matches {path}")


def check_answer(
    document: dict[str, Any], template: str, method: str, response: requests.Response
) -> None:
    """The answer's status is listed for this path and method, never a 5xx; a JSON body (every
    error's) matches the schema listed for the status; its headers are the listed ones."""
    status = response.status_code
    where = f"{method.upper()} {template} -> {status}: {response.text[:300]}"
    assert status < 500, where
    listed = document["paths"][template][method]["responses"]
    assert str(status) in listed, where
    content = listed[str(status)].get("content", {})
    if JSON in content:
        assert response.headers["Content-Type"].startswith(JSON), where
        body = response.json()
        jsonschema.validate(body, resolved(document, content[JSON]["schema"]))
        if status >= 400:
            assert body["error"]["status"] == status, where
    for header in listed[str(status)].get("headers", {}):
        assert header in response.headers, where


_KNOWN = {
    "type",
    "contentMediaType",
    "properties",
    "required",
    "additionalProperties",
    "propertyNames",
    "items",
    "minItems",
    "maxItems",
    "prefixItems",
    "anyOf",
    "oneOf",
    "enum",
    "const",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "not",
    "format",
    "description",
    "default",
}
ANY_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def values(schema: Any) -> st.SearchStrategy[Any]:
    """Values that satisfy ``schema`` (resolved), for the part of JSON Schema the document uses.

    hypothesis-jsonschema would do this, but its last release (0.23.1, 2024) fails on objects
    with the hypothesis of today (it uses internals that have changed); the document's schemas
    need only these few keywords, and an unknown one fails here, so the two cannot drift."""
    unknown = set(schema) - _KNOWN if isinstance(schema, dict) else set()
    assert not unknown, f"values() does not know {sorted(unknown)} of {schema}"
    if schema is True or not set(schema) - {"description", "default"}:
        return ANY_JSON
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([values(part) for part in schema.get("anyOf") or schema["oneOf"]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return st.one_of([_typed(kind, schema) for kind in types])


def _typed(kind: str, schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    low, high = schema.get("minimum"), schema.get("maximum")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(low, high)
    if kind == "number":  # a bound the document writes as an integer, as the nearest float
        inner = [None if bound is None else float(bound) for bound in (low, high)]
        floats = st.floats(*inner, allow_nan=False, allow_infinity=False)
        return floats | st.integers(-(2**53), 2**53).filter(
            lambda n: (low or n) <= n <= (high or n)
        )
    if kind == "string":
        if schema.get("contentMediaType") == "application/json":
            return ANY_JSON.map(json.dumps)
        if schema.get("format") == "date-time":
            return st.datetimes(timezones=st.just(UTC)).map(datetime.isoformat)
        refused = schema.get("not", {}).get("enum", [])
        text = st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 12))
        return text.filter(lambda value: value not in refused)
    if kind == "array":
        if "prefixItems" in schema:
            return st.tuples(*map(values, schema["prefixItems"])).map(list)
        return st.lists(
            values(schema.get("items", {})),
            min_size=schema.get("minItems", 0),
            max_size=schema.get("maxItems", 4),
        )
    assert kind == "object", schema
    properties, required = schema.get("properties", {}), schema.get("required", [])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and not properties:
        keys = st.text(min_size=schema.get("propertyNames", {}).get("minLength", 0), max_size=8)
        return st.dictionaries(keys, values(extra), max_size=4)
    return st.fixed_dictionaries(
        {name: values(properties[name]) for name in required},
        optional={name: values(part) for name, part in properties.items() if name not in required},
    )

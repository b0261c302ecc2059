"""The server's OpenAPI document read as a contract: request schemas to build bodies from, and
the check that an answer is one the document lists, with a body that matches its schema."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import requests

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


def check_answer(document: dict[str, Any], template: str, method: str,
                 response: requests.Response) -> None:  # fmt: skip
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

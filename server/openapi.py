"""The OpenAPI 3.1 document of ``/v1``, written by hand beside the routes it describes.

A test walks every route of the app and checks it appears here, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

_JSON = "application/json"
_ERROR = {"$ref": "#/components/schemas/Error"}
_STEP = {
    "type": "object",
    "description": "Single-agent: observation, reward, info. Multi-agent: observations, rewards, "
    "infos, dones, each keyed by agent id. `reward` is what was earned since the last request.",
    "properties": {
        "observation": {},
        "reward": {"type": "number"},
        "info": {},
        "observations": {"type": "object"},
        "rewards": {"type": "object"},
        "infos": {"type": "object"},
        "dones": {"type": "object"},
        "request": {"type": "integer", "description": "1, 2, ...: a repeat is answered again"},
    },
}


_LIST = {"type": "array"}
_COLUMNS = {
    "type": "object",
    "required": ["episode_ids", "observations"],
    "properties": {
        "episode_ids": {"type": "array", "items": {"type": "string"}},
        "observations": _LIST,
        "rewards": {"type": "array", "items": {"type": "number"}},
        "terminated": {"type": "array", "items": {"type": "boolean"}},
        "truncated": {"type": "array", "items": {"type": "boolean"}},
        "starts": {"type": "array", "items": {"type": ["object", "null"]}},
        "infos": _LIST,
        "requests": {
            "type": "array",
            "items": {"type": ["integer", "null"]},
            "description": "each episode's request number: a whole batch repeated "
            "is answered again",
        },
    },
}


_ACTION = {
    "type": "object",
    "properties": {
        "action": {"description": "null after an end"},
        "action_logp": {"type": ["number", "null"], "description": "null when acting at random"},
        "policy_version": {"type": ["integer", "null"]},
        "actions": {"type": "object", "description": "multi-agent: keyed by agent id"},
    },
}
_ANSWERS = {
    "304": "not modified: version N is still the newest",
    "400": "bad input: the message names the field, what was expected and what came",
    "401": "missing or wrong token",
    "404": "not found: an unknown episode, or no checkpoint published yet",
    "409": "ended episode, or a request number out of turn",
    "413": "body larger than the server's limit",
    "415": "a content type the resource does not take",
    "503": "writing has fallen behind: retry after the Retry-After header's seconds",
}


def _op(summary: str, body: Any = None, ok: str = "200", errors: tuple[str, ...] = (),
        answer: Any = None) -> Any:  # fmt: skip
    """An operation; every one may be refused with 400 and 401, one with a body also with 413
    and 415 (``errors`` adds other answers)."""
    success: dict[str, Any] = {"description": "success"}
    if answer is not None:
        success["content"] = _json(answer)
    responses: dict[str, Any] = {ok: success}
    with_body = ("413", "415") if body is not None else ()
    for status in sorted({"400", "401", *with_body, *errors}):
        responses[status] = {"description": _ANSWERS[status]}
        if int(status) >= 400:
            responses[status]["content"] = _json(_ERROR)
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


def _json(schema: Any) -> dict[str, Any]:
    return {_JSON: {"schema": schema}}


_EPISODE = {"name": "episode_id", "in": "path", "required": True, "schema": {"type": "string"}}


def document() -> dict[str, Any]:
    """The document served at ``GET /v1/openapi.json``."""
    with_id = {"parameters": [_EPISODE]}
    step = _json(_STEP)
    return {
        "openapi": "3.1.0",
        "info": {"title": "rlpipe policy server", "version": "1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "status": {"type": "integer"},
                                "message": {"type": "string"},
                            },
                        }
                    },
                }
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/episodes": {
                "post": _op(
                    "Start an episode (idempotent for a client-named episode_id).",
                    _json(
                        {
                            "type": "object",
                            "properties": {
                                "episode_id": {"type": "string"},
                                "training_enabled": {"type": "boolean"},
                                "seed": {"type": "integer"},
                                "options": {},
                                "client_id": {"type": "string"},
                            },
                        }
                    ),
                    "201",
                    ("409",),
                    {"type": "object", "properties": {"episode_id": {"type": "string"}}},
                )
            },
            "/v1/episodes/{episode_id}/actions": {
                **with_id,
                "post": _op(
                    "Remote inference: the action for an observation.",
                    step,
                    errors=("404", "409", "503"),
                    answer=_ACTION,
                ),
            },
            "/v1/episodes/{episode_id}/logged-actions": {
                **with_id,
                "post": _op(
                    "Record an action the client chose (adds 'action').",
                    step,
                    errors=("404", "409", "503"),
                ),
            },
            "/v1/episodes/{episode_id}/returns": {
                **with_id,
                "post": _op("Add rewards to the pending step.", step, errors=("404", "409")),
            },
            "/v1/episodes/{episode_id}/end": {
                **with_id,
                "post": _op(
                    "End the episode with its last observation "
                    "('truncated': true for a time limit).",
                    step,
                    errors=("404", "409", "503"),
                ),
            },
            "/v1/actions": {
                "post": _op(
                    "Batch form, columnar: {'episode_ids', 'observations', 'rewards', "
                    "'terminated', 'truncated', 'starts', 'infos', 'requests'}, one list entry "
                    "per env, answered {'episode_ids', 'actions', 'action_logp', "
                    "'policy_version'}; or per env: {'episodes': [{episode_id, observation, "
                    "reward, terminated, truncated, start, info, request}]}, answered "
                    "{'episodes': [...]}. A batch sent again whole is answered again. An entry "
                    "with a start opens its episode; one with terminated or truncated ends it.",
                    _json({"oneOf": [_COLUMNS, {"type": "object", "required": ["episodes"]}]}),
                    errors=("404", "409", "503"),
                )
            },
            "/v1/uploads": {
                "post": _op(
                    "Local inference: store a batch of steps (Arrow IPC stream, table named by "
                    "X-Rlpipe-Table) or {'steps': [...], 'episodes': [...]} as JSON, once per "
                    "(X-Rlpipe-Client, X-Rlpipe-Upload).",
                    {
                        "application/vnd.apache.arrow.stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                        _JSON: {"schema": {"type": "object"}},
                    },
                    errors=("413", "415", "503"),
                )
            },
            "/v1/weights": {
                "get": _op(
                    "The newest checkpoint as .npz bytes (X-Rlpipe-Policy-Version); ?version=N "
                    "answers 304 when N is current.",
                    errors=("304", "404"),
                )
            },
            "/v1/spaces": {"get": _op("Observation and action spaces as JSON.")},
            "/v1/health": {"get": {**_op("Liveness; says when acting at random."), "security": []}},
            "/v1/metrics": {"get": _op("Prometheus text format.")},
            "/v1/openapi.json": {"get": {**_op("This document."), "security": []}},
        },
    }

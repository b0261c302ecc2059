"""The OpenAPI 3.1 document of ``/v1``: the contract a client can be generated from.

Written by hand beside the routes it describes, with the observation and action schemas made from
the server's own spaces. A test walks every route of the app and checks it appears here, and a
fuzz test (``tests/test_openapi_fuzz.py``) sends bodies made from these schemas, and mutations of
them, and checks that every answer is a status listed here with a body that matches its schema.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from server.bodies import MAX_DEPTH

_JSON = "application/json"
_ARROW = "application/vnd.apache.arrow.stream"
_NPZ = "application/x-npz"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _keyed(schema: Any) -> dict[str, Any]:
    """An object keyed by agent id (multi-agent requests and answers)."""
    return {"type": "object", "propertyNames": {"minLength": 1}, "additionalProperties": schema}


_FINITE = {"type": "number", "minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308}
_INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
_ID = {"type": "string", "minLength": 1, "maxLength": 200, "not": {"enum": [".", ".."]}}
_REQUEST = {**_INT64, "description": "the client's count of its requests in this episode, 1, "
            "2, ...: the last number sent again is answered again and writes nothing"}  # fmt: skip
_INFO = {
    "type": ["object", "null"],
    "description": "stored as JSON text; the server also takes any JSON value, but a string "
    "must hold JSON text",
}


@functools.singledispatch
def space_schema(space: gym.Space[Any]) -> dict[str, Any]:
    """The JSON Schema of one value of ``space``, as the server takes it (section 6 of
    ``docs/format.md`` says how each space is laid out in JSON)."""
    raise TypeError(f"no JSON Schema for {type(space).__name__}")


def _nested(shape: tuple[int, ...], leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for size in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


@space_schema.register(Box)
def _box(space: Box) -> dict[str, Any]:
    dtype: Any = np.dtype(space.dtype)
    if dtype.kind == "f":
        top = float(np.finfo(dtype).max)
        leaf: dict[str, Any] = {"type": "number", "minimum": -top, "maximum": top}
    elif dtype.kind == "b":
        leaf = {"type": "integer", "minimum": 0, "maximum": 1}
    else:
        info = np.iinfo(dtype)
        leaf = {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    return _nested(space.shape, leaf)


@space_schema.register(Discrete)
def _discrete(space: Discrete) -> dict[str, Any]:
    start = int(space.start)
    return {"type": "integer", "minimum": start, "maximum": start + int(space.n) - 1}


@space_schema.register(MultiDiscrete)
def _multi_discrete(space: MultiDiscrete) -> dict[str, Any]:
    low, high = space.start, space.start + space.nvec - 1
    leaf = {"type": "integer", "minimum": int(low.min()), "maximum": int(high.max()),
            "description": "each entry in [start, start + nvec) of its own index"}  # fmt: skip
    return _nested(space.shape, leaf)


@space_schema.register(MultiBinary)
def _multi_binary(space: MultiBinary) -> dict[str, Any]:
    return _nested(space.shape, {"type": "integer", "minimum": 0, "maximum": 1})


@space_schema.register(Dict)
def _dict(space: Dict) -> dict[str, Any]:
    properties = {name: space_schema(part) for name, part in space.spaces.items()}
    return {**_object(sorted(properties), **properties), "additionalProperties": False}


@space_schema.register(Tuple)
def _tuple(space: Tuple) -> dict[str, Any]:
    parts = [space_schema(part) for part in space.spaces]
    return {"type": "array", "prefixItems": parts, "items": False, "minItems": len(parts)}


def _schemas(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> dict[str, Any]:
    """The named schemas of requests and answers."""
    single = {"observation": _ref("Observation"), "reward": _FINITE, "info": _INFO,
              "request": _REQUEST}  # fmt: skip
    multi = {"observations": _keyed(_ref("Observation")), "rewards": _keyed(_FINITE),
             "infos": _keyed(_INFO), "dones": _keyed({"type": "boolean"}),
             "request": _REQUEST}  # fmt: skip
    truncated = {"type": "boolean", "description": "true for a time limit; else terminated"}
    logp = {"type": ["number", "null"], "description": "null when acting at random"}
    version = {"type": ["integer", "null"], "description": "the checkpoint that acted"}
    return {
        "Error": _object(["error"], error=_object(
            ["status", "message"], status={"type": "integer"}, message={"type": "string"})),
        "Observation": space_schema(observation_space),
        "Action": space_schema(action_space),
        "Start": {**_object(
            [], episode_id=_ID, training_enabled={"type": "boolean"}, seed=_INT64, options=_INFO,
            client_id={"type": ["string", "null"], "maxLength": 200},
        ), "description": "Every field may be left out; the server names an episode left "
                          "unnamed, and a client_id left out is the caller's address."},
        "Started": _object(["episode_id"], episode_id={"type": "string"}),
        "Step": {"anyOf": [_object(["observation"], **single),
                           _object(["observations"], **multi)]},
        "LoggedStep": {"anyOf": [
            _object(["observation", "action"], action=_ref("Action"), **single),
            _object(["observations", "actions"], actions=_keyed(_ref("Action")), **multi),
        ]},
        "EndStep": {"anyOf": [_object(["observation"], truncated=truncated, **single),
                              _object(["observations"], truncated=truncated, **multi)]},
        "Returns": {"anyOf": [
            _object([], reward=_FINITE, info=_INFO),
            _object(["rewards"], rewards=_keyed(_FINITE), infos=_keyed(_INFO),
                    dones=_keyed({"type": "boolean"})),
        ]},
        "Acted": {"anyOf": [
            _object(["episode_id", "action", "action_logp", "policy_version"],
                    episode_id={"type": "string"}, action={"description": "null after an end"},
                    action_logp=logp, policy_version=version),
            _object(["episode_id", "actions", "action_logp", "policy_version"],
                    episode_id={"type": "string"}, actions=_keyed({}),
                    action_logp=_keyed(logp), policy_version=version),
        ]},
        "Ended": _object(["episode_id", "ended"], episode_id={"type": "string"},
                         ended={"const": True}),
        "ReturnsTaken": _object(["episode_id"], episode_id={"type": "string"}),
        **_batch_schemas(truncated, logp, version),
        **_upload_schemas(),
    }  # fmt: skip


def _batch_schemas(truncated: Any, logp: Any, version: Any) -> dict[str, Any]:
    def column(items: Any) -> dict[str, Any]:
        return {"type": "array", "items": items}

    entry = {"episode_id": _ID, "observation": _ref("Observation"), "reward": _FINITE,
             "terminated": {"type": "boolean"}, "truncated": truncated, "info": _INFO,
             "request": _REQUEST,
             "start": {"anyOf": [_ref("Start"), {"type": "boolean"}],
                       "description": "opens the episode first (true: with defaults)"}}  # fmt: skip
    multi = {k: v for k, v in entry.items() if k not in ("observation", "reward", "info")}
    multi.update(observations=_keyed(_ref("Observation")), rewards=_keyed(_FINITE),
                 infos=_keyed(_INFO))  # fmt: skip
    return {
        "BatchColumns": {**_object(
            ["episode_ids", "observations"], episode_ids={**column(_ID), "minItems": 1},
            observations=column(_ref("Observation")), rewards=column(_FINITE),
            terminated=column({"type": "boolean"}), truncated=column({"type": "boolean"}),
            starts=column({"anyOf": [_ref("Start"), {"type": "null"}]}),
            infos=column(_INFO), requests=column({"anyOf": [_REQUEST, {"type": "null"}]}),
        ), "description": "one entry per episode in every list, all of the same length"},
        "BatchEpisodes": _object(["episodes"], episodes={**column({"anyOf": [
            _object(["episode_id", "observation"], **entry),
            _object(["episode_id", "observations"], **multi),
        ]}), "minItems": 1}),
        "BatchColumnsActed": _object(
            ["episode_ids", "actions", "action_logp", "policy_version"],
            episode_ids=column({"type": "string"}), actions=column({}),
            action_logp=column(logp), policy_version=version,
        ),
        "BatchEpisodesActed": _object(["episodes"], episodes=column(
            {"anyOf": [_ref("Acted"), _ref("Ended")]})),
    }  # fmt: skip


def _upload_schemas() -> dict[str, Any]:
    row = {"episode_id": _ID, "agent_id": {"type": "string", "minLength": 1},
           "t": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
           "training_enabled": {"type": "boolean"}}  # fmt: skip
    step = _object(
        ["episode_id", "t", "observation", "action", "reward", "next_observation", "terminated",
         "truncated"], **row, observation=_ref("Observation"), action=_ref("Action"),
        reward=_FINITE, next_observation=_ref("Observation"), terminated={"type": "boolean"},
        truncated={"type": "boolean"}, action_logp={"type": ["number", "null"]},
        policy_version={**_INT64, "type": ["integer", "null"]}, info=_INFO,
    )  # fmt: skip
    when = {"type": "string", "format": "date-time", "description": "ISO 8601, with its zone"}
    row.pop("t")
    episode = _object(
        ["episode_id", "started_at", "ended_at", "length", "return", "end_reason"], **row,
        started_at=when, ended_at=when, length={"type": "integer", "minimum": 0},
        env_id={"type": ["string", "null"]}, seed={**_INT64, "type": ["integer", "null"]},
        reset_options={"type": ["string", "null"], "description": "JSON text"},
        end_reason={"enum": ["terminated", "truncated", "closed"]},
        **{"return": _FINITE},
    )  # fmt: skip
    return {
        "UploadRows": {**_object([], steps={"type": "array", "items": step},
                                 episodes={"type": "array", "items": episode}),
                       "additionalProperties": False},
        "Uploaded": _object(
            ["stored", "duplicate"], stored=_keyed({"type": "integer", "minimum": 0}),
            duplicate={"type": "boolean", "description": "true: this upload number was "
                       "stored before, and nothing was written again"},
        ),
    }  # fmt: skip


_ANSWERS = {
    "200": "the episode was open already (a retried start of the same client)",
    "304": "not modified: version N is still the newest",
    "400": "bad input: the message names the field, what was expected and what came",
    "401": "missing or wrong token",
    "404": "not found: an unknown episode, or no checkpoint published yet",
    "409": "ended episode, an episode open for another client, or a request number out of turn",
    "413": "body larger than the server's limit",
    "415": "a content type the resource does not take",
    "503": "writing has fallen behind: retry after the Retry-After header's seconds",
}
_VERSION_HEADER = {
    "X-Rlpipe-Policy-Version": {
        "schema": {"type": "integer"},
        "description": "the checkpoint's version",
    }
}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}}


def _json(schema: Any) -> dict[str, Any]:
    return {_JSON: {"schema": schema}}


def _op(summary: str, body: Any = None, answer: Any = None, ok: str = "200",
        errors: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """An operation; every one may be refused with 400 and 401, one with a body also with 413
    and 415 (``errors`` adds other answers)."""
    success: dict[str, Any] = {"description": "success"}
    if answer is not None:
        success["content"] = answer
    responses: dict[str, Any] = {ok: success}
    with_body = ("413", "415") if body is not None else ()
    for status in sorted({"400", "401", *with_body, *errors}):
        responses[status] = {"description": _ANSWERS[status]}
        if int(status) >= 400:
            responses[status]["content"] = _json(_ref("Error"))
        if status == "503":
            responses[status]["headers"] = _RETRY_AFTER
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": body}
    return op


def _paths() -> dict[str, Any]:
    with_id = {"parameters": [{"name": "episode_id", "in": "path", "required": True,
                               "schema": _ID}]}  # fmt: skip
    step_errors = ("404", "409", "503")
    start = _op("Start an episode (idempotent for a client-named episode_id).",
                _json(_ref("Start")), _json(_ref("Started")), "201", ("200", "409"))  # fmt: skip
    start["responses"]["200"]["content"] = _json(_ref("Started"))
    return {
        "/v1/episodes": {"post": start},
        "/v1/episodes/{episode_id}/actions": {**with_id, "post": _op(
            "Remote inference: the action for an observation (the reward was earned by the "
            "previous action).", _json(_ref("Step")), _json(_ref("Acted")), errors=step_errors)},
        "/v1/episodes/{episode_id}/logged-actions": {**with_id, "post": _op(
            "Record an action the client chose ('action', or 'actions' keyed by agent id).",
            _json(_ref("LoggedStep")), _json(_ref("Acted")), errors=step_errors)},
        "/v1/episodes/{episode_id}/returns": {**with_id, "post": _op(
            "Add rewards to the pending step.", _json(_ref("Returns")),
            _json(_ref("ReturnsTaken")), errors=("404", "409"))},
        "/v1/episodes/{episode_id}/end": {**with_id, "post": _op(
            "End the episode with its last observation ('truncated': true for a time limit).",
            _json(_ref("EndStep")), _json(_ref("Ended")), errors=step_errors)},
        "/v1/actions": {"post": _op(
            "Batch form: many episodes' steps in one request, columnar or one entry per "
            "episode. An entry with a start opens its episode; one with terminated or "
            "truncated ends it. A batch sent again whole is answered again.",
            _json({"oneOf": [_ref("BatchColumns"), _ref("BatchEpisodes")]}),
            _json({"oneOf": [_ref("BatchColumnsActed"), _ref("BatchEpisodesActed")]}),
            errors=step_errors)},
        "/v1/uploads": {"post": {**_op(
            "Local inference: store a batch of finished rows (one Arrow IPC stream of the "
            "table X-Rlpipe-Table, or JSON rows of both tables), once per (X-Rlpipe-Client, "
            "X-Rlpipe-Upload).",
            {_ARROW: {"schema": {"type": "string", "format": "binary"}},
             **_json(_ref("UploadRows"))},
            _json(_ref("Uploaded")), errors=("503",)), "parameters": _upload_headers()}},
        "/v1/weights": {"get": _weights()},
        "/v1/spaces": {"get": _op("Observation and action spaces as JSON.", answer=_json(
            _object(["observation_space", "action_space", "env_id"],
                    observation_space={"type": "object"}, action_space={"type": "object"},
                    env_id={"type": ["string", "null"]})))},
        "/v1/health": {"get": {**_op("Liveness; says when acting at random.",
                                     answer=_json(_health())), "security": []}},
        "/v1/metrics": {"get": _op("Prometheus text format.",
                                   answer={"text/plain": {"schema": {"type": "string"}}})},
        "/v1/openapi.json": {"get": {**_op("This document.", answer=_json({"type": "object"})),
                                     "security": []}},
    }  # fmt: skip


def _upload_headers() -> list[dict[str, Any]]:
    return [
        {"name": "X-Rlpipe-Client", "in": "header", "required": True,
         "schema": {"type": "string", "minLength": 1},
         "description": "the client's stable id, stored as every row's client_id"},
        {"name": "X-Rlpipe-Upload", "in": "header", "required": True,
         "schema": {"type": "integer", "minimum": 0},
         "description": "the upload's number: one already stored is not stored again"},
        {"name": "X-Rlpipe-Table", "in": "header", "required": False,
         "schema": {"enum": ["steps", "episodes"], "default": "steps"},
         "description": "which table an Arrow body holds (JSON bodies name their tables)"},
    ]  # fmt: skip


def _weights() -> dict[str, Any]:
    op = _op("The newest checkpoint as .npz bytes (numpy arrays, read with "
             "allow_pickle=False).", answer={_NPZ: {"schema": {"type": "string",
             "format": "binary"}}}, errors=("304", "404"))  # fmt: skip
    op["parameters"] = [{"name": "version", "in": "query", "required": False,
                         "schema": _INT64, "description": "the version the client holds: "
                         "answered 304 while it is the newest"}]  # fmt: skip
    op["responses"]["200"]["headers"] = _VERSION_HEADER
    op["responses"]["304"]["headers"] = _VERSION_HEADER
    return op


def _health() -> dict[str, Any]:
    return _object(
        ["status", "policy_version", "acting_at_random", "refused_checkpoint", "open_episodes",
         "queue_depth"], status={"const": "ok"}, policy_version={"type": ["integer", "null"]},
        acting_at_random={"type": "boolean"}, refused_checkpoint={"type": ["string", "null"]},
        open_episodes={"type": "integer"}, queue_depth={"type": "integer"},
    )  # fmt: skip


def document(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> dict[str, Any]:
    """The document served at ``GET /v1/openapi.json`` by a server of these spaces."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "rlpipe policy server",
            "version": "1",
            "description": "docs/protocol.md tells the rules. Every error is JSON (the Error "
            f"schema). Bodies may nest arrays and objects at most {MAX_DEPTH} deep, and every "
            "string must be valid UTF-8 (no lone surrogates). A method a path does not take "
            "is answered 405, with an Allow header listing those it does.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(observation_space, action_space),
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
    }

"""JSON Schemas of the server's requests and answers, and of the values of each space.

:func:`named_schemas` gives the ``components.schemas`` of the OpenAPI document
(:mod:`server.openapi`): the observation and action schemas are made from the server's own
spaces, one small function per space type, so that a generated client sends values the server
takes.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from pipeline.format.schema import REQUIRED_STEP_COLUMNS


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def object_schema(required: list[str] | None = None, **properties: Any) -> dict[str, Any]:
    """An object of ``properties``, of which ``required`` (by default all) must be given."""
    required = list(properties) if required is None else required
    return {"type": "object", "required": required, "properties": properties}


def _closed(required: list[str], **properties: Any) -> dict[str, Any]:
    """:func:`object_schema` with no other properties: an upload's rows name only columns."""
    return {**object_schema(required, **properties), "additionalProperties": False}


def _keyed(schema: Any) -> dict[str, Any]:
    """An object keyed by agent id (multi-agent requests and answers)."""
    return {"type": "object", "propertyNames": {"minLength": 1}, "additionalProperties": schema}


_JSON_TEXT = "application/json"
_BOOL = {"type": "boolean"}
_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
# every JSON number up to this is read as a finite double: it rounds to the largest one,
# 1.7976931348623157e308 (from 2**1024 - 2**970 on, a number reads as infinity)
_DOUBLE_TOP = 2**1024 - 2**970 - 1
_FINITE = {"type": "number", "minimum": -_DOUBLE_TOP, "maximum": _DOUBLE_TOP}
INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
# gymnasium's seeds, as Minari draws them (null: none)
_SEED = {"type": ["integer", "null"], "minimum": 0, "maximum": 2**64 - 1}
ID = {"type": "string", "minLength": 1, "maxLength": 200, "not": {"enum": [".", ".."]}}
_REQUEST = {
    **INT64,
    "type": ["integer", "null"],
    "description": "the client's count of its requests in this episode, 1, "
    "2, ...: the last number sent again is answered again and writes nothing (null: "
    "unnumbered, never answered again)",
}
_INFO = {  # a string's JSON text is an annotation: the schema cannot check it, the server does
    "anyOf": [  # a type each, not a list of types: client generators take only this form
        *({"type": kind} for kind in ("object", "number", "boolean", "null")),
        {"type": "array", "items": {}},
        {"type": "string", "contentMediaType": _JSON_TEXT},
    ],
    "description": "any JSON value, stored as JSON text (an object, as gymnasium's info, or "
    "null for none); a string must hold JSON text, and is stored as it is",
}
_TRUNCATED = {"type": "boolean", "description": "true for a time limit; else terminated"}
_LOGP = {"type": ["number", "null"], "description": "null when acting at random"}
_VERSION = {"type": ["integer", "null"], "description": "the checkpoint that acted"}


@functools.singledispatch
def space_schema(space: gym.Space[Any]) -> dict[str, Any]:
    """The JSON Schema of one value of ``space``, as the server takes it (section 6 of
    ``docs/format.md`` says how each space is laid out in JSON)."""
    raise TypeError(f"no JSON Schema for {type(space).__name__}")


def _number(kind: str, low: float | int, high: float | int) -> dict[str, Any]:
    """A space's number: ``true`` and ``false`` count as 1 and 0, as numpy and gymnasium take
    them (``Discrete(2).contains(True)``), and an integer may be written 1.0."""
    return {"type": [kind, "boolean"], "minimum": low, "maximum": high}


def _float_top(dtype: np.dtype[Any]) -> float | int:
    """The largest number the server takes for a float dtype: every double that rounds to a
    finite value of it, so float32's max and up to half its last step beyond."""
    top = np.finfo(dtype).max
    if dtype.itemsize >= 8:
        return _DOUBLE_TOP
    step = float(np.spacing(np.nextafter(top, dtype.type(0))))
    return float(np.nextafter(float(top) + step / 2, 0.0))


def _nested(shape: tuple[int, ...], leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for size in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


@space_schema.register(Box)
def _box(space: Box) -> dict[str, Any]:
    dtype: Any = np.dtype(space.dtype)
    if dtype.kind == "f":
        top = _float_top(dtype)
        leaf = _number("number", -top, top)
    elif dtype.kind == "b":
        leaf = _number("integer", 0, 1)
    else:
        info = np.iinfo(dtype)
        leaf = _number("integer", int(info.min), int(info.max))
    return _nested(space.shape, leaf)


@space_schema.register(Discrete)
def _discrete(space: Discrete) -> dict[str, Any]:
    start = int(space.start)
    return _number("integer", start, start + int(space.n) - 1)


@space_schema.register(MultiDiscrete)
def _multi_discrete(space: MultiDiscrete) -> dict[str, Any]:
    return _per_index(space.start, space.start + space.nvec - 1)


def _per_index(low: np.ndarray, high: np.ndarray) -> dict[str, Any]:
    """Integers bounded index by index."""
    if low.ndim == 0:
        return _number("integer", int(low), int(high))
    return _prefixed([_per_index(lo, hi) for lo, hi in zip(low, high, strict=True)])


@space_schema.register(MultiBinary)
def _multi_binary(space: MultiBinary) -> dict[str, Any]:
    return _nested(space.shape, _number("integer", 0, 1))


@space_schema.register(Dict)
def _dict(space: Dict) -> dict[str, Any]:
    properties = {name: space_schema(part) for name, part in space.spaces.items()}
    return {**object_schema(sorted(properties), **properties), "additionalProperties": False}


@space_schema.register(Tuple)
def _tuple(space: Tuple) -> dict[str, Any]:
    return _prefixed([space_schema(part) for part in space.spaces])


def _prefixed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    # maxItems, not "items": false, closes the tuple: generators of clients (openapi-python-client)
    # cannot read a boolean schema
    n = len(parts)
    return {"type": "array", "prefixItems": parts, "minItems": n, "maxItems": n}


def _forms(
    name: str,
    required: list[str],
    fields: dict[str, Any],
    shared: dict[str, Any] | None = None,
    multi_required: list[str] | None = None,
) -> dict[str, Any]:
    """A body's single-agent form and its multi-agent twin, in which each of ``fields`` is keyed
    by agent id under its plural name, beside ``dones``; ``shared`` fields are in both. Named
    as :func:`_named` names them."""
    shared = shared or {}
    plural = {f"{field}s": _keyed(schema) for field, schema in fields.items()}
    if multi_required is None:
        multi_required = [f"{field}s" if field in fields else field for field in required]
    single = object_schema(required, **fields, **shared)
    multi = object_schema(multi_required, **plural, dones=_keyed(_BOOL), **shared)
    return _named(name, single, multi)


def _named(name: str, single: dict[str, Any], multi: dict[str, Any]) -> dict[str, Any]:
    """Schema ``name``, either of its single-agent and multi-agent forms, each a schema of its
    own (``StepSingleAgent``, ``StepMultiAgent``): a client generator (openapi-python-client)
    cannot build a union of unnamed objects whose fields are unions."""
    forms = {f"{name}SingleAgent": single, f"{name}MultiAgent": multi}
    return {name: {"anyOf": [ref(form) for form in forms]}, **forms}


def named_schemas(
    observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> dict[str, Any]:
    """The named schemas of requests and answers, for a server of these spaces."""
    step = {"observation": ref("Observation"), "reward": _FINITE, "info": _INFO}
    numbered = {"request": _REQUEST}
    return {
        "Error": object_schema(
            error=object_schema(status=_INTEGER, message=_STRING),
        ),
        "Observation": space_schema(observation_space),
        "Action": space_schema(action_space),
        "Start": {
            **object_schema([], episode_id={**ID, "type": ["string", "null"]}, **_START),
            "description": "Every field may be left out (or null); the server names an episode "
            "left unnamed, and a client_id left out is the caller's address.",
        },
        "BatchStart": {
            **object_schema([], **_START),
            "description": "A batch's start of the episode of its entry (an episode_id here "
            "is not read); every field may be left out, as in Start.",
        },
        "Started": object_schema(episode_id=_STRING),
        **_forms("Step", ["observation"], step, numbered),
        **_forms(
            "LoggedStep", ["observation", "action"], {**step, "action": ref("Action")}, numbered
        ),
        **_forms("EndStep", ["observation"], step, {**numbered, "truncated": _TRUNCATED}),
        **_forms("Returns", [], {"reward": _FINITE, "info": _INFO}, multi_required=["rewards"]),
        **_named(
            "Acted",
            object_schema(
                episode_id=_STRING,
                action={**_ACTION_OR_NULL, "description": "null after an end"},
                action_logp=_LOGP,
                policy_version=_VERSION,
            ),
            object_schema(
                episode_id=_STRING,
                actions=_keyed(ref("Action")),
                action_logp=_keyed(_LOGP),
                policy_version=_VERSION,
            ),
        ),
        "Ended": object_schema(episode_id=_STRING, ended={"const": True}),
        "ReturnsTaken": object_schema(episode_id=_STRING),
        **_batch_schemas(step),
        **_upload_schemas(),
    }


_ACTION_OR_NULL = {"anyOf": [ref("Action"), {"type": "null"}]}
_START = {
    "training_enabled": _BOOL,
    "seed": _SEED,
    "options": _INFO,
    "client_id": {"type": ["string", "null"], "maxLength": 200},
}


def _column(items: Any, **more: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **more}


def _batch_schemas(step: dict[str, Any]) -> dict[str, Any]:
    start = {
        "anyOf": [ref("BatchStart"), _BOOL],
        "description": "opens the episode first (true: with defaults)",
    }
    entry = {"episode_id": ID, "terminated": _BOOL, "truncated": _TRUNCATED, "request": _REQUEST}
    return {
        "BatchColumns": {
            **object_schema(
                ["episode_ids", "observations"],
                episode_ids=_column(ID, minItems=1),
                observations=_column(ref("Observation")),
                rewards=_column(_FINITE),
                terminated=_column(_BOOL),
                truncated=_column(_BOOL),
                starts=_column({"anyOf": [ref("BatchStart"), {"type": "null"}]}),
                infos=_column(_INFO),
                requests=_column({"anyOf": [_REQUEST, {"type": "null"}]}),
            ),
            "description": "one entry per episode in every list, all of the same length",
        },
        **_forms("BatchEntry", ["episode_id", "observation"], step, {**entry, "start": start}),
        "BatchEpisodes": object_schema(
            ["episodes"], episodes=_column(ref("BatchEntry"), minItems=1)
        ),
        "BatchColumnsActed": object_schema(
            episode_ids=_column(_STRING),
            actions=_column({**_ACTION_OR_NULL, "description": "null for an episode it ended"}),
            action_logp=_column(_LOGP),
            policy_version=_VERSION,
        ),
        "BatchEpisodesActed": object_schema(
            ["episodes"], episodes=_column({"anyOf": [ref("Acted"), ref("Ended")]})
        ),
    }


def _upload_schemas() -> dict[str, Any]:
    agent_id = {"type": "string", "minLength": 1}
    row = {"episode_id": ID, "agent_id": agent_id, "training_enabled": _BOOL}
    step = _closed(
        list(REQUIRED_STEP_COLUMNS),
        **row,
        t={"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        observation=ref("Observation"),
        action=ref("Action"),
        reward=_FINITE,
        next_observation=ref("Observation"),
        terminated=_BOOL,
        truncated=_BOOL,
        action_logp={"type": ["number", "null"]},
        policy_version={**INT64, "type": ["integer", "null"]},
        info=_INFO,
    )
    when = {"type": "string", "format": "date-time", "description": "ISO 8601, with its zone"}
    episode = _closed(
        ["episode_id", "started_at", "ended_at", "length", "return", "end_reason"],
        **row,
        started_at=when,
        ended_at=when,
        length={"type": "integer", "minimum": 0},
        env_id={"type": ["string", "null"]},
        seed=_SEED,
        reset_options=_INFO,
        end_reason={"enum": ["terminated", "truncated", "closed"]},
        **{"return": _FINITE},
    )
    return {
        "UploadRows": {
            **object_schema([], steps=_column(step), episodes=_column(episode)),
            "additionalProperties": False,
        },
        "Uploaded": object_schema(
            stored=_keyed({"type": "integer", "minimum": 0}),
            duplicate={
                "type": "boolean",
                "description": "true: this upload number was "
                "stored before, and nothing was written again",
            },
        ),
    }

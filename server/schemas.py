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


def _keyed(schema: Any) -> dict[str, Any]:
    """An object keyed by agent id (multi-agent requests and answers)."""
    return {"type": "object", "propertyNames": {"minLength": 1}, "additionalProperties": schema}


_BOOL = {"type": "boolean"}
_STRING = {"type": "string"}
_INTEGER = {"type": "integer"}
_FINITE = {"type": "number", "minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308}
INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
SEED = {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}  # gymnasium's, as Minari draws
ID = {"type": "string", "minLength": 1, "maxLength": 200, "not": {"enum": [".", ".."]}}
_REQUEST = {
    **INT64,
    "description": "the client's count of its requests in this episode, 1, "
    "2, ...: the last number sent again is answered again and writes nothing",
}
_INFO = {
    "type": ["object", "null"],
    "description": "stored as JSON text; the server also takes any JSON value, but a string "
    "must hold JSON text",
}
_TRUNCATED = {"type": "boolean", "description": "true for a time limit; else terminated"}
_LOGP = {"type": ["number", "null"], "description": "null when acting at random"}
_VERSION = {"type": ["integer", "null"], "description": "the checkpoint that acted"}


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
    return _per_index(space.start, space.start + space.nvec - 1)


def _per_index(low: np.ndarray, high: np.ndarray) -> dict[str, Any]:
    """Integers bounded index by index."""
    if low.ndim == 0:
        return {"type": "integer", "minimum": int(low), "maximum": int(high)}
    return _prefixed([_per_index(lo, hi) for lo, hi in zip(low, high, strict=True)])


@space_schema.register(MultiBinary)
def _multi_binary(space: MultiBinary) -> dict[str, Any]:
    return _nested(space.shape, {"type": "integer", "minimum": 0, "maximum": 1})


@space_schema.register(Dict)
def _dict(space: Dict) -> dict[str, Any]:
    properties = {name: space_schema(part) for name, part in space.spaces.items()}
    return {**object_schema(sorted(properties), **properties), "additionalProperties": False}


@space_schema.register(Tuple)
def _tuple(space: Tuple) -> dict[str, Any]:
    return _prefixed([space_schema(part) for part in space.spaces])


def _prefixed(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "array", "prefixItems": parts, "items": False, "minItems": len(parts)}


def _forms(
    required: list[str],
    fields: dict[str, Any],
    shared: dict[str, Any] | None = None,
    multi_required: list[str] | None = None,
) -> dict[str, Any]:
    """A body's single-agent form and its multi-agent twin, in which each of ``fields`` is keyed
    by agent id under its plural name, beside ``dones``; ``shared`` fields are in both."""
    shared = shared or {}
    plural = {f"{name}s": _keyed(schema) for name, schema in fields.items()}
    if multi_required is None:
        multi_required = [f"{name}s" if name in fields else name for name in required]
    single = object_schema(required, **fields, **shared)
    multi = object_schema(multi_required, **plural, dones=_keyed(_BOOL), **shared)
    return {"anyOf": [single, multi]}


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
            **object_schema(
                [],
                episode_id=ID,
                training_enabled=_BOOL,
                seed=SEED,
                options=_INFO,
                client_id={"type": ["string", "null"], "maxLength": 200},
            ),
            "description": "Every field may be left out; the server names an episode left "
            "unnamed, and a client_id left out is the caller's address.",
        },
        "Started": object_schema(episode_id=_STRING),
        "Step": _forms(["observation"], step, numbered),
        "LoggedStep": _forms(
            ["observation", "action"], {**step, "action": ref("Action")}, numbered
        ),
        "EndStep": _forms(["observation"], step, {**numbered, "truncated": _TRUNCATED}),
        "Returns": _forms([], {"reward": _FINITE, "info": _INFO}, multi_required=["rewards"]),
        "Acted": {
            "anyOf": [
                object_schema(
                    episode_id=_STRING,
                    action={"description": "null after an end"},
                    action_logp=_LOGP,
                    policy_version=_VERSION,
                ),
                object_schema(
                    episode_id=_STRING,
                    actions=_keyed({}),
                    action_logp=_keyed(_LOGP),
                    policy_version=_VERSION,
                ),
            ]
        },
        "Ended": object_schema(episode_id=_STRING, ended={"const": True}),
        "ReturnsTaken": object_schema(episode_id=_STRING),
        **_batch_schemas(step),
        **_upload_schemas(),
    }


def _column(items: Any, **more: Any) -> dict[str, Any]:
    return {"type": "array", "items": items, **more}


def _batch_schemas(step: dict[str, Any]) -> dict[str, Any]:
    start = {
        "anyOf": [ref("Start"), _BOOL],
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
                starts=_column({"anyOf": [ref("Start"), {"type": "null"}]}),
                infos=_column(_INFO),
                requests=_column({"anyOf": [_REQUEST, {"type": "null"}]}),
            ),
            "description": "one entry per episode in every list, all of the same length",
        },
        "BatchEpisodes": object_schema(
            ["episodes"],
            episodes=_column(
                _forms(["episode_id", "observation"], step, {**entry, "start": start}), minItems=1
            ),
        ),
        "BatchColumnsActed": object_schema(
            episode_ids=_column(_STRING),
            actions=_column({}),
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
    step = object_schema(
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
    episode = object_schema(
        ["episode_id", "started_at", "ended_at", "length", "return", "end_reason"],
        **row,
        started_at=when,
        ended_at=when,
        length={"type": "integer", "minimum": 0},
        env_id={"type": ["string", "null"]},
        seed={**SEED, "type": ["integer", "null"]},
        reset_options={"type": ["string", "null"], "description": "JSON text"},
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

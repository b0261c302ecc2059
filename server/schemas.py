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


def object_schema(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _keyed(schema: Any) -> dict[str, Any]:
    """An object keyed by agent id (multi-agent requests and answers)."""
    return {"type": "object", "propertyNames": {"minLength": 1}, "additionalProperties": schema}


_FINITE = {"type": "number", "minimum": -1.7976931348623157e308, "maximum": 1.7976931348623157e308}
INT64 = {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
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
    """Integers bounded index by index: arrays of exactly their items (``prefixItems``)."""
    if low.ndim == 0:
        return {"type": "integer", "minimum": int(low), "maximum": int(high)}
    parts = [_per_index(lo, hi) for lo, hi in zip(low, high, strict=True)]
    return {"type": "array", "prefixItems": parts, "items": False, "minItems": len(parts)}


@space_schema.register(MultiBinary)
def _multi_binary(space: MultiBinary) -> dict[str, Any]:
    return _nested(space.shape, {"type": "integer", "minimum": 0, "maximum": 1})


@space_schema.register(Dict)
def _dict(space: Dict) -> dict[str, Any]:
    properties = {name: space_schema(part) for name, part in space.spaces.items()}
    return {**object_schema(sorted(properties), **properties), "additionalProperties": False}


@space_schema.register(Tuple)
def _tuple(space: Tuple) -> dict[str, Any]:
    parts = [space_schema(part) for part in space.spaces]
    return {"type": "array", "prefixItems": parts, "items": False, "minItems": len(parts)}


def named_schemas(
    observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> dict[str, Any]:
    """The named schemas of requests and answers, for a server of these spaces."""
    single = {
        "observation": ref("Observation"),
        "reward": _FINITE,
        "info": _INFO,
        "request": _REQUEST,
    }
    multi = {
        "observations": _keyed(ref("Observation")),
        "rewards": _keyed(_FINITE),
        "infos": _keyed(_INFO),
        "dones": _keyed({"type": "boolean"}),
        "request": _REQUEST,
    }
    truncated = {"type": "boolean", "description": "true for a time limit; else terminated"}
    logp = {"type": ["number", "null"], "description": "null when acting at random"}
    version = {"type": ["integer", "null"], "description": "the checkpoint that acted"}
    return {
        "Error": object_schema(
            ["error"],
            error=object_schema(
                ["status", "message"], status={"type": "integer"}, message={"type": "string"}
            ),
        ),
        "Observation": space_schema(observation_space),
        "Action": space_schema(action_space),
        "Start": {
            **object_schema(
                [],
                episode_id=ID,
                training_enabled={"type": "boolean"},
                seed=INT64,
                options=_INFO,
                client_id={"type": ["string", "null"], "maxLength": 200},
            ),
            "description": "Every field may be left out; the server names an episode left "
            "unnamed, and a client_id left out is the caller's address.",
        },
        "Started": object_schema(["episode_id"], episode_id={"type": "string"}),
        "Step": {
            "anyOf": [
                object_schema(["observation"], **single),
                object_schema(["observations"], **multi),
            ]
        },
        "LoggedStep": {
            "anyOf": [
                object_schema(["observation", "action"], action=ref("Action"), **single),
                object_schema(["observations", "actions"], actions=_keyed(ref("Action")), **multi),
            ]
        },
        "EndStep": {
            "anyOf": [
                object_schema(["observation"], truncated=truncated, **single),
                object_schema(["observations"], truncated=truncated, **multi),
            ]
        },
        "Returns": {
            "anyOf": [
                object_schema([], reward=_FINITE, info=_INFO),
                object_schema(
                    ["rewards"],
                    rewards=_keyed(_FINITE),
                    infos=_keyed(_INFO),
                    dones=_keyed({"type": "boolean"}),
                ),
            ]
        },
        "Acted": {
            "anyOf": [
                object_schema(
                    ["episode_id", "action", "action_logp", "policy_version"],
                    episode_id={"type": "string"},
                    action={"description": "null after an end"},
                    action_logp=logp,
                    policy_version=version,
                ),
                object_schema(
                    ["episode_id", "actions", "action_logp", "policy_version"],
                    episode_id={"type": "string"},
                    actions=_keyed({}),
                    action_logp=_keyed(logp),
                    policy_version=version,
                ),
            ]
        },
        "Ended": object_schema(
            ["episode_id", "ended"], episode_id={"type": "string"}, ended={"const": True}
        ),
        "ReturnsTaken": object_schema(["episode_id"], episode_id={"type": "string"}),
        **_batch_schemas(truncated, logp, version),
        **_upload_schemas(),
    }


def _batch_schemas(truncated: Any, logp: Any, version: Any) -> dict[str, Any]:
    def column(items: Any) -> dict[str, Any]:
        return {"type": "array", "items": items}

    entry = {
        "episode_id": ID,
        "observation": ref("Observation"),
        "reward": _FINITE,
        "terminated": {"type": "boolean"},
        "truncated": truncated,
        "info": _INFO,
        "request": _REQUEST,
        "start": {
            "anyOf": [ref("Start"), {"type": "boolean"}],
            "description": "opens the episode first (true: with defaults)",
        },
    }
    multi = {k: v for k, v in entry.items() if k not in ("observation", "reward", "info")}
    multi.update(
        observations=_keyed(ref("Observation")), rewards=_keyed(_FINITE), infos=_keyed(_INFO)
    )
    return {
        "BatchColumns": {
            **object_schema(
                ["episode_ids", "observations"],
                episode_ids={**column(ID), "minItems": 1},
                observations=column(ref("Observation")),
                rewards=column(_FINITE),
                terminated=column({"type": "boolean"}),
                truncated=column({"type": "boolean"}),
                starts=column({"anyOf": [ref("Start"), {"type": "null"}]}),
                infos=column(_INFO),
                requests=column({"anyOf": [_REQUEST, {"type": "null"}]}),
            ),
            "description": "one entry per episode in every list, all of the same length",
        },
        "BatchEpisodes": object_schema(
            ["episodes"],
            episodes={
                **column(
                    {
                        "anyOf": [
                            object_schema(["episode_id", "observation"], **entry),
                            object_schema(["episode_id", "observations"], **multi),
                        ]
                    }
                ),
                "minItems": 1,
            },
        ),
        "BatchColumnsActed": object_schema(
            ["episode_ids", "actions", "action_logp", "policy_version"],
            episode_ids=column({"type": "string"}),
            actions=column({}),
            action_logp=column(logp),
            policy_version=version,
        ),
        "BatchEpisodesActed": object_schema(
            ["episodes"], episodes=column({"anyOf": [ref("Acted"), ref("Ended")]})
        ),
    }


def _upload_schemas() -> dict[str, Any]:
    row = {
        "episode_id": ID,
        "agent_id": {"type": "string", "minLength": 1},
        "t": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        "training_enabled": {"type": "boolean"},
    }
    step = object_schema(
        list(REQUIRED_STEP_COLUMNS),
        **row,
        observation=ref("Observation"),
        action=ref("Action"),
        reward=_FINITE,
        next_observation=ref("Observation"),
        terminated={"type": "boolean"},
        truncated={"type": "boolean"},
        action_logp={"type": ["number", "null"]},
        policy_version={**INT64, "type": ["integer", "null"]},
        info=_INFO,
    )
    when = {"type": "string", "format": "date-time", "description": "ISO 8601, with its zone"}
    row.pop("t")
    episode = object_schema(
        ["episode_id", "started_at", "ended_at", "length", "return", "end_reason"],
        **row,
        started_at=when,
        ended_at=when,
        length={"type": "integer", "minimum": 0},
        env_id={"type": ["string", "null"]},
        seed={**INT64, "type": ["integer", "null"]},
        reset_options={"type": ["string", "null"], "description": "JSON text"},
        end_reason={"enum": ["terminated", "truncated", "closed"]},
        **{"return": _FINITE},
    )
    return {
        "UploadRows": {
            **object_schema(
                [],
                steps={"type": "array", "items": step},
                episodes={"type": "array", "items": episode},
            ),
            "additionalProperties": False,
        },
        "Uploaded": object_schema(
            ["stored", "duplicate"],
            stored=_keyed({"type": "integer", "minimum": 0}),
            duplicate={
                "type": "boolean",
                "description": "true: this upload number was "
                "stored before, and nothing was written again",
            },
        ),
    }

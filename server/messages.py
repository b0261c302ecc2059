"""Reading request bodies: JSON in, checked values out, or a 400 that names the field.

A single-agent request carries ``observation``, ``reward``, ``info`` (and ``action`` when logging
one); a multi-agent request carries ``observations``, ``rewards``, ``infos``, ``actions`` and
``dones``, each an object keyed by agent id. Both become one :class:`StepInput` keyed by agent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import pyarrow as pa

from pipeline.errors import SchemaError
from pipeline.format import codec, layout, spaces
from server.columns import TERMINATED, TRUNCATED, ColumnStep
from server.errors import ApiError, bad_request

ARROW_TYPE = "application/vnd.apache.arrow.stream"


@dataclass
class StepInput:
    """One episode's part of a request, keyed by agent id (``agent0`` for single-agent)."""

    multiagent: bool
    observations: dict[str, Any] = field(default_factory=dict)
    observation_column: pa.Array | None = None  # validated, in the order of ``observations``
    rewards: dict[str, float] = field(default_factory=dict)
    infos: dict[str, Any] = field(default_factory=dict)
    dones: dict[str, bool] = field(default_factory=dict)
    actions: dict[str, Any] = field(default_factory=dict)


def parse_step(
    doc: dict[str, Any],
    observation_space: gym.Space[Any],
    action_space: gym.Space[Any] | None = None,
    prefix: str = "",
    checked: pa.Array | None = None,
) -> StepInput:
    """Check one episode's observations, rewards, infos (and actions) against the spaces.

    ``checked``: the single-agent observation, already validated as a one-row column (the
    batch form checks all its episodes' observations in one pass).
    """
    if "observations" in doc:
        step = _multi(doc, prefix)
    elif "observation" in doc:
        step = StepInput(
            multiagent=False,
            observations={layout.DEFAULT_AGENT_ID: doc["observation"]},
            rewards={layout.DEFAULT_AGENT_ID: _reward(doc.get("reward", 0.0), prefix + "reward")},
            infos=_single_info(doc, prefix),
        )
        if action_space is not None:
            step.actions = {layout.DEFAULT_AGENT_ID: _required(doc, "action", prefix)}
    else:
        raise bad_request(prefix + "observation", "an observation (or 'observations' keyed by "
                          "agent id)", "nothing")  # fmt: skip
    if action_space is not None and step.multiagent:
        step.actions = _keyed(_required(doc, "actions", prefix), prefix + "actions")
    field_name = "observations" if step.multiagent else "observation"
    step.observation_column = checked if checked is not None and not step.multiagent else (
        validate(observation_space, step.observations, prefix + field_name, step.multiagent)
    )  # fmt: skip
    # from here on values are in the column's Python form, which converts back to Arrow exactly
    step.observations = dict(zip(step.observations, step.observation_column.to_pylist(),
                                 strict=True))  # fmt: skip
    if action_space is not None:
        missing = sorted(set(step.observations) - set(step.actions))
        if missing:
            raise bad_request(prefix + "actions", "an action for every observed agent",
                              f"none for {missing}")  # fmt: skip
        actions = validate(action_space, step.actions,
                           prefix + ("actions" if step.multiagent else "action"),
                           step.multiagent)  # fmt: skip
        step.actions = dict(zip(step.actions, actions.to_pylist(), strict=True))
    return step


def validate(space: gym.Space[Any], values: dict[str, Any], name: str, keyed: bool) -> pa.Array:
    """One Arrow column of the values, or a 400 listing every problem (field named per agent)."""
    fast = codec.float_box_column(space, list(values.values())) if values else None
    if fast is not None:
        return fast
    problems = []
    columns = []
    for agent_id, value in values.items():
        where = f"{name}.{agent_id}" if keyed else name
        try:
            columns.append(codec.to_arrow_rows(space, [value], field=where))
        except SchemaError as error:
            problems += error.problems
    if problems:
        raise ApiError(400, "; ".join(
            f"field '{p.field}': expected {p.expected}, got {p.got}" for p in problems
        ))  # fmt: skip
    if not columns:
        return pa.array([], spaces.space_to_arrow(space))
    return columns[0] if len(columns) == 1 else pa.concat_arrays(columns)


def checked_observations(space: gym.Space[Any], entries: list[Any]) -> list[pa.Array | None]:
    """Each single-agent entry's observation as a validated one-row column, checked in one
    pass for a float Box; None where that fast check does not apply (the entry checks its own)."""
    found = [
        (i, entry["observation"]) for i, entry in enumerate(entries)
        if isinstance(entry, dict) and "observation" in entry and "observations" not in entry
    ]  # fmt: skip
    column = codec.float_box_column(space, [value for _, value in found]) if found else None
    out: list[pa.Array | None] = [None] * len(entries)
    if column is not None:
        for row, (i, _) in enumerate(found):
            out[i] = column.slice(row, 1)
    return out


def parse_returns(doc: dict[str, Any]) -> StepInput:
    """A log_returns body: ``reward`` and ``info``, or ``rewards``, ``infos`` and ``dones``."""
    if "rewards" in doc:
        return _multi({"observations": {}, **doc}, "")
    return StepInput(
        multiagent=False,
        rewards={layout.DEFAULT_AGENT_ID: _reward(doc.get("reward", 0.0), "reward")},
        infos=_single_info(doc, ""),
    )


def _single_info(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    info = doc.get("info")
    return {} if info is None else {layout.DEFAULT_AGENT_ID: json_value(info, prefix + "info")}


def _multi(doc: dict[str, Any], prefix: str) -> StepInput:
    observations = _keyed(doc["observations"], prefix + "observations")
    rewards = _keyed(doc.get("rewards") or {}, prefix + "rewards")
    dones = _keyed(doc.get("dones") or {}, prefix + "dones")
    for agent_id, flag in dones.items():
        if not isinstance(flag, bool):
            raise bad_request(f"{prefix}dones.{agent_id}", "true or false", repr(flag))
    return StepInput(
        multiagent=True,
        observations=observations,
        rewards={k: _reward(v, f"{prefix}rewards.{k}") for k, v in rewards.items()},
        infos={
            k: json_value(v, f"{prefix}infos.{k}")
            for k, v in _keyed(doc.get("infos") or {}, prefix + "infos").items()
        },
        dones={k: v for k, v in dones.items() if k != "__all__"},
    )


def _keyed(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise bad_request(name, "an object keyed by agent id", type(value).__name__)
    return value


def _required(doc: dict[str, Any], key: str, prefix: str) -> Any:
    if key not in doc:
        raise bad_request(prefix + key, "a value", "nothing")
    return doc[key]


def _reward(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
        raise bad_request(name, "a finite number", repr(value)[:40])
    return float(value)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def optional_int(doc: dict[str, Any], key: str, name: str | None = None) -> int | None:
    value = doc.get(key)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63
    ):
        raise bad_request(name or key, "a 64-bit integer or null", repr(value))
    return value


def optional_bool(doc: dict[str, Any], key: str, default: bool, name: str | None = None) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise bad_request(name or key, "true or false", repr(value))
    return value


def episode_id_of(value: Any, name: str = "episode_id") -> str:
    """Any string a URL can carry once quoted: '.' and '..' are path steps to HTTP clients."""
    if not isinstance(value, str) or not value or len(value) > 200 or value in (".", ".."):
        raise bad_request(name, "a non-empty string of at most 200 characters, not '.' or '..'",
                          repr(value))  # fmt: skip
    return value


def client_id_of(value: Any) -> str | None:
    """A start's ``client_id``: a string of at most 200 characters, or null for the caller's
    address. It is stored in every row as text, so nothing else is taken in its place."""
    if value is not None and (not isinstance(value, str) or len(value) > 200):
        expected = "a string of at most 200 characters or null"
        raise bad_request("client_id", expected, ascii(value)[:40])
    return value


def box_batch(space: gym.Space[Any], values: list[Any], field: str, rows: bool = True) -> Any:
    """Observations of a Box of floats as one array, checked in one numpy pass; else the 400
    that names the field (and, for ``rows``, the first bad row)."""
    batch = codec.float_box_rows(space, values)
    if batch is not None:
        return batch
    try:
        column = codec.to_arrow_rows(space, values, field=field)
    except SchemaError as error:
        if rows:
            raise
        raise ApiError(400, "; ".join(
            f"field '{p.field}': expected {p.expected}, got {p.got}" for p in error.problems
        )) from None  # fmt: skip
    return codec.from_arrow(space, column, field=field)


def single_column_step(doc: dict[str, Any], space: gym.Space[Any], episode_id: str,
                       end: str | None) -> ColumnStep:  # fmt: skip
    """A single-agent step request (get_action or end) as one row of the columnar path."""
    return ColumnStep(
        episode_ids=[episode_id],
        observations=box_batch(space, [doc["observation"]], "observation", rows=False),
        rewards=[_reward(doc.get("reward", 0.0), "reward")],
        infos=None if doc.get("info") is None else [json_value(doc["info"], "info")],
        ends=[end],
        requests=[optional_int(doc, "request")],
    )


def column_batch(doc: dict[str, Any], space: gym.Space[Any]) -> tuple[ColumnStep, list[Any]]:
    """The columnar batch form (``episode_ids``, ``observations``, ``rewards``, ``terminated``,
    ``truncated``, ``starts``, ``infos``: lists of one entry per episode) as a step, and the
    start documents (None for an episode that goes on)."""
    ids = doc["episode_ids"]
    if not isinstance(ids, list) or not ids:
        raise bad_request("episode_ids", "a non-empty list of episode ids", type(ids).__name__)
    n = len(ids)
    episode_ids = ids if _plain_ids(ids) else [
        episode_id_of(value, f"episode_ids[{i}]") for i, value in enumerate(ids)]  # fmt: skip
    observations = box_batch(space, _column(doc, "observations", n, None, True), "observations")
    rewards = _rewards(_column(doc, "rewards", n, 0.0))
    terminated = _flags(doc, "terminated", n)
    truncated = _flags(doc, "truncated", n)
    starts = _column(doc, "starts", n, None)
    for i, start in enumerate(starts):
        if start is not None and not isinstance(start, dict):
            raise bad_request(f"starts[{i}]", "an object or null", type(start).__name__)
    infos = None
    if doc.get("infos") is not None:
        infos = [
            json_value(info, f"infos[{i}]") for i, info in enumerate(_column(doc, "infos", n, None))
        ]
    ends = [_end(te, tr) for te, tr in zip(terminated, truncated, strict=True)]
    requests = _requests(_column(doc, "requests", n, None))
    step = ColumnStep(episode_ids, observations, rewards, infos, ends, requests, answers=False)
    return step, starts


def rows_as_columns(entries: list[Any], space: gym.Space[Any]) -> tuple[ColumnStep, list[Any]]:
    """The ``episodes`` batch form as columns, when every entry is a single-agent step."""
    columns: dict[str, list[Any]] = {
        "episode_ids": [], "observations": [], "rewards": [], "terminated": [], "truncated": [],
        "starts": [], "infos": [], "requests": [],
    }  # fmt: skip
    for i, entry in enumerate(entries):
        columns["episode_ids"].append(entry.get("episode_id"))
        columns["observations"].append(entry["observation"])
        columns["rewards"].append(entry.get("reward", 0.0))
        for flag in ("terminated", "truncated"):
            columns[flag].append(optional_bool(entry, flag, False, f"episodes[{i}].{flag}"))
        start = {} if entry.get("start") is True else entry.get("start")
        columns["starts"].append(start if isinstance(start, dict) else None)
        columns["infos"].append(entry.get("info"))
        columns["requests"].append(optional_int(entry, "request", f"episodes[{i}].request"))
    for key in ("infos", "requests"):
        if all(value is None for value in columns[key]):
            del columns[key]
    step, starts = column_batch(columns, space)
    step.answers = True
    return step, starts


def single_agent_rows(entries: list[Any]) -> bool:
    return all(isinstance(e, dict) and "observation" in e and "observations" not in e
               for e in entries)  # fmt: skip


def _column(doc: dict[str, Any], key: str, n: int, default: Any,
            required: bool = False) -> list[Any]:  # fmt: skip
    value = doc.get(key)
    if value is None and not required:
        return [default] * n
    if not isinstance(value, list) or len(value) != n:
        got = f"{len(value)} entries" if isinstance(value, list) else type(value).__name__
        raise bad_request(key, f"a list of {n} entries (one per episode id)", got)
    return value


def _plain_ids(ids: list[Any]) -> bool:
    """Whether every id is a string of 1 to 200 characters (checked a list at a time: the
    batch form's rows would spend more on checks made one by one than on their log)."""
    if set(map(type, ids)) != {str}:
        return False
    lengths = list(map(len, ids))
    return min(lengths) > 0 and max(lengths) <= 200


def _rewards(values: list[Any]) -> list[float]:
    """Finite numbers as floats, else the 400 that names the first bad one."""
    if set(map(type, values)) <= {float, int} and all(map(_finite, values)):
        return [float(value) for value in values]
    return [_reward(value, f"rewards[{i}]") for i, value in enumerate(values)]


def _requests(values: list[Any]) -> list[int | None]:
    """Request numbers (64-bit integers or nulls), else the 400 that names the first bad one."""
    if values.count(None) == len(values):
        return values
    if set(map(type, values)) == {int} and min(values) >= -(2**63) and max(values) < 2**63:
        return values  # the usual batch: checked a list at a time
    return [optional_int({"request": v}, "request", f"requests[{i}]") for i, v in enumerate(values)]


def _flags(doc: dict[str, Any], key: str, n: int) -> list[bool]:
    flags = _column(doc, key, n, False)
    if set(map(type, flags)) <= {bool}:
        return flags
    for i, flag in enumerate(flags):
        if not isinstance(flag, bool):
            raise bad_request(f"{key}[{i}]", "true or false", repr(flag))
    return flags


def json_value(value: Any, name: str) -> Any:
    """An info or a start's options (any JSON value, stored as JSON text); a string must be
    JSON text already, as the writer takes it (docs/format.md, section 4)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError:
            raise bad_request(name, "an object or JSON text", repr(value[:40])) from None
    return value


def _end(terminated: bool, truncated: bool) -> str | None:
    if terminated:
        return TERMINATED
    return TRUNCATED if truncated else None

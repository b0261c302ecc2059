"""The step table and the episodes table: columns, types, and turning user data into rows.

One row of the step table is one agent's transition. ``observation`` and ``action`` take the Arrow
types of the dataset's spaces (see :mod:`pipeline.format.spaces`); everything else is fixed here.
Validation is columnar and reports every problem of a call at once, so one bad row cannot hide
another.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.errors import Problem, SchemaError
from pipeline.format import codec, json_text, layout, seeds, spaces

TIMESTAMP = pa.timestamp("us", tz="UTC")
END_REASONS = ("terminated", "truncated", "closed")

# Columns the caller may leave out, and what they become.
STEP_DEFAULTS: dict[str, Any] = {
    "agent_id": layout.DEFAULT_AGENT_ID,
    "action_logp": None,
    "policy_version": None,
    "training_enabled": True,
    "info": None,
    "client_id": "",
    "logged_at": None,  # the writer stamps the time of the append
}

EPISODE_SCHEMA = pa.schema(
    [
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("agent_id", pa.string(), nullable=False),
        pa.field("client_id", pa.string(), nullable=False),
        pa.field("started_at", TIMESTAMP, nullable=False),
        pa.field("ended_at", TIMESTAMP, nullable=False),
        pa.field("length", pa.int64(), nullable=False),
        pa.field("return", pa.float64(), nullable=False),
        pa.field("env_id", pa.string()),
        pa.field("seed", pa.int64()),
        pa.field("reset_options", pa.string()),  # JSON text
        pa.field("end_reason", pa.string(), nullable=False),  # one of END_REASONS
        pa.field("training_enabled", pa.bool_(), nullable=False),
        pa.field("logged_at", TIMESTAMP, nullable=False),
    ],
    metadata={
        layout.META_TABLE: layout.EPISODES.encode(),
        layout.META_FORMAT_VERSION: str(layout.FORMAT_VERSION).encode(),
    },
)
EPISODE_DEFAULTS: dict[str, Any] = {
    "agent_id": layout.DEFAULT_AGENT_ID,
    "client_id": "",
    "env_id": None,
    "seed": None,
    "reset_options": None,
    "training_enabled": True,
    "logged_at": None,
}


def step_schema(observation_space: gym.Space[Any], action_space: gym.Space[Any]) -> pa.Schema:
    """The step table's schema; the spaces ride in its metadata so each shard describes itself."""
    observation = spaces.space_field("observation", observation_space)
    return pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("agent_id", pa.string(), nullable=False),
            pa.field("t", pa.int64(), nullable=False),
            observation,
            spaces.space_field("action", action_space),
            pa.field("reward", pa.float64(), nullable=False),
            observation.with_name("next_observation"),
            pa.field("terminated", pa.bool_(), nullable=False),
            pa.field("truncated", pa.bool_(), nullable=False),
            pa.field("action_logp", pa.float64()),
            pa.field("policy_version", pa.int64()),
            pa.field("training_enabled", pa.bool_(), nullable=False),
            pa.field("info", pa.string()),  # JSON text
            pa.field("client_id", pa.string(), nullable=False),
            pa.field("logged_at", TIMESTAMP, nullable=False),
        ],
        metadata={
            layout.META_TABLE: layout.STEPS.encode(),
            layout.META_FORMAT_VERSION: str(layout.FORMAT_VERSION).encode(),
            layout.META_OBSERVATION_SPACE: json.dumps(
                spaces.space_to_json(observation_space)
            ).encode(),
            layout.META_ACTION_SPACE: json.dumps(spaces.space_to_json(action_space)).encode(),
        },
    )


# the step table's columns in schema order: its names do not depend on the spaces
STEP_COLUMNS = tuple(step_schema(gym.spaces.Discrete(1), gym.spaces.Discrete(1)).names)
TRANSITION_COLUMNS = STEP_COLUMNS[:11]  # what a transition is: ids, t, values, flags, behaviour
REQUIRED_STEP_COLUMNS = tuple(name for name in STEP_COLUMNS if name not in STEP_DEFAULTS)


def steps_from_columns(
    schema: pa.Schema,
    columns: Mapping[str, Any],
    observation_space: gym.Space[Any],
    action_space: gym.Space[Any],
) -> pa.RecordBatch:
    """Validate a mapping of column name to per-row values and build a step batch.

    Raises:
        SchemaError: listing every unknown, missing or ill-fitting column at once.
    """
    value_spaces = {
        "observation": observation_space,
        "next_observation": observation_space,
        "action": action_space,
    }
    return _build(schema, columns, STEP_DEFAULTS, value_spaces)


def episodes_from_columns(columns: Mapping[str, Any]) -> pa.RecordBatch:
    """Validate and build an episodes batch (one row per ended episode)."""
    batch = _build(EPISODE_SCHEMA, columns, EPISODE_DEFAULTS, {})
    reasons = batch.column("end_reason")
    bad = pc.invert(pc.is_in(reasons, value_set=pa.array(END_REASONS)))
    _refuse(
        "end_reason", bad, f"one of {list(END_REASONS)}", lambda row: repr(reasons[row].as_py())
    )
    started, ended = batch.column("started_at"), batch.column("ended_at")
    _refuse(
        "started_at",
        pc.greater(started, ended),
        "a time no later than ended_at",
        lambda row: f"{started[row].as_py()}, after ended_at {ended[row].as_py()}",
    )
    return batch


def rows_to_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Turn per-row mappings into columns; a key absent from some rows is left to the defaults."""
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    if len(keys) > 1 and all(len(row) == len(keys) for row in rows):  # every row has every key
        values = zip(*map(operator.itemgetter(*keys), rows), strict=True)  # a C call per row
        return dict(zip(keys, map(list, values), strict=True))
    return {key: [row.get(key, _ABSENT) for row in rows] for key in keys}


class _Absent:
    def __repr__(self) -> str:
        return "<missing>"


_ABSENT = _Absent()


def _build(
    schema: pa.Schema,
    columns: Mapping[str, Any],
    defaults: Mapping[str, Any],
    value_spaces: Mapping[str, gym.Space[Any]],
) -> pa.RecordBatch:
    problems: list[Problem] = []
    unknown = sorted(set(columns) - set(schema.names))
    problems += [
        Problem(name, f"one of the columns {schema.names}", "an unknown column") for name in unknown
    ]
    lengths = {name: length(values) for name, values in columns.items() if name in schema.names}
    n = max(lengths.values(), default=0)
    for name, rows in lengths.items():
        if rows != n:
            problems.append(Problem(name, f"{n} rows like the other columns", f"{rows} rows"))
    if problems:
        raise SchemaError(problems)
    arrays: list[pa.Array] = []
    for field in schema:
        values = columns.get(field.name, _ABSENT)
        if values is _ABSENT and field.name in defaults:
            arrays.append(_default(field, defaults[field.name], n))
            continue
        if values is _ABSENT:
            problems.append(Problem(field.name, "a value for every row", "no such column"))
            arrays.append(pa.nulls(0))
            continue
        try:
            if field.name in value_spaces:
                arrays.append(_space_column(value_spaces[field.name], values, field.name))
            else:
                arrays.append(_plain_column(field, values, defaults.get(field.name, _ABSENT)))
        except SchemaError as error:
            problems += error.problems
    if problems:
        raise SchemaError(problems)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def length(value: Any) -> int:
    """Rows of a column: a list, an array, or a batch of a Dict or Tuple space (a dict or
    tuple of arrays, whose rows are those of its first entry)."""
    if isinstance(value, Mapping) and value:
        return length(next(iter(value.values())))
    if isinstance(value, tuple) and value:
        return length(value[0])
    return len(value)


def _default(field: pa.Field, value: Any, n: int) -> pa.Array:
    """A constant column, built natively (``np.full`` of strings cost ~1 ms per 10k rows)."""
    if field.name == "logged_at" and value is None:
        value = datetime.now(UTC)
    if value is None:
        return pa.nulls(n, field.type)
    return pa.repeat(pa.scalar(value, field.type), n)


def _space_column(space: gym.Space[Any], values: Any, name: str) -> pa.Array:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return codec.to_arrow(space, codec.from_arrow(space, values), field=name)
    if isinstance(values, list) and values and values[0] is _ABSENT:
        raise SchemaError.single(name, "a value for every row", "<missing>", 0)
    if isinstance(values, list):
        return codec.to_arrow_rows(space, values, field=name)
    return codec.to_arrow(space, values, field=name)


def _plain_column(field: pa.Field, values: Any, default: Any) -> pa.Array:
    """Convert one fixed-type column, naming the first bad row."""
    if isinstance(values, list) and any(_each_is(values, _ABSENT)):
        absent = [i for i, v in enumerate(values) if v is _ABSENT]
        if default is _ABSENT:
            raise SchemaError.single(field.name, "a value for every row", "<missing>", absent[0])
        values = [default if v is _ABSENT else v for v in values]
    convert = _CONVERTERS.get(field.name, _convert_generic)
    array = convert(field, values)
    if not field.nullable and array.null_count:
        _refuse(field.name, array.is_null(), f"{field.type} (not null)", lambda _: "null")
    return array


def _each_is(values: list[Any], value: Any) -> Iterator[bool]:
    """Whether each of ``values`` is ``value``, tested in C (a Python loop over a batch's rows
    cost more than building its column)."""
    return map(operator.is_, values, itertools.repeat(value))


def _refuse(
    name: str, bad: pa.Array | pa.ChunkedArray, expected: str, got: Callable[[int], str]
) -> None:
    """Raise naming the first row of the mask ``bad``, if any (counted first: finding the row
    cost 15 us a check, and a batch makes several, nearly always of no bad row)."""
    chunks = bad.chunks if isinstance(bad, pa.ChunkedArray) else [bad]
    if any(chunk.true_count for chunk in chunks):
        row = pc.index(bad, True).as_py()
        raise SchemaError.single(name, expected, got(row), row)


def _convert_generic(field: pa.Field, values: Any, from_pandas: bool = True) -> pa.Array:
    _refuse_lossy(field, values)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    try:
        if isinstance(values, pa.Array):  # an upload's columns are mostly of their type already
            return values if values.type == field.type else values.cast(field.type, safe=True)
        if isinstance(values, np.ndarray) and values.dtype.kind == "M":
            return pa.array(values.astype("datetime64[us]"), type=field.type)
        if pa.types.is_timestamp(field.type):
            if all(map(_aware, values)):  # the step core's times: pandas took half a summary build
                return pa.array(values, type=field.type)
            # datetimes, numpy datetime64 and ISO strings alike; naive times are taken as UTC
            import pandas as pd  # here alone: a client's process never loads it

            stamps = pd.to_datetime(pd.Series(values, dtype=object), utc=True, format="ISO8601")
            return pa.array(stamps, type=field.type)
        return pa.array(values, type=field.type, from_pandas=from_pandas)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as error:
        got = _describe(values)
        raise SchemaError.single(field.name, str(field.type), f"{got} ({error})") from None


def _refuse_lossy(field: pa.Field, values: Any) -> None:
    """Refuse the Python values pyarrow would store as other numbers without a word: a float in
    an integer column (1.5 becomes 1), a bool in a number column (True becomes 1)."""
    if not isinstance(values, list | tuple):  # arrays are cast safely: 1.5 is refused there
        return
    if pa.types.is_integer(field.type):
        lossy: tuple[type, ...] = (float, np.floating, bool, np.bool_)
    elif pa.types.is_floating(field.type):
        lossy = (bool, np.bool_)
    else:
        return
    if any(issubclass(kind, lossy) for kind in set(map(type, values))):
        row = next(i for i, value in enumerate(values) if isinstance(value, lossy))
        expected = f"{field.type} values ({'integers' if lossy[0] is float else 'numbers'})"
        raise SchemaError.single(field.name, expected, repr(values[row]), row)


def _aware(value: Any) -> bool:
    return type(value) is datetime and value.tzinfo is not None


def _convert_float(field: pa.Field, values: Any) -> pa.Array:
    array = _convert_generic(field, values, from_pandas=False)  # keep NaN as NaN, None as null
    data = array.to_numpy(zero_copy_only=False)
    finite = np.isfinite(data)
    if not finite.all():  # NaN or infinity, or the NaN a null reads as
        bad = ~finite & ~array.is_null().to_numpy(zero_copy_only=False)
        _refuse(field.name, pa.array(bad), "finite values", lambda row: str(data[row]))
    return array


def _convert_id(field: pa.Field, values: Any) -> pa.Array:
    array = _convert_generic(field, values)
    if field.name == "episode_id":
        empty = pc.equal(pc.utf8_length(array), 0)
        _refuse(field.name, empty, "a non-empty string", lambda _: "''")
    return array


def _convert_t(field: pa.Field, values: Any) -> pa.Array:
    array = _convert_generic(field, values)
    negative = pc.less(array, 0)
    _refuse(field.name, negative, "a step index >= 0", lambda row: str(array[row].as_py()))
    return array


def _describe(values: Any) -> str:
    if isinstance(values, np.ndarray):
        return f"array of {values.dtype}"
    if isinstance(values, pa.Array):
        return f"arrow {values.type}"
    sample = (
        next((v for v in values if v is not None), None) if isinstance(values, list) else values
    )
    return f"{type(sample).__name__} values"


_CONVERTERS: dict[str, Callable[[pa.Field, Any], pa.Array]] = {
    "reward": _convert_float,
    "action_logp": _convert_float,
    "return": _convert_float,
    "info": json_text.column,
    "reset_options": json_text.column,
    "episode_id": _convert_id,
    "agent_id": _convert_id,
    "t": _convert_t,
    "length": _convert_t,
    "seed": seeds.to_arrow,
}

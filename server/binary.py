"""The step requests' binary form: an Arrow IPC stream whose columns are the JSON body's fields.

A camera frame as JSON is 21,168 numbers to print and parse (an 84x84x3 ``uint8`` image:
about 58 steps a second on this machine); as Arrow it is its own bytes. The body is one Arrow
IPC *stream* (``Content-Type: application/vnd.apache.arrow.stream``) holding one record batch:
one row for ``get_action``, ``log_action`` and ``end_episode``, one row per episode for the
batch form. Each column is named as the JSON field it stands for, so the body becomes the same
JSON-shaped document and takes the same road (:mod:`server.requests`): every value is checked
as a JSON body's is, and a bad one gets the same 400 naming the same field.

Observations and logged actions are columns of the Arrow type the step table stores their space
in (``docs/format.md``, section 6): a ``Box`` is a ``fixed_size_list`` of its dtype, flattened in
C order. The type says dtype and size, so Arrow itself refuses a frame of the wrong length, and
:func:`pipeline.format.codec.from_arrow` names the column whose type does not belong to the
space. The other columns are plain (``docs/protocol.md``, "Binary bodies"): ``reward`` a
``double``, ``request`` an ``int64``, flags ``bool``, ids ``utf8``, and ``info`` and ``starts``
JSON text (``utf8``). A null is a value left out, as in JSON.
"""

from __future__ import annotations

import json
from typing import Any

import gymnasium as gym
import pyarrow as pa

from pipeline.errors import SchemaError
from pipeline.format import codec
from pipeline.recording import batches
from server.errors import ApiError, bad_request
from server.uploads import read_arrow

_TEXT, _INT, _FLOAT, _BOOL = pa.string(), pa.int64(), pa.float64(), pa.bool_()
_SPACE = None  # the column holds values of a space: its type is the space's Arrow type

# the columns each form takes, and their Arrow types (the JSON body's fields)
_STEP = {"observation": _SPACE, "reward": _FLOAT, "request": _INT, "info": _TEXT}
STEP_COLUMNS: dict[str, dict[str, pa.DataType | None]] = {
    "actions": _STEP,
    "logged-actions": {**_STEP, "action": _SPACE},
    "end": {**_STEP, "truncated": _BOOL},
}
BATCH_COLUMNS: dict[str, pa.DataType | None] = {
    "episode_ids": _TEXT,
    "observations": _SPACE,
    "rewards": _FLOAT,
    "terminated": _BOOL,
    "truncated": _BOOL,
    "starts": _TEXT,
    "infos": _TEXT,
    "requests": _INT,
}

_DEFAULTS = {"rewards": 0.0, "terminated": False, "truncated": False}


def step_doc(
    body: bytes, verb: str, observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> dict[str, Any]:
    """A one-episode step's binary body as the JSON body it stands for (one row)."""
    table = _table(body, STEP_COLUMNS[verb], ["observation"])
    if table.num_rows != 1:
        raise bad_request("body", "one row (one step of one episode)", f"{table.num_rows} rows")
    doc = {name: values[0] for name, values in _scalars(table, STEP_COLUMNS[verb]).items()}
    doc = {name: value for name, value in doc.items() if value is not None}
    doc["observation"] = batches.row_of(_space_column(table, "observation", observation_space), 0)
    if "action" in table.column_names:
        doc["action"] = batches.row_of(_space_column(table, "action", action_space), 0)
    return doc


def batch_doc(body: bytes, observation_space: gym.Space[Any]) -> dict[str, Any]:
    """The batch form's binary body as its columnar JSON body (one row per episode)."""
    table = _table(body, BATCH_COLUMNS, ["episode_ids", "observations"])
    if table.num_rows == 0:
        raise bad_request("episode_ids", "a non-empty list of episode ids", "0 rows")
    doc: dict[str, Any] = _scalars(table, BATCH_COLUMNS)
    for name, default in _DEFAULTS.items():  # a null is the value left out
        if name in doc:
            doc[name] = [default if value is None else value for value in doc[name]]
    if "starts" in doc:
        doc["starts"] = [_json_text(text, f"starts[{i}]") for i, text in enumerate(doc["starts"])]
    observations = _space_column(table, "observations", observation_space)
    doc["observations"] = batches.rows_of(observations)
    return doc


def _table(body: bytes, columns: dict[str, pa.DataType | None], required: list[str]) -> pa.Table:
    """The body's one table, its columns known and each named once, the required ones there."""
    table = read_arrow(body)
    try:  # offsets in range, text valid UTF-8: what the reader alone does not promise
        table.validate(full=True)
    except pa.ArrowInvalid as error:
        raise ApiError(400, f"body: expected a valid Arrow IPC stream, got {error}") from None
    names = table.column_names
    unknown = [name for name in names if name not in columns]
    if unknown:
        raise bad_request(unknown[0], f"one of the columns {list(columns)}", "an unknown column")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise bad_request(twice[0], "one column of this name", f"{names.count(twice[0])} columns")
    missing = [name for name in required if name not in names]
    if missing:
        raise bad_request(missing[0], "a column", "nothing")
    return table


def _scalars(table: pa.Table, columns: dict[str, pa.DataType | None]) -> dict[str, list[Any]]:
    """The plain columns' values (null where left out), each column's type checked."""
    out = {}
    for name in table.column_names:
        expected = columns[name]
        if expected is _SPACE:
            continue
        column = table.column(name)
        if not column.type.equals(expected):
            raise bad_request(name, f"an Arrow column of type {expected}", str(column.type))
        out[name] = column.to_pylist()
    return out


def _space_column(table: pa.Table, name: str, space: gym.Space[Any]) -> Any:
    """A column of a space's values as a batch (row axis first), its Arrow type and nulls
    checked; the values (NaN, integers out of range) are checked on the JSON road, which names
    them as it names a JSON body's."""
    try:
        return codec.from_arrow(space, table.column(name), field=name)
    except SchemaError as error:
        raise ApiError(400, str(error).strip()) from None


def _json_text(text: str | None, name: str) -> Any:
    """A start given as JSON text (an object, ``true``, or null)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise bad_request(name, "JSON text of an object, or null", repr(text[:40])) from None

"""Line segments of the write-ahead log: small appends, durable without Arrow.

Most appends a server acknowledges hold one to a few dozen rows, and pyarrow's fixed cost per
record batch would be a third of a step; as one JSON line such an append costs a fifth of that,
and the shard is built from the lines' values in bulk when the segment rolls, off the request
path. ``docs/format.md`` section 8 has the figures and the spec of the line format. A line is
written with one ``write`` loop, so a torn tail is an incomplete last line, dropped.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import numpy as np
import orjson
import pyarrow as pa

from pipeline.dataset import records
from pipeline.dataset.wal import Segment
from pipeline.errors import DatasetError
from pipeline.format.json_text import text as json_text

MAX_LIST = 64  # values in a fixed-size list column; larger ones (images) are logged as Arrow
_PACK_MIN = 8  # rows from which a scalar column is packed: for fewer, its values cost less
_HEADER = "rlpipe-rows"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def fits(table_schema: pa.Schema) -> bool:
    """Whether every column is a scalar or a fixed-size list of at most ``MAX_LIST`` numbers."""
    return all(_kind(field.type) for field in table_schema)


CheckedColumns = list[list[Any]]  # an append's checked values, column by column in schema order


class RowEncoder:
    """An append to one table (a mapping of column name to values) as checked columns and one
    log line.

    Every value is checked against its column's Arrow type here, so that a line accepted now
    always becomes Arrow later, at commit or in recovery (a value that JSON carries but Arrow
    refuses would otherwise stop every later writer of the dataset). What the values mean the
    writer checks after (:mod:`pipeline.format.checks`).
    """

    def __init__(self, table_schema: pa.Schema) -> None:
        self.names = table_schema.names
        self.logged_at = self.names.index("logged_at")
        self._plan = [
            (
                i,
                field.name,
                "text" if field.name in _TEXTS else cast(str, _kind(field.type)),
                not field.nullable,
            )
            for i, field in enumerate(table_schema)
            if i != self.logged_at
        ]
        self._lists = {
            i: (_dtype(field.type), field.type.list_size)
            for i, field in enumerate(table_schema)
            if pa.types.is_fixed_size_list(field.type)
        }
        self._codes = {
            i: _STRUCT.get(_dtype(table_schema.field(i).type).str[1:])
            for i, _, kind, _ in self._plan
            if kind in _PACKED
        }
        self._packs = {i for i, code in self._codes.items() if code is not None} | set(self._lists)

    def encode(self, given: Mapping[str, Any], now: int) -> tuple[CheckedColumns, bytes]:
        """An append's checked columns and its line, stamped ``now`` (microseconds since the
        epoch). A list column, and from ``_PACK_MIN`` rows a column of numbers without nulls, is
        written as the base64 of its bytes, sparing the decimal text of each value.

        Raises:
            ValueError, TypeError, KeyError: a value the checks refuse, or a missing column; the
                writer then takes the validating path, whose error names the row and field.
        """
        n = len(given[self._plan[0][1]])
        columns: CheckedColumns = []
        written: list[Any] = []
        for i, name, kind, required in self._plan:
            values = given[name]
            if len(values) != n:
                raise ValueError(f"column {name!r}: {len(values)} values, expected {n}")
            packed = (
                self._pack(i, kind, values, n)
                if i in self._packs and (kind == "list" or n >= _PACK_MIN)
                else None
            )
            if packed is not None:
                columns.append([packed] if kind == "list" else values)
                written.append(binascii.b2a_base64(packed, newline=False).decode())
            elif kind == "list":  # a None, lists of other sizes or mixed shapes, non-numbers
                raise ValueError(f"column {name!r}: expected lists of {self._lists[i][1]} numbers")
            else:
                checked = self._checked(i, kind, required, list(values))
                columns.append(checked)
                written.append(checked)
        columns.insert(self.logged_at, [now] * n)
        written.insert(self.logged_at, columns[self.logged_at])
        # orjson writes a line in a third of json's time and refuses a lone surrogate (not
        # UTF-8); it would write NaN as null, but floats are checked finite before
        return columns, records.line(orjson.dumps({"n": n, "columns": written}))

    def _checked(self, i: int, kind: str, required: bool, values: list[Any]) -> list[Any]:
        """One column's values checked against its type, as the segment keeps them."""
        if kind in _TYPES:
            types = set(map(type, values))
            if not types <= _TYPES[kind] or (required and _NONE in types):
                values = self._scalars(i, kind, required, values)
            if kind == "int" or kind == "float":
                present = values if _NONE not in types else [v for v in values if v is not None]
                if kind == "float" and not math.isfinite(sum(present)):
                    raise ValueError(f"column {self.names[i]!r}: NaN or infinity")
                if kind == "int" and present and not _MIN <= min(present) <= max(present) <= _MAX:
                    raise ValueError(f"column {self.names[i]!r}: beyond int64")
            return values
        if kind == "text":
            return [json_text(value) for value in values]
        return [None if value is None else micros(value) for value in values]  # a time

    def _pack(self, i: int, kind: str, values: Any, n: int) -> bytes | None:
        """A column of numbers as the little-endian bytes of its values (lists: of their
        items), or None when it holds anything else (nulls, numpy scalars, mixed types)."""
        if kind == "list":
            try:
                raw = np.asarray(values)
            except ValueError:  # lists of different shapes
                return None
            dtype, size = self._lists[i]
            if (
                raw.dtype.kind not in _ACCEPTS[dtype.kind]
                or raw.shape[:1] != (n,)
                or (raw.size != n * size)
            ):
                return None
            if dtype.kind == "f" and not np.abs(raw).max(initial=0) <= _FLOAT_MAX[dtype.itemsize]:
                return None  # NaN, infinity, or too large for the dtype
            return raw.astype(dtype, copy=False).tobytes()  # float64 values of float32: rounded
        if not isinstance(values, list) or not set(map(type, values)) <= _PACKED[kind]:
            return None
        if kind == "float" and not math.isfinite(sum(values)):
            raise ValueError(f"column {self.names[i]!r}: NaN or infinity")
        try:
            return struct.pack(f"<{n}{self._codes[i]}", *values)
        except struct.error:
            raise ValueError(f"column {self.names[i]!r}: beyond its type") from None

    def _scalars(self, i: int, kind: str, required: bool, values: list[Any]) -> list[Any]:
        """Scalars of another type than the column's (numpy's are taken as their value), or
        TypeError; a missing required value is ValueError."""
        values = [value.item() if isinstance(value, np.generic) else value for value in values]
        if kind == "float":  # an int reward is its float (an int's repr is not a float's)
            values = [float(value) if type(value) is int else value for value in values]
        types = set(map(type, values))
        if required and _NONE in types:
            raise ValueError(f"column {self.names[i]!r}: a value is required")
        if not types <= _TYPES[kind]:
            raise TypeError(f"column {self.names[i]!r}: expected {kind} values")
        return values


_FLOAT_MAX = {size: float(np.finfo(f"f{size}").max) for size in (2, 4, 8)}  # by item size
_ACCEPTS = {"i": "iu", "u": "iu", "f": "fiu"}  # numpy kinds a list column's items may have
_PACKED: dict[str, set[type]] = {"int": {int}, "float": {float, int}, "bool": {bool}}
# a numpy type (after its byte order) as a struct code
_STRUCT = dict(
    zip(
        ["i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1", "f8", "f4", "b1"],
        "qihbQIHBdf?",
        strict=True,
    )
)
_TEXTS = ("info", "reset_options")  # JSON text: objects are written as text, text must parse
_NONE = type(None)
_TYPES: dict[str, set[type]] = {
    "int": {int, _NONE},
    "float": {float, _NONE},
    "bool": {bool, _NONE},
    "str": {str, _NONE},
}
_MIN, _MAX = -(2**63), 2**63 - 1  # int64


def _kind(kind: pa.DataType) -> str | None:
    """How the log carries a column's values; None for a type it does not carry."""
    if pa.types.is_fixed_size_list(kind):
        value = kind.value_type
        number = pa.types.is_integer(value) or pa.types.is_floating(value)
        return "list" if number and kind.list_size <= MAX_LIST else None
    for name, test in _KINDS.items():
        if test(kind):
            return name
    return None


_KINDS = {
    "time": pa.types.is_timestamp,
    "str": pa.types.is_string,
    "bool": pa.types.is_boolean,
    "int": pa.types.is_integer,
    "float": pa.types.is_floating,
}


def micros(moment: datetime) -> int:
    """A timestamp as integer microseconds since the epoch (exact, unlike ``timestamp()``)."""
    if not isinstance(moment, datetime):
        raise TypeError(f"a {type(moment).__name__} is not a datetime")
    delta = moment - _EPOCH  # TypeError for a naive datetime: its zone is unknown
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _dtype(kind: pa.DataType) -> np.dtype[Any]:
    """The little-endian numpy type of a column's values (a fixed-size list's: of its items), as
    the log stores them."""
    if pa.types.is_fixed_size_list(kind):
        kind = kind.value_type
    return np.dtype(kind.to_pandas_dtype()).newbyteorder("<")


class RowSegment(Segment):
    """A log segment of row lines; its shard is built from the checked columns of its appends,
    kept in memory (a CartPole step: 317 bytes held for its 141 in the log, 114 as Arrow)."""

    def __init__(self, path: Path, table_schema: pa.Schema, seq: int) -> None:
        schema_text = base64.b64encode(table_schema.serialize().to_pybytes()).decode()
        header = json.dumps({"format": _HEADER, "schema": schema_text}).encode()
        super().__init__(path, table_schema, seq, records.line(header))
        self._columns: CheckedColumns = [[] for _ in table_schema]

    def _record(self, buffer: pa.Buffer | bytes) -> list[pa.Buffer | bytes]:
        return [buffer]  # a line carries its own checksum

    def _keep(self, kept: Any) -> None:
        for column, values in zip(self._columns, kept, strict=True):
            column += values

    def _kept(self) -> tuple[int, ...]:
        return tuple(map(len, self._columns))  # a list column keeps one item per append

    def _drop(self, kept: tuple[int, ...]) -> None:
        for column, length in zip(self._columns, kept or (0,) * len(self._columns), strict=True):
            del column[length:]

    @property
    def batches(self) -> list[pa.RecordBatch]:
        with self._write_lock:
            columns = [list(column) for column in self._columns]
        return [to_batch(self.schema, columns)] if columns[0] else []


def to_batch(table_schema: pa.Schema, columns: CheckedColumns) -> pa.RecordBatch:
    """Checked columns (as :meth:`RowEncoder.encode` makes them) as one batch of the table."""
    arrays = [
        _column(field.type, column) for field, column in zip(table_schema, columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=table_schema)


def _column(kind: pa.DataType, column: list[Any]) -> pa.Array:
    if pa.types.is_fixed_size_list(kind):
        flat = np.frombuffer(b"".join(column), _dtype(kind))
        return pa.FixedSizeListArray.from_arrays(pa.array(flat), kind.list_size)
    return pa.array(column, type=kind)


def read_rows(path: Path) -> records.LogRead:
    """Every sound append of a row segment, dropping a torn tail and naming damaged lines; no
    schema if the header is torn or damaged.

    Raises:
        DatasetError: a sound header this code does not know (another format): its rows must
            not be dropped as if torn.
    """
    data = path.read_bytes()
    unchecked = data.startswith(b"{")  # written before lines had checksums: read as they were
    lines = records.plain_lines(data) if unchecked else records.checked_lines(data)
    first = next(lines, None)
    if first is None:
        return records.LogRead(None)  # no complete header: the writer died creating it
    if first[1] is None:
        return records.LogRead(None, [], [f"the header: {first[2]}"], ["every row"])
    found = records.LogRead(_header_schema(path, first[1]))
    columns: CheckedColumns = [[] for _ in found.schema or ()]
    for number, body, problem in lines:
        part = _parsed(found.schema, body) if body is not None else None
        if part is None:
            found.problems.append(problem or f"line {number} is not a row record")
            found.lost.append(_lost_rows(found.schema, number, data))
            continue
        for kept, column in zip(columns, part, strict=True):
            kept += column
    if found.schema is not None and columns[0]:
        found.batches.append(to_batch(found.schema, columns))
    return found


def _parsed(table_schema: pa.Schema | None, body: bytes) -> CheckedColumns | None:
    try:
        return _line_columns(table_schema, json.loads(body))
    except (ValueError, TypeError, KeyError, binascii.Error):
        return None  # a sound checksum over a line this code cannot read: named as damage


def _header_schema(path: Path, body: bytes) -> pa.Schema:
    try:
        header = json.loads(body)
        if header.get("format") != _HEADER:
            raise ValueError(header.get("format"))
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(header["schema"])))
    except (ValueError, TypeError, KeyError, AttributeError, pa.ArrowInvalid) as error:
        raise DatasetError(
            f"{path}: not a row segment this rlpipe reads ({error!r}); it is left in place"
        ) from None


def _lost_rows(table_schema: pa.Schema | None, number: int, data: bytes) -> str:
    """Which rows a damaged line held, as its damaged text still tells (unverified)."""
    text = data.split(b"\n")[number - 1]
    try:
        record = json.loads(text[text.find(b"{") :])
        columns = dict(zip(table_schema.names, record["columns"], strict=True))  # type: ignore[union-attr]
        ids = columns["episode_id"]
        return f"line {number}: {record['n']} rows of episode_id {ids} (as the damaged line reads)"
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"line {number}: rows unknown ({len(text)} bytes that do not parse)"


def _line_columns(table_schema: pa.Schema, record: Any) -> CheckedColumns:
    """One line's values column by column, as :meth:`RowEncoder.encode` keeps them."""
    n = record["n"]
    columns = []
    for field, entry in zip(table_schema, record["columns"], strict=True):
        if isinstance(entry, list):
            column = (
                entry
                if not pa.types.is_fixed_size_list(field.type)
                else [binascii.a2b_base64(text) for text in entry]
            )
        else:
            column = _unpacked(field.type, binascii.a2b_base64(entry), n)
        if len(column) != n:
            raise ValueError(f"column {field.name!r}: {len(column)} values, expected {n}")
        columns.append(column)
    return columns


def _unpacked(kind: pa.DataType, data: bytes, n: int) -> list[Any]:
    """A column written as the bytes of its ``n`` values (lists: of their items)."""
    dtype, listed = _dtype(kind), pa.types.is_fixed_size_list(kind)
    size = kind.list_size if listed else 1
    if len(data) != n * size * dtype.itemsize:
        raise ValueError(f"{len(data)} bytes for {n} values of {size} {dtype}")
    if listed:
        step = len(data) // max(n, 1)
        return [data[start : start + step] for start in range(0, len(data), step)]
    if dtype.kind == "b" and np.frombuffer(data, np.uint8).max(initial=0) > 1:
        raise ValueError("a boolean that is neither 0 nor 1")
    values: list[Any] = np.frombuffer(data, dtype).tolist()
    return values

"""Row segments of the write-ahead log: the server's small appends, durable without Arrow.

Every step a server acknowledges is in the log first, and most of its appends hold one to a few
dozen rows. Made into an Arrow record batch, checked and serialized, such an append cost ~370 us
of CPU in a step's request path (pyarrow's fixed cost per call, with caches cold between
requests): more than half of the whole step. Written as one JSON line of values in column order
it costs ~20 us, and the shard is built from the rows in bulk when the segment rolls, off the
request path. Only tables whose columns are all scalars or short fixed-size lists of numbers take
this form (the Box observations of simulators); any other table, and every Arrow batch (uploads,
importers), is logged as Arrow (:mod:`pipeline.wal`).

A row segment is a text file: a header line (a JSON object with the table's Arrow schema as the
base64 of its IPC message), then one line per append, a JSON array of rows, each an array of
its values in schema order (timestamps as integer microseconds since the epoch, UTC; fixed-size
lists as the base64 of their little-endian bytes; JSON-text columns as strings). Both carry each
value exactly (Python's float repr round-trips), and a line is written with one ``write`` loop,
so a torn tail is an incomplete last line, dropped. ``docs/format.md`` section 8 is the spec.
"""

from __future__ import annotations

import base64
import binascii
import json
import operator
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.checks import json_text
from pipeline.wal import Segment

MAX_LIST = 64  # values in a fixed-size list column: beyond it, Arrow's cost per row wins
_HEADER = "rlpipe-rows"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def fits(table_schema: pa.Schema) -> bool:
    """Whether every column is a scalar or a fixed-size list of at most ``MAX_LIST`` numbers."""
    return all(_fits(field.type) for field in table_schema)


def _fits(kind: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(kind):
        value = kind.value_type
        return kind.list_size <= MAX_LIST and (pa.types.is_integer(value) or
                                               pa.types.is_floating(value))  # fmt: skip
    return any(test(kind) for test in (pa.types.is_integer, pa.types.is_floating,
                                       pa.types.is_boolean, pa.types.is_string,
                                       pa.types.is_timestamp))  # fmt: skip


class RowEncoder:
    """Rows of one table (mappings by column name) as value lists and one log line.

    The checks are those of the writer's validated appends: no null where the schema allows
    none, no NaN or infinity in a float column (JSON refuses them), JSON text that parses.
    """

    def __init__(self, table_schema: pa.Schema) -> None:
        self.names = table_schema.names
        # the non-null scalars (a missing list fails its packing): one tuple, even for one
        lists = pa.types.is_fixed_size_list
        required = [i for i, field in enumerate(table_schema)
                    if not field.nullable and not lists(field.type)]  # fmt: skip
        self._required = operator.itemgetter(*required, *required[:1])
        self._texts = [i for i, name in enumerate(self.names) if name in ("info", "reset_options")]
        self._times = [i for i, field in enumerate(table_schema)
                       if pa.types.is_timestamp(field.type)]  # fmt: skip
        self._lists = [(i, _dtype(field.type), field.type.list_size)
                       for i, field in enumerate(table_schema)
                       if pa.types.is_fixed_size_list(field.type)]  # fmt: skip
        self.logged_at = self.names.index("logged_at")

    def encode(self, rows: Sequence[Mapping[str, Any]], now: int) -> tuple[list[list[Any]], bytes]:
        """(values of each row, the line); ``now`` (microseconds) stamps rows without
        ``logged_at``.

        Raises:
            ValueError, TypeError: a value the checks refuse or JSON cannot carry; the caller
                then takes a path whose error names the row and field.
        """
        values, lines = [], []
        for row in rows:
            value: list[Any] = list(map(row.get, self.names))
            if value[self.logged_at] is None:
                value[self.logged_at] = now
            for i in self._times:
                if isinstance(value[i], datetime):
                    value[i] = micros(value[i])
            for i in self._texts:
                value[i] = json_text(value[i])
            if None in self._required(value):
                raise ValueError("a required value is missing")
            values.append(value)
            line = value.copy()  # lists as the bytes of their values: a float's repr costs ~1 us
            for i, dtype, size in self._lists:
                line[i] = _packed(value[i], dtype, size)
            lines.append(line)
        text = json.dumps(lines, allow_nan=False, default=_plain, separators=(",", ":"))
        return values, (text + "\n").encode()


def _dtype(kind: pa.DataType) -> np.dtype[Any]:
    """The little-endian numpy type of a fixed-size list's values, as the log stores them."""
    return np.dtype(kind.value_type.to_pandas_dtype()).newbyteorder("<")


def _packed(value: Any, dtype: np.dtype[Any], size: int) -> str:
    array = np.asarray(value, dtype)
    if array.size != size:
        raise ValueError(f"expected {size} values, got {array.size}")
    return binascii.b2a_base64(array.tobytes(), newline=False).decode("ascii")


def micros(moment: datetime) -> int:
    """A timestamp as integer microseconds since the epoch (exact, unlike ``timestamp()``)."""
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


class RowSegment(Segment):
    """A log segment of row lines; its shard is built from the rows kept in memory."""

    def __init__(self, path: Path, table_schema: pa.Schema, seq: int) -> None:
        schema_text = base64.b64encode(table_schema.serialize().to_pybytes()).decode()
        header = json.dumps({"format": _HEADER, "schema": schema_text}) + "\n"
        super().__init__(path, table_schema, seq, header.encode())
        self._values: list[list[Any]] = []

    def write_rows(self, values: list[list[Any]], line: bytes) -> int:
        """Write one append's line (it survives whole or not at all); returns its number."""
        with self._write_lock:
            number = self.write_message(line)
            self._values += values
            self.rows += len(values)
            self.bytes += len(line)
        return number

    @property
    def batches(self) -> list[pa.RecordBatch]:
        with self._write_lock:
            values = list(self._values)
        return [to_batch(self.schema, values)] if values else []


def to_batch(table_schema: pa.Schema, values: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Rows of values in schema order as one batch of the table.

    Raises:
        pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError: a value of the wrong type.
    """
    columns = list(zip(*values, strict=True))
    arrays = [_column(field.type, column) for field, column in zip(table_schema, columns,
                                                                   strict=True)]  # fmt: skip
    return pa.RecordBatch.from_arrays(arrays, schema=table_schema)


def _column(kind: pa.DataType, column: Sequence[Any]) -> pa.Array:
    if pa.types.is_fixed_size_list(kind):  # arrays or lists in memory, packed text in the log
        dtype = _dtype(kind)
        unpacked = [np.frombuffer(binascii.a2b_base64(value), dtype) if isinstance(value, str)
                    else value for value in column]  # fmt: skip
        flat = np.asarray(unpacked, dtype)
        if flat.shape != (len(column), kind.list_size):
            raise ValueError(f"expected lists of {kind.list_size} values, got shape {flat.shape}")
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), kind.list_size)
    return pa.array(column, type=kind)


def read_rows(path: Path) -> tuple[pa.Schema | None, list[pa.RecordBatch]]:
    """Every complete append of a row segment, dropping a torn tail; (None, []) if the header
    is torn."""
    lines = path.read_bytes().split(b"\n")
    try:
        header = json.loads(lines[0]) if len(lines) > 1 else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != _HEADER:
        return None, []
    table_schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(header["schema"])))
    values: list[Any] = []
    for line in lines[1:-1]:  # the last piece follows the last newline: empty, or torn
        try:
            values += json.loads(line)
        except json.JSONDecodeError:
            break  # cannot happen before the last line, which one write made whole or not
    return table_schema, [to_batch(table_schema, values)] if values else []

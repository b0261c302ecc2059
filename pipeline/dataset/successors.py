"""Each observation stored once: ``next_observation`` left null where the next row holds it.

A step's ``next_observation`` is the ``observation`` of the same agent's next step: row
``(episode_id, agent_id, t + 1)``. A writer stores it null wherever that row is in the same data
file and its ``observation`` is equal byte for byte, so only an episode's last row, and a row
whose next step was written to a later file, carry it (``docs/format.md``, section 4). A reader
restores it from the file it reads before anything else looks at the rows. For 84x84x3 frames
this halves the bytes of a step; for CartPole it saves 16 of ~30 bytes a step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import DatasetError

NEXT = "next_observation"
KEYS = ("episode_id", "agent_id", "t")
NEEDS = (*KEYS, "observation")  # the columns restoring NEXT reads besides it
# rlpipe leaves NEXT null only for observations of this many bytes or more: for CartPole's 16 it
# would save 16 of ~30 bytes a step, and cost reading whole files and restoring (the reader read
# 0.33x as fast as a raw scan, against 0.7 wanted)
OMIT_FROM_BYTES = 256


def omitted(observation: pa.DataType) -> bool:
    """Whether rlpipe writes ``next_observation`` null where it can, for this observation type."""
    return _row_bytes(observation) >= OMIT_FROM_BYTES


def _row_bytes(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return sum(_row_bytes(field.type) for field in kind)
    if pa.types.is_fixed_size_list(kind):
        return kind.list_size * _row_bytes(kind.value_type)
    return max(1, kind.bit_width // 8) if kind.bit_width else 0


def successors(data: pa.Table | pa.RecordBatch) -> np.ndarray:
    """For each row, the index of the row ``(episode_id, agent_id, t + 1)`` in ``data``, or -1.
    With several such rows (a retried upload stored twice), any one of them."""
    rows = data.num_rows
    episodes, agents = (_codes(data.column(name)) for name in KEYS[:2])
    t = _numpy(data.column("t")).astype(np.int64, copy=False)
    key = episodes * (int(agents.max(initial=0)) + 1) + agents
    order = np.lexsort((t, key))
    sorted_key, sorted_t = key[order], t[order]
    follows = (sorted_key[1:] == sorted_key[:-1]) & (sorted_t[1:] == sorted_t[:-1] + 1)
    found = np.full(rows, -1, np.int64)
    found[order[:-1][follows]] = order[1:][follows]
    return found


def omit(data: pa.Table) -> pa.Table:
    """``data`` (rows of one file, in the table's own types) with ``next_observation`` null
    where the successor row holds the same values as its ``observation``. Chunk by chunk: no
    frame is copied (a file's rows arrive as the log's batches, one chunk each)."""
    if (
        NEXT not in data.column_names
        or not data.num_rows
        or not omitted(data.schema.field(NEXT).type)
    ):
        return data
    found = successors(data)
    column = data.column(NEXT)
    observed = [_byte_rows(chunk) for chunk in data.column("observation").chunks]
    starts = np.cumsum([0, *(len(chunk) for chunk in column.chunks)])
    chunks = []
    for index, chunk in enumerate(column.chunks):
        mine = found[starts[index] : starts[index + 1]]
        same = np.zeros(len(chunk), bool)
        following = _byte_rows(chunk)
        holders = np.searchsorted(starts, mine, side="right") - 1  # the chunk of each successor
        for holder in np.unique(holders[mine >= 0]):
            rows = np.flatnonzero((mine >= 0) & (holders == holder))
            there = mine[rows] - starts[holder]
            same[rows] = _equal_rows(following, rows, observed[holder], there)
        chunks.append(_with_nulls(chunk, same | _array_nulls(chunk)))
    index = data.schema.get_field_index(NEXT)
    field = data.schema.field(index).with_nullable(True)
    return data.set_column(index, field, pa.chunked_array(chunks, field.type))


def _equal_rows(a: np.ndarray, rows: np.ndarray, b: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Whether ``a[rows[i]]`` equals ``b[others[i]]``, a MiB of rows at a time."""
    equal = np.zeros(len(rows), bool)
    width = a.shape[1]
    wide = next(
        kind for kind in (np.uint64, np.uint32, np.uint16, np.uint8) if width % kind().itemsize == 0
    )
    a, b = a.view(wide), b.view(wide)  # a frame's 21,168 bytes as 2,646 words: 5x faster
    step = max(1, 2**20 // max(1, width))
    for start in range(0, len(rows), step):
        part = slice(start, start + step)
        equal[part] = (a[rows[part]] == b[others[part]]).all(axis=1)
    return equal


def fill(data: pa.Table | pa.RecordBatch, where: str) -> Any:
    """``data`` with every null ``next_observation`` taken from its successor row's
    ``observation`` (:data:`NEEDS` must be among its columns).

    Raises:
        DatasetError: a null ``next_observation`` whose successor is not in ``data``.
    """
    if NEXT not in data.schema.names:
        return data
    column = _array(data.column(NEXT))
    if not column.null_count:
        return data
    missing = np.flatnonzero(_array_nulls(column))
    found = successors(data)[missing]
    if (found < 0).any():
        row = int(missing[int(np.argmax(found < 0))])
        raise DatasetError(
            f"{where}: row {row} has no next_observation, and the row of its next step "
            "(same episode_id and agent_id, t + 1) that holds it is not in the same file"
        )
    rows = data.num_rows
    index = np.arange(rows, dtype=np.int64)
    index[missing] = rows + found
    both = pa.concat_arrays([column, _array(data.column("observation"))])
    position = data.schema.get_field_index(NEXT)
    field = data.schema.field(position)
    return data.set_column(position, field, both.take(pa.array(index)))


def _array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _numpy(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return _array(column).to_numpy(zero_copy_only=False)


def _codes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """An id column as integer codes, equal ids equal codes."""
    array = _array(column)
    if not pa.types.is_dictionary(array.type):
        return _numpy(array.dictionary_encode().indices).astype(np.int64)
    distinct = _numpy(array.dictionary.dictionary_encode().indices)  # a dictionary may repeat
    return distinct[_numpy(array.indices)].astype(np.int64)


def _array_nulls(array: pa.Array) -> np.ndarray:
    if not array.null_count:
        return np.zeros(len(array), bool)
    return array.is_null().to_numpy(zero_copy_only=False)


def _with_nulls(array: pa.Array, nulls: np.ndarray) -> pa.Array:
    """``array`` with the rows of ``nulls`` null, its values kept (null slots' bytes are not
    written to Parquet)."""
    mask = pa.array(nulls)
    if pa.types.is_fixed_size_list(array.type):
        values = array.values.slice(array.offset * array.type.list_size)
        return pa.FixedSizeListArray.from_arrays(values, array.type.list_size, mask=mask)
    if pa.types.is_struct(array.type):
        return pa.StructArray.from_arrays(array.flatten(), fields=list(array.type), mask=mask)
    return pa.array(array.to_numpy(zero_copy_only=False), array.type, mask=nulls)


def _byte_rows(array: pa.Array) -> np.ndarray:
    """Each row's values as bytes, one row of a 2-d uint8 array per row (bitwise equality: -0.0
    and 0.0 differ, as they must to restore values exactly)."""
    rows = len(array)
    if pa.types.is_struct(array.type):
        parts = [_byte_rows(child) for child in array.flatten()]
        return np.hstack(parts) if parts else np.zeros((rows, 0), np.uint8)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        flat = array.values.slice(array.offset * size, rows * size)
        values = flat.to_numpy(zero_copy_only=False).reshape(rows, size)
    else:
        values = array.to_numpy(zero_copy_only=False).reshape(rows, 1)
    return np.ascontiguousarray(values).view(np.uint8).reshape(rows, -1)

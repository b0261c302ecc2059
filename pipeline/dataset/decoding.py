"""Step-table columns as the arrays of a :class:`~pipeline.dataset.batch.Batch`.

Observations and actions decode through their spaces (``codec``); the other columns are plain:
ids, counters, flags, rewards. Numeric arrays come out zero-copy where Arrow allows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.dataset.batch import FIELD_OF_COLUMN, Batch
from pipeline.format import codec


def to_batch(
    data: pa.RecordBatch | pa.Table,
    observation_space: gym.Space[Any],
    action_space: gym.Space[Any],
    owned: bool = False,
) -> Batch:
    """Arrow rows of the step table as a Batch; columns it does not know are left out.

    Zero-copy arrays are read-only, because they are Arrow's memory, and ``Batch.to_torch``
    copies them. With ``owned`` the caller vouches that nobody else holds ``data`` (a chunk it
    just decoded, or the result of its own ``take``): numeric arrays are then writable views of
    its mutable buffers, and ``to_torch`` shares them instead of copying (measured on CartPole
    chunks: the copies were the largest cost of a torch batch).
    """
    keep = _writable if owned else lambda value, column: value
    fields: dict[str, Any] = {}
    for name in data.schema.names:
        if name not in FIELD_OF_COLUMN:
            continue
        column = data.column(name)
        space = action_space if name == "action" else observation_space
        if name in ("observation", "next_observation", "action"):
            fields[FIELD_OF_COLUMN[name]] = keep(codec.from_arrow(space, column), column)
        else:
            fields[FIELD_OF_COLUMN[name]] = _to_numpy(column, keep)
    return Batch(**fields)


def _to_numpy(column: pa.Array | pa.ChunkedArray, keep: Callable[..., Any]) -> np.ndarray:
    """Plain columns as numpy; nulls become NaN (action_logp) or -1 (policy_version)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):  # ids are read dictionary-encoded: decode by index
        values = column.dictionary.to_numpy(zero_copy_only=False)
        if len(values) == 1 and not column.null_count:  # one agent, say: share one object
            return np.broadcast_to(values, (len(column),))
        decoded: np.ndarray = values[column.indices.to_numpy(zero_copy_only=False)]
        return decoded
    numeric = pa.types.is_integer(column.type) or pa.types.is_floating(column.type)
    if column.null_count and numeric:
        fill = -1 if pa.types.is_integer(column.type) else float("nan")
        if column.null_count == len(column):  # rows logged without a policy: nothing to read
            return np.full(len(column), fill, dtype=column.type.to_pandas_dtype())
        column = pc.fill_null(column, fill)
    return keep(column.to_numpy(zero_copy_only=False), column)


def _writable(value: Any, column: pa.Array | pa.ChunkedArray) -> Any:
    """The same memory as a writable array, when it is a mutable Arrow buffer without nulls
    (immutable buffers, memory-mapped files say, stay read-only)."""
    if not isinstance(value, np.ndarray) or value.flags.writeable or value.dtype.kind not in "iuf":
        return value
    if isinstance(column, pa.ChunkedArray):
        if column.num_chunks != 1:
            return value
        column = column.chunk(0)
    while pa.types.is_fixed_size_list(column.type) and not column.null_count:
        column = column.flatten()
    buffers = column.buffers()
    if column.null_count or len(buffers) != 2 or buffers[1] is None or not buffers[1].is_mutable:
        return value
    offset = column.offset * value.dtype.itemsize
    view = np.frombuffer(buffers[1], dtype=value.dtype, count=value.size, offset=offset)
    return view.reshape(value.shape) if view.ctypes.data == value.ctypes.data else value

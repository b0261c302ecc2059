"""Reset seeds as gymnasium takes them, and as the ``seed`` column stores them.

gymnasium seeds are integers in [0, 2**64); Minari draws its seeds from the whole 64 bits. The
column is int64 (Delta has no unsigned type), so a seed past 2**63 - 1 is stored as the int64 of
the same 64 bits: negative. No seed ever passes through float64, which rounds past 2**53.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import SchemaError

END = 2**64  # gymnasium seeds are ints >= 0; Minari draws them from the whole 64 bits


def to_storage(seed: int) -> int:
    """The int64 the ``seed`` column stores for a seed in [0, 2**64): itself below 2**63, else
    the int64 of the same 64 bits (``seed - 2**64``, negative), as uint64 columns are stored."""
    return seed - END if seed >= END // 2 else seed


def from_storage(value: int | None) -> int | None:
    """The seed a ``seed`` column value stands for: negative values are seeds past 2**63 - 1."""
    return None if value is None else value + END if value < 0 else value


EXPECTED = "an integer seed in [0, 2**64) or null"


def checked(value: Any, name: str = "seed") -> int | None:
    """A reset seed as gymnasium takes it (an int in [0, 2**64), numpy's too), or None.

    Raises:
        SchemaError: for floats, booleans, negative seeds and seeds of 2**64 or more.
    """
    if isinstance(value, np.integer):
        value = int(value)
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < END
    ):
        raise SchemaError.single(name, EXPECTED, repr(value))
    return value


def to_arrow(field: pa.Field, values: Any) -> pa.Array:
    """Seeds as Python ints in [0, 2**64), never through float64 (which rounds past 2**53).

    An Arrow int64 column is the column's own type, so its values are taken as stored (a batch
    that :func:`episodes_from_columns` built is appended as it is); any other Arrow type, numpy
    arrays and lists hold seeds.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array) and pa.types.is_int64(values.type):
        return values
    if isinstance(values, pa.Array):
        values = values.to_pylist()
    elif isinstance(values, np.ndarray):
        values = values.tolist()
    stored: list[int | None] = []
    for row, value in enumerate(values):
        try:
            seed = checked(value, field.name)
        except SchemaError:
            shown = repr(value) if not isinstance(value, int) else str(value)
            raise SchemaError.single(field.name, EXPECTED, shown, row) from None
        stored.append(None if seed is None else to_storage(seed))
    return pa.array(stored, type=pa.int64())

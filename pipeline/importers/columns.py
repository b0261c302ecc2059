"""Source columns as numpy arrays, with integers kept exact.

numpy rounds integers it cannot fit one integer dtype to: ``np.asarray([2**63, 1])`` is float64, and
an int64 part meets a uint64 part in float64. Seeds (up to 2**64 - 1) and episode keys must not be
rounded, so such columns become arrays of Python ints.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import DatasetError


def exact_array(values: Any) -> np.ndarray:
    """``np.asarray`` of parsed values, but integers past int64's range stay exact: numpy makes
    ``[2**63, 1]`` a float64 array (rounding both), so such columns become Python ints."""
    array = np.asarray(values)
    if array.dtype.kind == "f" and isinstance(values, list) and _all_ints(values):
        exact = np.empty(len(values), dtype=object)
        exact[:] = values
        return exact
    return array


def concat_exact(parts: list[np.ndarray]) -> np.ndarray:
    """``np.concatenate``, except that int64 and uint64 parts (which numpy meets in float64)
    meet as Python ints."""
    kinds = {part.dtype.kind for part in parts}
    if len(kinds) > 1 and kinds <= {"i", "u", "O"}:
        return np.concatenate([part.astype(object) for part in parts])
    return np.concatenate(parts)


def _all_ints(values: list[Any]) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def arrow_to_numpy(column: pa.ChunkedArray, where: str) -> np.ndarray:
    """A column as numpy: scalars as a vector, list columns (variable-length by type, like Ray
    Data's ``list<double>``) as a matrix when every row has the same length."""
    array = column.combine_chunks()
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        lengths = np.diff(array.offsets.to_numpy())
        if array.null_count or (len(lengths) and (lengths != lengths[0]).any()):
            raise DatasetError(f"{where}: rows of different lengths; expected one shape per row")
        width = int(lengths[0]) if len(lengths) else 0
        values = array.flatten().to_numpy(zero_copy_only=False)
        return values.reshape(len(array), width)
    if pa.types.is_fixed_size_list(array.type):
        return array.flatten().to_numpy(zero_copy_only=False).reshape(len(array), -1)
    if array.null_count:
        raise DatasetError(f"{where}: {array.null_count} null values")
    return array.to_numpy(zero_copy_only=False)

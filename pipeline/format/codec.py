"""Values in and out of Arrow columns: batches of a space's samples, validated, and back.

A batch is what a vectorized env returns: arrays with the row axis first, dicts and tuples of them
for Dict and Tuple. Encoding casts to the space's dtype and refuses, all at once, what cannot be
stored faithfully; decoding is zero-copy where Arrow allows. One ``functools.singledispatch``
function per operation, one implementation per space type, as in :mod:`pipeline.format.spaces`.
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from pipeline.errors import Problem, SchemaError
from pipeline.format.spaces import (
    MISSING,
    assemble,
    space_to_arrow,
    split_value,
    subspaces,
    unsupported,
)

_Problems = list[Problem]


# --- Batches to Arrow --------------------------------------------------------------------------


def to_arrow(space: gym.Space[Any], values: Any, field: str = "value") -> pa.Array:
    """A batch (row axis first; dicts and tuples of batches for Dict and Tuple) as one column.

    Values are cast to the space's dtype, and what cannot be stored faithfully is refused: wrong
    shapes, non-numbers, NaN and inf, integers outside a discrete space or the dtype, fractions
    for integer spaces, missing or extra Dict keys. Box bounds are deliberately not enforced: real
    environments leave them (MuJoCo velocities) and Gaussian policies sample past them before
    clipping, and refusing those rows would lose the experience that explains a bad run.

    Raises:
        SchemaError: listing every problem at once; a problem's field is the dotted path to the
            bad part (``observation.position``), its row the first offending row.
    """
    problems: _Problems = []
    array = _encode_part(space, values, field, problems)
    if array is None or problems:
        raise SchemaError(problems)
    return array


def to_arrow_rows(space: gym.Space[Any], rows: Sequence[Any], field: str = "value") -> pa.Array:
    """Like :func:`to_arrow` for a list of single samples (e.g. decoded from JSON)."""
    problems: _Problems = []
    array = _encode_part(space, _stack(space, rows, field, problems), field, problems)
    if array is None or problems:
        raise SchemaError(problems)
    return array


@functools.singledispatch
def _stack(space: gym.Space[Any], rows: Sequence[Any], path: str, problems: _Problems) -> Any:
    raise unsupported(space)


@_stack.register(Box)
@_stack.register(Discrete)
@_stack.register(MultiDiscrete)
@_stack.register(MultiBinary)
def _stack_leaf(space: Any, rows: Sequence[Any], path: str, problems: _Problems) -> Any:
    if not len(rows):
        return np.empty((0, *space.shape), space.dtype)
    try:
        stacked = np.asarray(rows)
        if stacked.dtype.kind in "biuf" and stacked.shape[1:] == space.shape:
            return stacked
    except (ValueError, TypeError):
        pass
    for i, row in enumerate(rows):  # only to name the first bad row
        found: _Problems = []
        if _numeric(row, space, path, found, batch=False) is None:
            problems.append(dataclasses.replace(found[0], row=i))
            return MISSING
    problems.append(Problem(path, _per_row(space), "rows that do not stack into one array"))
    return MISSING


@_stack.register(Dict)
@_stack.register(Tuple)
def _stack_container(
    space: Dict | Tuple, rows: Sequence[Any], path: str, problems: _Problems
) -> Any:
    children = subspaces(space)
    names = [name for name, _ in children]
    first: dict[str, Problem] = {}  # one problem per field: its first row
    for i, row in enumerate(rows):
        for problem in _container_problems(names, space, row, path, i):
            first.setdefault(problem.field, problem)
    problems.extend(first.values())
    if path in first:
        return MISSING
    keys = names if isinstance(space, Dict) else range(len(names))
    return assemble(
        space,
        [
            MISSING
            if f"{path}.{name}" in first
            else _stack(sub, [row[key] for row in rows], f"{path}.{name}", problems)
            for (name, sub), key in zip(children, keys, strict=True)
        ],
    )


def _encode_part(space: gym.Space[Any], values: Any, path: str, problems: _Problems) -> Any:
    return None if values is MISSING else _encode(space, values, path, problems)


@functools.singledispatch
def _encode(space: gym.Space[Any], values: Any, path: str, problems: _Problems) -> Any:
    raise unsupported(space)


@_encode.register(Box)
def _encode_box(space: Box, values: Any, path: str, problems: _Problems) -> Any:
    array = _numeric(values, space, path, problems)
    if array is not None and space.dtype.kind == "f":
        array = _finite(array, space.dtype, path, problems)
    elif array is not None and not np.can_cast(array.dtype, space.dtype):  # would wrap or truncate
        dtype: Any = space.dtype  # an integer or bool dtype here
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        lo, hi = (int(info.min), int(info.max)) if info else (0, 1)
        expected = f"integers in [{lo}, {hi}] for {space.dtype}"
        array = _integers(array, lo, hi, space.dtype, path, problems, lambda _: expected)
    return None if array is None else _leaf_array(array.astype(space.dtype, copy=False), space)


@_encode.register(Discrete)
@_encode.register(MultiDiscrete)
def _encode_discrete(
    space: Discrete | MultiDiscrete, values: Any, path: str, problems: _Problems
) -> Any:
    start = np.asarray(space.start, np.int64)
    end = start + np.asarray(space.n if isinstance(space, Discrete) else space.nvec, np.int64)

    def expected(at: tuple[int, ...]) -> str:
        index = f" at index {at[0] if len(at) == 1 else at}" if at else ""
        return f"an integer in [{start[at]}, {end[at]}){index}"

    array = _numeric(values, space, path, problems)
    if array is not None:
        array = _integers(array, start, end - 1, np.int64, path, problems, expected)
    return None if array is None else _leaf_array(array, space)


@_encode.register(MultiBinary)
def _encode_multi_binary(space: MultiBinary, values: Any, path: str, problems: _Problems) -> Any:
    array = _numeric(values, space, path, problems)
    if array is not None:
        array = _integers(array, 0, 1, np.int8, path, problems, lambda _: "0 or 1")
    return None if array is None else _leaf_array(array, space)


@_encode.register(Dict)
@_encode.register(Tuple)
def _encode_container(space: Dict | Tuple, values: Any, path: str, problems: _Problems) -> Any:
    found = _container_problems([name for name, _ in subspaces(space)], space, values, path, None)
    problems.extend(found)
    if any(problem.field == path for problem in found):
        return None
    children = subspaces(space)
    parts = zip(children, split_value(space, values), strict=True)
    arrays = [_encode_part(sub, part, f"{path}.{name}", problems) for (name, sub), part in parts]
    if any(array is None for array in arrays):
        return None
    lengths = {name: len(array) for (name, _), array in zip(children, arrays, strict=True)}
    if len(set(lengths.values())) > 1:
        problems.append(Problem(path, "the same number of rows in every entry", str(lengths)))
        return None
    return pa.StructArray.from_arrays(arrays, fields=list(space_to_arrow(space)))


def _container_problems(
    names: list[str], space: Dict | Tuple, value: Any, path: str, row: int | None
) -> _Problems:
    """Why ``value`` is not a mapping with the Dict's keys, or a sequence as long as the Tuple."""
    if isinstance(space, Tuple):
        if isinstance(value, list | tuple) and len(value) == len(names):
            return []
        return [Problem(path, f"a list or tuple of {len(names)} entries", reprlib.repr(value), row)]
    if not isinstance(value, Mapping):
        return [Problem(path, f"a mapping with keys {names}", reprlib.repr(value), row)]
    if value.keys() == set(names):
        return []
    every, known = "a value for every key of the Dict space", f"one of the keys {names}"
    missing = [
        Problem(f"{path}.{key}", every, "no such key", row) for key in names if key not in value
    ]
    extra = [
        Problem(f"{path}.{key}", known, "an unknown key", row) for key in value if key not in names
    ]
    return missing + extra


def _per_row(space: Any) -> str:
    return f"{space.dtype} of shape {space.shape} per row"


def _numeric(values: Any, space: Any, path: str, problems: _Problems, batch: bool = True) -> Any:
    """``values`` as an array of numbers shaped like the space (after a row axis if ``batch``)."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):  # ragged nested lists
        problems.append(Problem(path, _per_row(space), "nested lists of different lengths"))
        return None
    if array.dtype.kind not in "biuf":
        got = f"dtype {array.dtype}" if batch else reprlib.repr(values)
    elif batch and array.ndim == 0:
        got = "a single value (no batch axis)"
    elif array.shape[batch:] != space.shape:
        got = f"shape {array.shape[batch:]}"
    else:
        return array
    problems.append(Problem(path, _per_row(space), got))
    return None


def _finite(array: np.ndarray, dtype: Any, path: str, problems: _Problems) -> Any:
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported below
        cast = array.astype(dtype, copy=False)
    finite = np.isfinite(cast)
    if finite.all():
        return cast
    at = np.unravel_index(int(np.argmin(finite)), finite.shape)
    got = str(array[at]) if not np.isfinite(array[at]) else f"{array[at]}, too large for {dtype}"
    problems.append(Problem(path, "finite values", got, int(at[0])))
    return None


def _integers(
    array: np.ndarray,
    lo: Any,
    hi: Any,
    dtype: Any,
    path: str,
    problems: _Problems,
    expected: Callable[[tuple[int, ...]], str],
) -> Any:
    """``array`` cast to ``dtype`` if every value is an integer in [lo, hi] (per element)."""
    floats = array.dtype.kind == "f"
    if array.size and (floats or np.any(array.min(0) < lo) or np.any(array.max(0) > hi)):
        bad = (array < lo) | (array > hi)
        if floats:
            bad |= array != np.floor(array)  # also true for NaN
        if bad.any():
            at = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
            problems.append(Problem(path, expected(at[1:]), str(array[at]), int(at[0])))
            return None
    return array.astype(dtype, copy=False)


def float_box_rows(space: gym.Space[Any], rows: Sequence[Any]) -> np.ndarray | None:
    """Rows of a float Box as one batch in the space's dtype, checked in one numpy pass; None
    when they are not plainly that, and :func:`to_arrow_rows` must name the problem.

    The server and the client check every step's observation; per-row dispatch through
    :func:`to_arrow_rows` cost tens of microseconds a step, this costs a few.
    """
    if not isinstance(space, Box) or space.dtype.kind != "f":
        return None
    problems: _Problems = []
    batch = _numeric(rows, space, "", problems)
    return None if batch is None else _finite(batch, space.dtype, "", problems)


def _leaf_array(array: np.ndarray, space: Any) -> pa.Array:
    arrow = space_to_arrow(space)
    if not pa.types.is_fixed_size_list(arrow):
        return pa.array(array)
    flat = pa.array(np.ascontiguousarray(array).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, arrow.list_size)


# --- Arrow to batches --------------------------------------------------------------------------


def from_arrow(
    space: gym.Space[Any], array: pa.Array | pa.ChunkedArray, field: str = "value"
) -> Any:
    """The batch a column holds: the inverse of :func:`to_arrow`.

    Arrays come back in the space's dtype, shaped (N, *shape), without a copy where Arrow allows
    (numeric columns in one chunk), which also makes them read-only.

    Raises:
        SchemaError: if the column's type does not belong to the space, or it holds nulls.
    """
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    problems: _Problems = []
    batch = _decode(space, array, field, problems)
    if problems:
        raise SchemaError(problems)
    return batch


@functools.singledispatch
def _decode(space: gym.Space[Any], array: pa.Array, path: str, problems: _Problems) -> Any:
    raise unsupported(space)


@_decode.register(Box)
@_decode.register(Discrete)
@_decode.register(MultiDiscrete)
@_decode.register(MultiBinary)
def _decode_leaf(space: Any, array: pa.Array, path: str, problems: _Problems) -> Any:
    expected = space_to_arrow(space)
    if not array.type.equals(expected):
        problems.append(Problem(path, f"Arrow type {expected}", str(array.type)))
        return None
    if array.null_count:
        problems.append(Problem(path, "a value in every row", "null", _first_null(array)))
        return None
    values = array.flatten() if pa.types.is_fixed_size_list(expected) else array
    if values.null_count:
        row = _first_null(values) // expected.list_size
        problems.append(Problem(path, "a value in every row", "a null element", row))
        return None
    flat = values.to_numpy(zero_copy_only=False)
    return flat.reshape((len(array), *space.shape)).astype(space.dtype, copy=False)


@_decode.register(Dict)
@_decode.register(Tuple)
def _decode_container(space: Dict | Tuple, array: pa.Array, path: str, problems: _Problems) -> Any:
    names = [name for name, _ in subspaces(space)]
    if not pa.types.is_struct(array.type) or [f.name for f in array.type] != names:
        problems.append(Problem(path, f"an Arrow struct with fields {names}", str(array.type)))
        return None
    if array.null_count:
        problems.append(Problem(path, "a value in every row", "null", _first_null(array)))
        return None
    return assemble(
        space,
        [
            _decode(sub, array.field(i), f"{path}.{name}", problems)
            for i, (name, sub) in enumerate(subspaces(space))
        ],
    )


def _first_null(array: pa.Array) -> int:
    return int(pc.index(array.is_null(), True).as_py())


# --- Arrow to JSON -----------------------------------------------------------------------------


def to_json_rows(space: gym.Space[Any], array: pa.Array) -> list[Any]:
    """A column's values row by row as a request carries them (``docs/protocol.md``): a Tuple's
    as a sequence. Arrow holds a Tuple as a struct of fields "0", "1", ..., which ``to_pylist``
    makes an object that no call takes back."""
    rows = array.to_pylist()
    if not isinstance(space, Dict | Tuple):
        return rows
    return [_json_value(space, row) for row in rows]


def _json_value(space: gym.Space[Any], value: Any) -> Any:
    if not isinstance(space, Dict | Tuple):
        return value
    return assemble(space, [_json_value(part, value[name]) for name, part in subspaces(space)])

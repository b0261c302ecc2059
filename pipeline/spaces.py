"""Gymnasium spaces as data: JSON documents, Arrow types, and batches in and out of Arrow.

A dataset must be readable without the code that wrote it, so every space is stored twice: as a
JSON document (manifest, field metadata) and as the Arrow type of its column. Each operation is
one ``functools.singledispatch`` function with one implementation per space type (as Minari's
``minari/serialization.py``). Columns::

    Box shape ()     scalar of the Box dtype        Discrete       int64
    Box otherwise    fixed_size_list<dtype>[prod]   MultiDiscrete  fixed_size_list<int64>[prod]
    Dict, Tuple      struct, a child per entry      MultiBinary    fixed_size_list<int8>[prod]

Lists hold each row flattened row-major; the shape rides in the field metadata. A batch is what a
vectorized env returns: arrays with the row axis first, dicts and tuples of them for Dict and Tuple.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from pipeline.errors import Problem, SchemaError, SpaceError

SUPPORTED = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")
META_SPACE = b"rlpipe.space"  # field metadata: the space_to_json document
META_SHAPE = b"rlpipe.shape"  # field metadata: the per-row shape of a list column
_FAILED: Any = object()  # part of a batch that already produced a Problem while stacking rows
_Problems = list[Problem]
_STRUCTS: dict[int, tuple[gym.Space[Any], pa.DataType]] = {}  # id(space) -> (space, struct type)


def _unsupported(space: object) -> SpaceError:
    return SpaceError(
        f"rlpipe cannot store a {type(space).__name__} space; "
        f"supported spaces are {', '.join(SUPPORTED)}"
    )


def _children(space: Dict | Tuple) -> list[tuple[str, gym.Space[Any]]]:
    """(column name, subspace) in order; Tuple entries are named "0", "1", ...

    Dict keys must be strings because they become JSON keys and Arrow field names, and an empty
    container has no Parquet form (a struct needs at least one child).
    """
    if isinstance(space, Dict):
        pairs = list(space.spaces.items())
        if not all(isinstance(key, str) for key, _ in pairs):
            raise SpaceError(f"Dict space keys must be strings (they name columns): {space}")
    else:
        pairs = [(str(i), sub) for i, sub in enumerate(space.spaces)]
    if not pairs:
        raise SpaceError(f"an empty {type(space).__name__} space cannot be stored in Parquet")
    return pairs


def _assemble(space: Dict | Tuple, parts: list[Any]) -> Any:
    names = [name for name, _ in _children(space)]
    return dict(zip(names, parts, strict=True)) if isinstance(space, Dict) else tuple(parts)


def _parts(space: Dict | Tuple, value: Any) -> list[Any]:
    if isinstance(space, Tuple):
        return list(value)
    return [value.get(name, _FAILED) for name, _ in _children(space)]


# --- JSON documents --------------------------------------------------------------------------


@functools.singledispatch
def space_to_json(space: gym.Space[Any]) -> dict[str, Any]:
    """The space as a JSON-safe document, so a dataset describes itself without pickles.

    Raises:
        SpaceError: for a space type rlpipe cannot store.
    """
    raise _unsupported(space)


@space_to_json.register(Box)
def _box_to_json(space: Box) -> dict[str, Any]:
    low, high = _bounds_to_json(space.low), _bounds_to_json(space.high)
    return {"type": "Box", "shape": list(space.shape), "dtype": space.dtype.name, "low": low,
            "high": high}  # fmt: skip


@space_to_json.register(Discrete)
def _discrete_to_json(space: Discrete) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if space.dtype != np.int64:  # written only when not the default, to keep documents short
        doc["dtype"] = space.dtype.name
    return doc


@space_to_json.register(MultiDiscrete)
def _multi_discrete_to_json(space: MultiDiscrete) -> dict[str, Any]:
    return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist(),
            "dtype": space.dtype.name}  # fmt: skip


@space_to_json.register(MultiBinary)
def _multi_binary_to_json(space: MultiBinary) -> dict[str, Any]:
    # gymnasium tells MultiBinary(3) and MultiBinary([3]) apart, so the int form is kept
    return {"type": "MultiBinary", "n": space.n if isinstance(space.n, int) else list(space.n)}


@space_to_json.register(Dict)
@space_to_json.register(Tuple)
def _container_to_json(space: Dict | Tuple) -> dict[str, Any]:
    docs = {name: space_to_json(sub) for name, sub in _children(space)}
    return {"type": type(space).__name__,
            "spaces": docs if isinstance(space, Dict) else list(docs.values())}  # fmt: skip


def _bounds_to_json(bounds: np.ndarray) -> Any:
    """Bounds as nested lists; JSON has no infinity, so +/-inf become the strings "inf"/"-inf"."""
    if bounds.dtype.kind != "f" or np.isfinite(bounds).all():
        return bounds.tolist()
    table = bounds.astype(object)
    table[np.isposinf(bounds)] = "inf"
    table[np.isneginf(bounds)] = "-inf"
    return table.tolist()


def space_from_json(doc: Mapping[str, Any]) -> gym.Space[Any]:
    """Rebuild the space a :func:`space_to_json` document describes (equal to the original).

    Documents come from files that may be hand-edited or written by another version, so a bad
    part is named by its path (``$.spaces.position.low``) instead of failing inside gymnasium.

    Raises:
        SpaceError: naming where the document is malformed and how.
    """
    return _read(doc, "$")


def _read(doc: Any, where: str) -> gym.Space[Any]:
    if not isinstance(doc, Mapping):
        raise SpaceError(
            f"space document at {where}: expected a JSON object, got {reprlib.repr(doc)}"
        )
    kind = doc.get("type")
    if kind not in _READERS:
        raise SpaceError(f"space document at {where}: 'type' must be one of "
                         f"{', '.join(SUPPORTED)}, got {kind!r}")  # fmt: skip
    required, optional, read = _READERS[kind]
    wrong = [f"{kind} is missing '{key}'" for key in required if key not in doc]
    wrong += [f"{kind} has no key '{key}'" for key in doc if key not in (*required, *optional)]
    if wrong:
        raise SpaceError(f"space document at {where}: {'; '.join(wrong)}")
    try:
        return read(doc, where)
    except SpaceError:
        raise
    except (ValueError, TypeError, ArithmeticError) as error:  # gymnasium's own checks
        raise SpaceError(f"space document at {where}: not a valid {kind}: {error}") from error


def _read_box(doc: Mapping[str, Any], where: str) -> Box:
    dtype = np.dtype(doc["dtype"])
    low, high = (_bounds_from_json(doc[key], dtype, f"{where}.{key}") for key in ("low", "high"))
    return Box(low, high, tuple(_ints(doc["shape"], f"{where}.shape")), dtype)


def _read_discrete(doc: Mapping[str, Any], where: str) -> Discrete:
    start = _ints(doc.get("start", 0), f"{where}.start")
    return Discrete(_ints(doc["n"], f"{where}.n"), start=start, dtype=doc.get("dtype", "int64"))


def _read_multi_discrete(doc: Mapping[str, Any], where: str) -> MultiDiscrete:
    start = _ints(doc["start"], f"{where}.start") if "start" in doc else None
    nvec = _ints(doc["nvec"], f"{where}.nvec")
    return MultiDiscrete(nvec, dtype=doc.get("dtype", "int64"), start=start)


def _read_multi_binary(doc: Mapping[str, Any], where: str) -> MultiBinary:
    return MultiBinary(_ints(doc["n"], f"{where}.n"))


def _read_container(doc: Mapping[str, Any], where: str) -> Dict | Tuple:
    subs, is_dict = doc["spaces"], doc["type"] == "Dict"
    if not subs or not isinstance(subs, Mapping if is_dict else list):
        kind = "object" if is_dict else "list"
        raise SpaceError(f"space document at {where}.spaces: expected a non-empty JSON {kind}, "
                         f"got {reprlib.repr(subs)}")  # fmt: skip
    pairs = subs.items() if isinstance(subs, Mapping) else enumerate(subs)
    spaces = [(str(key), _read(sub, f"{where}.spaces.{key}")) for key, sub in pairs]
    # a list of pairs keeps the stored key order (gymnasium would sort a dict's keys)
    return Dict(spaces) if is_dict else Tuple([sub for _, sub in spaces])


_READERS: dict[Any, tuple[tuple[str, ...], tuple[str, ...], Callable[..., gym.Space[Any]]]] = {
    "Box": (("type", "shape", "dtype", "low", "high"), (), _read_box),
    "Discrete": (("type", "n"), ("start", "dtype"), _read_discrete),
    "MultiDiscrete": (("type", "nvec"), ("start", "dtype"), _read_multi_discrete),
    "MultiBinary": (("type", "n"), (), _read_multi_binary),
    "Dict": (("type", "spaces"), (), _read_container),
    "Tuple": (("type", "spaces"), (), _read_container),
}


def _ints(value: Any, where: str) -> Any:
    """``value`` if it is an integer or nested lists of them (gymnasium would truncate floats)."""
    items = np.asarray(value, dtype=object).reshape(-1)
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        raise SpaceError(f"space document at {where}: expected an integer or nested lists of "
                         f"integers, got {reprlib.repr(value)}")  # fmt: skip
    return value


def _bounds_from_json(value: Any, dtype: np.dtype[Any], where: str) -> np.ndarray:
    def decode(item: Any) -> Any:
        if isinstance(item, list):
            return [decode(x) for x in item]
        if item in ("inf", "-inf") or isinstance(item, int | float):
            return float(item) if isinstance(item, str) else item
        raise SpaceError(f"space document at {where}: expected numbers, 'inf' or '-inf', "
                         f"got {item!r}")  # fmt: skip

    decoded = decode(value)
    with np.errstate(all="raise"):
        return np.asarray(decoded, dtype=dtype)


# --- Arrow types and fields --------------------------------------------------------------------


@functools.singledispatch
def space_to_arrow(space: gym.Space[Any]) -> pa.DataType:
    """The Arrow type of a column holding one value of ``space`` per row (see module docstring).

    Raises:
        SpaceError: for a space type rlpipe cannot store.
    """
    raise _unsupported(space)


@space_to_arrow.register(Box)
def _box_arrow(space: Box) -> pa.DataType:
    value = pa.from_numpy_dtype(space.dtype)
    return value if space.shape == () else _list_type(value, space.shape)


space_to_arrow.register(Discrete, lambda space: pa.int64())
space_to_arrow.register(MultiDiscrete, lambda space: _list_type(pa.int64(), space.shape))
space_to_arrow.register(MultiBinary, lambda space: _list_type(pa.int8(), space.shape))


@space_to_arrow.register(Dict)
@space_to_arrow.register(Tuple)
def _container_arrow(space: Dict | Tuple) -> pa.DataType:
    # Cached by identity, as every batch needs it and its children's metadata spells out every
    # bound (an image Box's take milliseconds); holding the space keeps its id from being reused.
    cached = _STRUCTS.get(id(space))
    if cached is None or cached[0] is not space:
        if len(_STRUCTS) > 1000:  # a program makes few spaces; this only bounds a leak
            _STRUCTS.clear()
        fields = [space_field(name, sub) for name, sub in _children(space)]
        cached = _STRUCTS[id(space)] = (space, pa.struct(fields))
    return cached[1]


def _list_type(value_type: pa.DataType, shape: tuple[int, ...]) -> pa.DataType:
    if math.prod(shape) == 0:
        raise SpaceError(f"a space of shape {shape} holds no values; Arrow lists need at least one")
    return pa.list_(value_type, math.prod(shape))


def space_field(name: str, space: gym.Space[Any], nullable: bool = False) -> pa.Field:
    """An Arrow field for ``space`` that carries the space itself in its metadata.

    The metadata makes each Parquet file self-describing (it survives Parquet round trips, nested
    struct children included), so a reader can rebuild the space without the manifest.
    """
    metadata = {META_SPACE: json.dumps(space_to_json(space), separators=(",", ":")).encode()}
    if isinstance(space, Box | MultiDiscrete | MultiBinary):
        metadata[META_SHAPE] = json.dumps(list(space.shape)).encode()
    return pa.field(name, space_to_arrow(space), nullable=nullable, metadata=metadata)


def space_from_field(field: pa.Field) -> gym.Space[Any]:
    """The space :func:`space_field` stored in ``field``'s metadata.

    Raises:
        SpaceError: if the metadata is missing or malformed, or the field's type is not the
            space's Arrow type (the column would not decode).
    """
    raw = (field.metadata or {}).get(META_SPACE)
    if raw is None:
        raise SpaceError(f"field '{field.name}' has no {META_SPACE.decode()} metadata; "
                         "only fields made by space_field() carry a space")  # fmt: skip
    try:
        space = space_from_json(json.loads(raw))
    except json.JSONDecodeError as error:
        raise SpaceError(f"field '{field.name}': space metadata is not JSON: {error}") from error
    if field.type != space_to_arrow(space):
        raise SpaceError(f"field '{field.name}' has type {field.type}, but its space is stored "
                         f"as {space_to_arrow(space)}")  # fmt: skip
    return space


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
    """Like :func:`to_arrow` for a list of single samples (e.g. decoded from JSON).

    Raises:
        SchemaError: listing every problem, each with the first row it concerns.
    """
    problems: _Problems = []
    array = _encode_part(space, _stack(space, rows, field, problems), field, problems)
    if array is None or problems:
        raise SchemaError(problems)
    return array


@functools.singledispatch
def _stack(space: gym.Space[Any], rows: Sequence[Any], path: str, problems: _Problems) -> Any:
    raise _unsupported(space)


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
            return _FAILED
    problems.append(Problem(path, _per_row(space), "rows that do not stack into one array"))
    return _FAILED


@_stack.register(Dict)
@_stack.register(Tuple)
def _stack_container(
    space: Dict | Tuple, rows: Sequence[Any], path: str, problems: _Problems
) -> Any:
    children = _children(space)
    names = [name for name, _ in children]
    first: dict[str, Problem] = {}  # one problem per field: its first row
    for i, row in enumerate(rows):
        for problem in _container_problems(names, space, row, path, i):
            first.setdefault(problem.field, problem)
    problems.extend(first.values())
    if path in first:
        return _FAILED
    keys = names if isinstance(space, Dict) else range(len(names))
    return _assemble(space, [
        _FAILED if f"{path}.{name}" in first
        else _stack(sub, [row[key] for row in rows], f"{path}.{name}", problems)
        for (name, sub), key in zip(children, keys, strict=True)
    ])  # fmt: skip


def _encode_part(space: gym.Space[Any], values: Any, path: str, problems: _Problems) -> Any:
    return None if values is _FAILED else _encode(space, values, path, problems)


@functools.singledispatch
def _encode(space: gym.Space[Any], values: Any, path: str, problems: _Problems) -> Any:
    raise _unsupported(space)


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
def _encode_discrete(space: Discrete, values: Any, path: str, problems: _Problems) -> Any:
    start, end = int(space.start), int(space.start + space.n)
    expected = f"an integer in [{start}, {end})"
    array = _numeric(values, space, path, problems)
    if array is not None:
        array = _integers(array, start, end - 1, np.int64, path, problems, lambda _: expected)
    return None if array is None else pa.array(array)


@_encode.register(MultiDiscrete)
def _encode_multi_discrete(
    space: MultiDiscrete, values: Any, path: str, problems: _Problems
) -> Any:
    start, end = space.start.astype(np.int64), (space.start + space.nvec).astype(np.int64)

    def expected(at: tuple[int, ...]) -> str:
        return f"an integer in [{start[at]}, {end[at]}) at index {at[0] if len(at) == 1 else at}"

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
    found = _container_problems([name for name, _ in _children(space)], space, values, path, None)
    problems.extend(found)
    if any(problem.field == path for problem in found):
        return None
    children = _children(space)
    parts = zip(children, _parts(space, values), strict=True)
    arrays = [_encode_part(sub, part, f"{path}.{name}", problems) for (name, sub), part in parts]
    if any(array is None for array in arrays):
        return None
    lengths = {name: len(array) for (name, _), array in zip(children, arrays, strict=True)}
    if len(set(lengths.values())) > 1:
        problems.append(Problem(path, "the same number of rows in every entry", str(lengths)))
        return None
    return pa.StructArray.from_arrays(arrays, fields=list(space_to_arrow(space)))


def _container_problems(names: list[str], space: Dict | Tuple, value: Any, path: str,
                        row: int | None) -> _Problems:  # fmt: skip
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


def _integers(array: np.ndarray, lo: Any, hi: Any, dtype: Any, path: str, problems: _Problems,
              expected: Callable[[tuple[int, ...]], str]) -> Any:  # fmt: skip
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
    raise _unsupported(space)


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
    names = [name for name, _ in _children(space)]
    if not pa.types.is_struct(array.type) or [f.name for f in array.type] != names:
        problems.append(Problem(path, f"an Arrow struct with fields {names}", str(array.type)))
        return None
    if array.null_count:
        problems.append(Problem(path, "a value in every row", "null", _first_null(array)))
        return None
    return _assemble(space, [_decode(sub, array.field(i), f"{path}.{name}", problems)
                             for i, (name, sub) in enumerate(_children(space))])  # fmt: skip


def _first_null(array: pa.Array) -> int:
    return int(pc.index(array.is_null(), True).as_py())


# --- Flat vectors for networks -----------------------------------------------------------------


@functools.singledispatch
def flatdim(space: gym.Space[Any]) -> int:
    """Width of the rows :func:`flatten` makes (as ``gymnasium.spaces.flatdim``)."""
    raise _unsupported(space)


flatdim.register(Box, lambda space: math.prod(space.shape))
flatdim.register(MultiBinary, lambda space: math.prod(space.shape))
flatdim.register(Discrete, lambda space: int(space.n))
flatdim.register(MultiDiscrete, lambda space: int(space.nvec.sum()))
flatdim.register(Dict, lambda space: sum(flatdim(sub) for _, sub in _children(space)))
flatdim.register(Tuple, lambda space: sum(flatdim(sub) for _, sub in _children(space)))


def flatten(space: gym.Space[Any], array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column as float32 rows of width :func:`flatdim`, to feed a neural network.

    The layout is ``gymnasium.spaces.flatten``'s (one-hot discretes, Dict in key order, Box
    row-major), so a network built for gymnasium's flattening reads logged data unchanged; but
    a whole column is flattened at once, not row by row.
    """
    out = np.zeros((len(array), flatdim(space)), np.float32)
    _flatten_into(space, from_arrow(space, array), out)
    return out


def flatten_batch(space: gym.Space[Any], batch: Any) -> np.ndarray:
    """A batch in :func:`to_arrow`'s layout (numpy, not Arrow) flattened as :func:`flatten` does.

    The client's numpy policy and the server's remote inference take observations as they come
    from an env, so they flatten without a round trip through Arrow.
    """
    out = np.zeros((_batch_length(space, batch), flatdim(space)), np.float32)
    _flatten_into(space, batch, out)
    return out


def _batch_length(space: gym.Space[Any], batch: Any) -> int:
    if isinstance(space, Dict | Tuple):
        return _batch_length(_children(space)[0][1], _parts(space, batch)[0])
    return len(np.asarray(batch))


@functools.singledispatch
def _flatten_into(space: gym.Space[Any], batch: Any, out: np.ndarray) -> None:
    raise _unsupported(space)


@_flatten_into.register(Box)
@_flatten_into.register(MultiBinary)
def _flatten_array(space: Box | MultiBinary, batch: np.ndarray, out: np.ndarray) -> None:
    out[:] = np.asarray(batch).reshape(out.shape)


@_flatten_into.register(Discrete)
def _flatten_discrete(space: Discrete, batch: np.ndarray, out: np.ndarray) -> None:
    out[np.arange(len(out)), np.asarray(batch) - space.start] = 1


@_flatten_into.register(MultiDiscrete)
def _flatten_multi_discrete(space: MultiDiscrete, batch: np.ndarray, out: np.ndarray) -> None:
    nvec = space.nvec.reshape(-1)
    offsets = (np.asarray(batch) - space.start).reshape(len(out), nvec.size)
    columns = np.cumsum(nvec) - nvec + offsets
    out[np.arange(len(out))[:, None], columns] = 1


@_flatten_into.register(Dict)
@_flatten_into.register(Tuple)
def _flatten_container(space: Dict | Tuple, batch: Any, out: np.ndarray) -> None:
    column = 0
    for (_, sub), part in zip(_children(space), _parts(space, batch), strict=True):
        _flatten_into(sub, part, out[:, column : column + flatdim(sub)])
        column += flatdim(sub)


# --- Sampling --------------------------------------------------------------------------------


def sample_batch(space: gym.Space[Any], n: int, seed: int) -> Any:
    """``n`` seeded samples of ``space``, in the batch layout of :func:`to_arrow`.

    Vectorized (``space.sample()`` in a loop is slow), so tests and benchmarks can make a million
    rows quickly; every value is finite, so the batch always passes :func:`to_arrow`.
    """
    return _sample(space, n, np.random.default_rng(seed))


@functools.singledispatch
def _sample(space: gym.Space[Any], n: int, rng: np.random.Generator) -> Any:
    raise _unsupported(space)


@_sample.register(Box)
def _sample_box(space: Box, n: int, rng: np.random.Generator) -> np.ndarray:
    size, low, high = (n, *space.shape), cast(Any, space.low), cast(Any, space.high)
    if space.dtype.kind != "f":  # integer or bool bounds
        return rng.integers(low, high, size, space.dtype, endpoint=True)
    # as Box.sample: uniform if bounded, exponential from a single bound, else normal
    low, high = np.broadcast_to(low, size), np.broadcast_to(high, size)
    below = np.broadcast_to(space.bounded_below, size)
    above = np.broadcast_to(space.bounded_above, size)
    out = rng.standard_normal(size)
    both, low_only, high_only = below & above, below & ~above, above & ~below
    out[both] = rng.uniform(low[both], high[both])
    out[low_only] = low[low_only] + rng.exponential(size=int(low_only.sum()))
    out[high_only] = high[high_only] - rng.exponential(size=int(high_only.sum()))
    return out.astype(space.dtype)


@_sample.register(Discrete)
def _sample_discrete(space: Discrete, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(int(space.start), int(space.start + space.n), n).astype(space.dtype)


@_sample.register(MultiDiscrete)
def _sample_multi_discrete(space: MultiDiscrete, n: int, rng: np.random.Generator) -> np.ndarray:
    high = space.start + space.nvec
    return rng.integers(space.start, high, (n, *space.shape)).astype(space.dtype)


@_sample.register(MultiBinary)
def _sample_multi_binary(space: MultiBinary, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 2, (n, *space.shape), np.int8)


@_sample.register(Dict)
@_sample.register(Tuple)
def _sample_container(space: Dict | Tuple, n: int, rng: np.random.Generator) -> Any:
    return _assemble(space, [_sample(sub, n, rng) for _, sub in _children(space)])

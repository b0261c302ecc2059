"""Gymnasium spaces as data: JSON documents and Arrow types.

A dataset must be readable without the code that wrote it, so every space is stored twice: as a
JSON document (manifest, field metadata) and as the Arrow type of its column. Each operation is
one ``functools.singledispatch`` function with one implementation per space type (as Minari's
``minari/serialization.py``). Columns::

    Box shape ()     scalar of the Box dtype        Discrete       int64
    Box otherwise    fixed_size_list<dtype>[prod]   MultiDiscrete  fixed_size_list<int64>[prod]
    Dict, Tuple      struct, a child per entry      MultiBinary    fixed_size_list<int8>[prod]

Lists hold each row flattened row-major; the shape rides in the field metadata. Values go in and
out of these columns in :mod:`pipeline.format.codec`; :mod:`pipeline.format.flattening` makes
network inputs.
"""

from __future__ import annotations

import functools
import json
import math
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from pipeline.errors import SpaceError

SUPPORTED = ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple")
META_SPACE = b"rlpipe.space"  # field metadata: the space_to_json document
META_SHAPE = b"rlpipe.shape"  # field metadata: the per-row shape of a list column
MISSING: Any = object()  # a Dict key absent from a value, or a part that already failed to stack
_STRUCTS: dict[int, tuple[gym.Space[Any], pa.DataType]] = {}  # id(space) -> (space, struct type)


def unsupported(space: object) -> SpaceError:
    return SpaceError(
        f"rlpipe cannot store a {type(space).__name__} space; "
        f"supported spaces are {', '.join(SUPPORTED)}"
    )


def subspaces(space: Dict | Tuple) -> list[tuple[str, gym.Space[Any]]]:
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


def assemble(space: Dict | Tuple, parts: list[Any]) -> Any:
    names = [name for name, _ in subspaces(space)]
    return dict(zip(names, parts, strict=True)) if isinstance(space, Dict) else tuple(parts)


def split_value(space: Dict | Tuple, value: Any) -> list[Any]:
    if isinstance(space, Tuple):
        return list(value)
    return [value.get(name, MISSING) for name, _ in subspaces(space)]


# --- JSON documents --------------------------------------------------------------------------


@functools.singledispatch
def space_to_json(space: gym.Space[Any]) -> dict[str, Any]:
    """The space as a JSON-safe document, so a dataset describes itself without pickles."""
    raise unsupported(space)


@space_to_json.register(Box)
def _box_to_json(space: Box) -> dict[str, Any]:
    low, high = _bounds_to_json(space.low), _bounds_to_json(space.high)
    return {
        "type": "Box",
        "shape": list(space.shape),
        "dtype": space.dtype.name,
        "low": low,
        "high": high,
    }


@space_to_json.register(Discrete)
def _discrete_to_json(space: Discrete) -> dict[str, Any]:
    doc: dict[str, Any] = {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if space.dtype != np.int64:  # written only when not the default, to keep documents short
        doc["dtype"] = space.dtype.name
    return doc


@space_to_json.register(MultiDiscrete)
def _multi_discrete_to_json(space: MultiDiscrete) -> dict[str, Any]:
    return {
        "type": "MultiDiscrete",
        "nvec": space.nvec.tolist(),
        "start": space.start.tolist(),
        "dtype": space.dtype.name,
    }


@space_to_json.register(MultiBinary)
def _multi_binary_to_json(space: MultiBinary) -> dict[str, Any]:
    # gymnasium tells MultiBinary(3) and MultiBinary([3]) apart, so the int form is kept
    return {"type": "MultiBinary", "n": space.n if isinstance(space.n, int) else list(space.n)}


@space_to_json.register(Dict)
@space_to_json.register(Tuple)
def _container_to_json(space: Dict | Tuple) -> dict[str, Any]:
    docs = {name: space_to_json(sub) for name, sub in subspaces(space)}
    return {
        "type": type(space).__name__,
        "spaces": docs if isinstance(space, Dict) else list(docs.values()),
    }


_SCALAR_FROM = 256  # values of a bound, as frames.FRAME_VALUES


def _bounds_to_json(bounds: np.ndarray) -> Any:
    """Bounds as nested lists; JSON has no infinity, so +/-inf become the strings "inf"/"-inf".
    A bound of at least ``_SCALAR_FROM`` equal values is one number that broadcasts: an 84x84x3
    frame's bounds as lists made ~700 KB of every shard's footer (the space rides in the schema
    metadata of three places)."""
    if bounds.size >= _SCALAR_FROM and (bounds == bounds.flat[0]).all():
        return _bounds_to_json(bounds.reshape(-1)[:1])[0]
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
        raise SpaceError(
            f"space document at {where}: 'type' must be one of {', '.join(SUPPORTED)}, got {kind!r}"
        )
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
    shape = tuple(_ints(doc["shape"], f"{where}.shape"))
    if shape:  # a scalar bound broadcasts
        low, high = (np.full(shape, b) if np.ndim(b) == 0 else b for b in (low, high))
    return Box(low, high, shape, dtype)


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
        raise SpaceError(
            f"space document at {where}.spaces: expected a non-empty JSON {kind}, "
            f"got {reprlib.repr(subs)}"
        )
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
        raise SpaceError(
            f"space document at {where}: expected an integer or nested lists of "
            f"integers, got {reprlib.repr(value)}"
        )
    return value


def _bounds_from_json(value: Any, dtype: np.dtype[Any], where: str) -> np.ndarray:
    def decode(item: Any) -> Any:
        if isinstance(item, list):
            return [decode(x) for x in item]
        if item in ("inf", "-inf") or isinstance(item, int | float):
            return float(item) if isinstance(item, str) else item
        raise SpaceError(
            f"space document at {where}: expected numbers, 'inf' or '-inf', got {item!r}"
        )

    decoded = decode(value)
    with np.errstate(all="raise"):
        return np.asarray(decoded, dtype=dtype)


# --- Arrow types and fields --------------------------------------------------------------------


@functools.singledispatch
def space_to_arrow(space: gym.Space[Any]) -> pa.DataType:
    """The Arrow type of a column holding one value of ``space`` per row (see module docstring)."""
    raise unsupported(space)


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
        fields = [space_field(name, sub) for name, sub in subspaces(space)]
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
        raise SpaceError(
            f"field '{field.name}' has no {META_SPACE.decode()} metadata; "
            "only fields made by space_field() carry a space"
        )
    try:
        space = space_from_json(json.loads(raw))
    except json.JSONDecodeError as error:
        raise SpaceError(f"field '{field.name}': space metadata is not JSON: {error}") from error
    if field.type != space_to_arrow(space):
        raise SpaceError(
            f"field '{field.name}' has type {field.type}, but its space is stored "
            f"as {space_to_arrow(space)}"
        )
    return space

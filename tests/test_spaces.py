"""Spaces as data: every supported space survives JSON, Parquet and flattening unchanged."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Text, Tuple

from pipeline.errors import SchemaError, SpaceError
from pipeline.format.codec import float_box_rows, from_arrow, to_arrow, to_arrow_rows
from pipeline.format.flattening import flatdim, flatten
from pipeline.format.samples import sample_batch
from pipeline.format.spaces import (
    space_field,
    space_from_field,
    space_from_json,
    space_to_arrow,
    space_to_json,
)

ARM = Dict([("z", Box(0.0, 1.0, (2,))), ("a", Discrete(4))])  # keys not sorted
SPACES: dict[str, gym.Space[Any]] = {
    "box-scalar": Box(-1.0, 1.0, shape=(), dtype=np.float32),
    "box-vector": Box(-2.0, 2.0, shape=(4,), dtype=np.float32),
    "box-image-uint8": Box(0, 255, shape=(6, 5, 3), dtype=np.uint8),
    "box-float64-inf": Box(-np.inf, np.inf, shape=(3,), dtype=np.float64),
    "box-per-element": Box(
        np.array([-1.5, 0.0, -np.inf], np.float32), np.array([0.1, np.inf, 5.0], np.float32)
    ),
    "box-int32-unbounded": Box(-np.inf, np.inf, shape=(2,), dtype=np.int32),
    "box-uint64-full-range": Box(0, 2**64 - 1, shape=(2,), dtype=np.uint64),
    "box-float16-scalar": Box(-np.inf, 2.5, shape=(), dtype=np.float16),
    "box-bool": Box(0, 1, shape=(3,), dtype=np.bool_),
    "discrete-start": Discrete(5, start=-3),
    "discrete-int32": Discrete(3, dtype=np.int32),
    "multi-discrete-2d": MultiDiscrete(
        np.array([[2, 3], [4, 5]]), start=np.array([[0, 1], [-2, 0]])
    ),
    "multi-binary-int": MultiBinary(5),
    "multi-binary-shape": MultiBinary([2, 3]),
    "dict": Dict(
        [("velocity", Box(-1.0, 1.0, (2,))), ("mode", Discrete(3)), ("goal", Box(0.0, 9.0, ()))]
    ),
    "tuple": Tuple((Discrete(2), Box(-1.0, 1.0, (2,)), MultiBinary(3))),
    "dict-tuple-dict": Dict([("arm", Tuple((ARM, MultiBinary(2)))), ("t", Discrete(7))]),
}
N = 13


def _row(batch: Any, i: int | slice) -> Any:
    """Row ``i`` of a batch (a single sample of the space), or rows ``i`` if a slice."""
    if isinstance(batch, dict):
        return {key: _row(value, i) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_row(value, i) for value in batch)
    return batch[i] if isinstance(i, slice) else np.asarray(batch[i])  # gymnasium wants arrays


def _assert_same_batch(got: Any, expected: Any) -> None:
    """Equal values, dtypes, shapes and nesting (dict key order included)."""
    assert type(got) is type(expected)
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            _assert_same_batch(got[key], expected[key])
    elif isinstance(expected, tuple):
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _assert_same_batch(g, e)
    else:
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def _all_metadata(field: pa.Field) -> list[Any]:
    """Metadata of ``field`` and of every nested struct child, depth first."""
    children = list(field.type) if pa.types.is_struct(field.type) else []
    return [field.metadata] + [m for child in children for m in _all_metadata(child)]


@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_json_round_trip(space: gym.Space[Any]) -> None:
    doc = space_to_json(space)
    stored = json.loads(json.dumps(doc, allow_nan=False))  # strictly JSON: no NaN or Infinity
    assert stored == doc
    rebuilt = space_from_json(stored)
    assert rebuilt == space
    assert space_to_json(rebuilt) == doc  # bounds exactly, key order, dtype


@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_parquet_round_trip(space: gym.Space[Any], tmp_path: Path) -> None:
    batch = sample_batch(space, N, seed=1)
    field = space_field("observation", space)
    array = to_arrow(space, batch, field="observation")
    assert array.type == field.type == space_to_arrow(space)
    pq.write_table(pa.Table.from_arrays([array], schema=pa.schema([field])), tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    read_field = table.schema.field("observation")
    assert _all_metadata(read_field) == _all_metadata(field)
    assert space_from_field(read_field) == space
    _assert_same_batch(from_arrow(space, table.column("observation")), batch)


@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_flatten_matches_gymnasium(space: gym.Space[Any]) -> None:
    batch = sample_batch(space, N, seed=2)
    rows = [_row(batch, i) for i in range(N)]
    assert all(space.contains(row) for row in rows)
    array = to_arrow(space, batch)
    assert to_arrow_rows(space, rows).equals(array)
    expected = np.stack([gym.spaces.flatten(space, row) for row in rows]).astype(np.float32)
    got = flatten(space, array)
    assert got.dtype == np.float32 and got.shape == (N, flatdim(space))
    assert flatdim(space) == gym.spaces.flatdim(space)
    np.testing.assert_array_equal(got, expected)


def test_arrow_types_follow_the_documented_layout() -> None:
    assert space_to_arrow(SPACES["box-scalar"]) == pa.float32()
    assert space_to_arrow(SPACES["box-image-uint8"]) == pa.list_(pa.uint8(), 90)
    assert pa.types.is_fixed_size_list(space_to_arrow(SPACES["box-image-uint8"]))
    assert space_to_arrow(SPACES["discrete-start"]) == pa.int64()
    assert space_to_arrow(SPACES["multi-discrete-2d"]) == pa.list_(pa.int64(), 4)
    assert space_to_arrow(SPACES["multi-binary-shape"]) == pa.list_(pa.int8(), 6)
    assert [f.name for f in space_to_arrow(SPACES["dict"])] == ["velocity", "mode", "goal"]
    assert [f.name for f in space_to_arrow(SPACES["tuple"])] == ["0", "1", "2"]


def test_field_metadata_holds_space_and_shape() -> None:
    field = space_field("observation", SPACES["dict"], nullable=True)
    assert field.nullable
    assert json.loads(field.metadata[b"rlpipe.space"]) == space_to_json(SPACES["dict"])
    assert b"rlpipe.shape" not in field.metadata
    assert json.loads(field.type.field("velocity").metadata[b"rlpipe.shape"]) == [2]
    assert json.loads(field.type.field("goal").metadata[b"rlpipe.shape"]) == []
    assert b"rlpipe.shape" not in field.type.field("mode").metadata
    image = space_field("o", SPACES["box-image-uint8"])
    assert json.loads(image.metadata[b"rlpipe.shape"]) == [6, 5, 3]


@pytest.mark.parametrize("space", SPACES.values(), ids=SPACES.keys())
def test_empty_batch_round_trip(space: gym.Space[Any]) -> None:
    batch = sample_batch(space, 0, seed=0)
    array = to_arrow(space, batch)
    assert len(array) == 0 and array.type == space_to_arrow(space)
    _assert_same_batch(from_arrow(space, array), batch)
    assert flatten(space, array).shape == (0, flatdim(space))
    assert to_arrow_rows(space, []).equals(array)


def test_from_arrow_handles_slices_and_chunks() -> None:
    space = SPACES["dict-tuple-dict"]
    batch = sample_batch(space, N, seed=3)
    array = to_arrow(space, batch)
    _assert_same_batch(from_arrow(space, array.slice(3, 5)), _row(batch, slice(3, 8)))
    chunked = pa.chunked_array([array.slice(0, 4), array.slice(4)])
    _assert_same_batch(from_arrow(space, chunked), batch)
    _assert_same_batch(from_arrow(space, pa.chunked_array([], array.type)), _row(batch, slice(0)))


def test_from_arrow_is_zero_copy_for_one_chunk() -> None:
    space = SPACES["box-image-uint8"]
    array = to_arrow(space, sample_batch(space, N, seed=4))
    images = from_arrow(space, pa.chunked_array([array]).slice(2))
    assert images.shape == (N - 2, 6, 5, 3) and not images.flags.writeable
    assert images.ctypes.data == array.values.buffers()[1].address + 2 * 6 * 5 * 3


def test_values_are_cast_to_the_space_dtype_and_bounds_are_not_enforced() -> None:
    box = Box(-1.0, 1.0, (2,), np.float32)
    out = from_arrow(box, to_arrow(box, [[5, -7], [0, 1]]))  # ints outside the bounds
    np.testing.assert_array_equal(out, np.array([[5, -7], [0, 1]], np.float32))
    actions = from_arrow(Discrete(3), to_arrow(Discrete(3), np.array([2.0, 0.0])))
    assert actions.dtype == np.int64 and actions.tolist() == [2, 0]


DICT = SPACES["dict"]
GOOD = {"velocity": np.zeros((2, 2), np.float32), "mode": np.array([0, 2]), "goal": np.ones(2)}
NAN_AT_7 = np.zeros((9, 4))
NAN_AT_7[7, 2] = np.nan
KEYS = "['velocity', 'mode', 'goal']"
EVERY_KEY = "expected a value for every key of the Dict space, got no such key"
BOX4 = Box(-1.0, 1.0, (4,), np.float32)

ERRORS: dict[str, tuple[gym.Space[Any], Any, str]] = {
    "wrong-shape": (
        BOX4, np.zeros((5, 3), np.float32),
        "field 'observation': expected float32 of shape (4,) per row, got shape (3,)",
    ),
    "no-batch-axis": (
        Discrete(2), 1,
        "field 'observation': expected int64 of shape () per row, "
        "got a single value (no batch axis)",
    ),
    "not-numbers": (
        BOX4, [["a", "b", "c", "d"]],
        "field 'observation': expected float32 of shape (4,) per row, got dtype <U1",
    ),
    "nan": (BOX4, NAN_AT_7, "row 7, field 'observation': expected finite values, got nan"),
    "inf": (
        Box(-1.0, 1.0, (), np.float64), [0.0, 1.0, -np.inf],
        "row 2, field 'observation': expected finite values, got -inf",
    ),
    "too-large-for-float32": (
        BOX4, np.full((1, 4), 1e300),
        "row 0, field 'observation': expected finite values, got 1e+300, too large for float32",
    ),
    "out-of-uint8": (
        Box(0, 255, (2,), np.uint8), np.array([[1, 300]]),
        "row 0, field 'observation': expected integers in [0, 255] for uint8, got 300",
    ),
    "discrete-out-of-range": (
        Discrete(5, start=-3), [-3, 0, 2],
        "row 2, field 'observation': expected an integer in [-3, 2), got 2",
    ),
    "non-integral-action": (
        Discrete(2), np.array([0.0, 1.0, 0.5]),
        "row 2, field 'observation': expected an integer in [0, 2), got 0.5",
    ),
    "multi-discrete-out-of-range": (
        SPACES["multi-discrete-2d"], [[[0, 1], [2, 0]]],
        "row 0, field 'observation': expected an integer in [-2, 2) at index (1, 0), got 2",
    ),
    "multi-binary-2": (
        MultiBinary(3), [[0, 1, 1], [1, 2, 0]],
        "row 1, field 'observation': expected 0 or 1, got 2",
    ),
    "missing-key": (
        DICT, {"velocity": GOOD["velocity"], "mode": GOOD["mode"]},
        f"field 'observation.goal': {EVERY_KEY}",
    ),
    "extra-key": (
        DICT, {**GOOD, "color": np.zeros(2)},
        f"field 'observation.color': expected one of the keys {KEYS}, got an unknown key",
    ),
    "not-a-mapping": (
        DICT, [1, 2],
        f"field 'observation': expected a mapping with keys {KEYS}, got [1, 2]",
    ),
    "rows-differ": (
        DICT, {**GOOD, "mode": np.array([0, 1, 2])},
        "field 'observation': expected the same number of rows in every entry, "
        "got {'velocity': 2, 'mode': 3, 'goal': 2}",
    ),
    "tuple-path": (
        SPACES["tuple"], ([0], [[np.nan, 0.0]], [[0, 1, 0]]),
        "row 0, field 'observation.1': expected finite values, got nan",
    ),
    "many-at-once": (
        DICT, {"velocity": np.zeros((2, 3)), "mode": [0, 5], "color": [1, 1]},
        f"\n  field 'observation.goal': {EVERY_KEY}"
        f"\n  field 'observation.color': expected one of the keys {KEYS}, got an unknown key"
        "\n  field 'observation.velocity': expected float32 of shape (2,) per row, got shape (3,)"
        "\n  row 1, field 'observation.mode': expected an integer in [0, 3), got 5",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("space", "values", "message"), ERRORS.values(), ids=ERRORS.keys())
def test_to_arrow_errors(space: gym.Space[Any], values: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(message)) as caught:
        to_arrow(space, values, field="observation")
    assert str(caught.value) == message


ROW_ERRORS: dict[str, tuple[gym.Space[Any], list[Any], str]] = {
    "ragged": (
        BOX4, [[0, 0, 0, 0], [0, 0, 0]],
        "row 1, field 'observation': expected float32 of shape (4,) per row, got shape (3,)",
    ),
    "none": (
        BOX4, [[0, 0, 0, 0], [0, 0, 0, 0], None],
        "row 2, field 'observation': expected float32 of shape (4,) per row, got None",
    ),
    "value": (
        Discrete(2), [0, 1, 7],
        "row 2, field 'observation': expected an integer in [0, 2), got 7",
    ),
    "missing-key": (
        DICT, [{"velocity": [0, 0], "mode": 1, "goal": 0}] * 2 + [{"velocity": [0, 0], "mode": 1}],
        f"row 2, field 'observation.goal': {EVERY_KEY}",
    ),
    "tuple-length": (
        SPACES["tuple"], [(0, [0.0, 0.0], [0, 0, 1]), (0, [0.0, 0.0])],
        "row 1, field 'observation': expected a list or tuple of 3 entries, got (0, [0.0, 0.0])",
    ),
    "nested-and-value": (
        SPACES["dict-tuple-dict"],
        [{"arm": ({"z": [0, 0], "a": 3}, [0, 1]), "t": 0},
         {"arm": ({"z": [0, 0]}, [0, 1]), "t": 8}],
        f"\n  row 1, field 'observation.arm.0.a': {EVERY_KEY}"
        "\n  row 1, field 'observation.t': expected an integer in [0, 7), got 8",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("space", "rows", "message"), ROW_ERRORS.values(), ids=ROW_ERRORS.keys())
def test_to_arrow_rows_errors(space: gym.Space[Any], rows: list[Any], message: str) -> None:
    with pytest.raises(SchemaError, match=re.escape(message)) as caught:
        to_arrow_rows(space, rows, field="observation")
    assert str(caught.value) == message


def test_from_arrow_errors() -> None:
    expected = "field 'value': expected Arrow type fixed_size_list<item: float>[4], got double"
    with pytest.raises(SchemaError, match=re.escape(expected)):
        from_arrow(BOX4, pa.array([1.0]))
    with pytest.raises(
        SchemaError,
        match=re.escape("row 1, field 'value': expected a value in every row, got null"),
    ):
        from_arrow(Discrete(2), pa.array([0, None]))


UNSUPPORTED = (
    "rlpipe cannot store a Text space; "
    "supported spaces are Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"
)


TEXT_IN_DICT = Dict([("a", Discrete(2)), ("b", Text(5))])


@pytest.mark.parametrize(
    "operation",
    [lambda: space_to_json(Text(5)), lambda: space_to_arrow(Text(5)), lambda: flatdim(Text(5)),
     lambda: to_arrow(Text(5), ["a"]), lambda: to_arrow_rows(Text(5), ["a"]),
     lambda: from_arrow(Text(5), pa.array(["a"])), lambda: sample_batch(Text(5), 1, 0),
     lambda: space_field("x", TEXT_IN_DICT), lambda: flatdim(TEXT_IN_DICT),
     lambda: to_arrow(TEXT_IN_DICT, {"a": [0], "b": ["a"]}),
     lambda: sample_batch(TEXT_IN_DICT, 1, 0)],
)  # fmt: skip
def test_unsupported_space(operation: Any) -> None:
    with pytest.raises(SpaceError, match=re.escape(UNSUPPORTED)) as caught:
        operation()
    assert str(caught.value) == UNSUPPORTED


@pytest.mark.parametrize(
    ("space", "message"),
    [(Dict([(1, Discrete(2))]), "Dict space keys must be strings"),
     (Tuple([]), "an empty Tuple space cannot be stored in Parquet"),
     (Box(0.0, 1.0, (0, 3)), "a space of shape (0, 3) holds no values; Arrow lists need at least")],
)  # fmt: skip
def test_spaces_without_a_column_type(space: gym.Space[Any], message: str) -> None:
    with pytest.raises(SpaceError, match=re.escape(message)):
        space_to_arrow(space)


BOX_DOC = {"type": "Box", "shape": [2], "dtype": "float32", "low": [0, 0], "high": [1, 1]}
MALFORMED: dict[str, tuple[Any, str]] = {
    "not-an-object": ([], "space document at $: expected a JSON object, got []"),
    "unknown-type": (
        {"type": "Text", "max_length": 5},
        "space document at $: 'type' must be one of Box, Discrete, MultiDiscrete, MultiBinary, "
        "Dict, Tuple, got 'Text'",
    ),
    "missing-and-unknown-key": (
        {**{k: v for k, v in BOX_DOC.items() if k != "high"}, "hihg": [1, 1]},
        "space document at $: Box is missing 'high'; Box has no key 'hihg'",
    ),
    "float-n": (
        {"type": "Discrete", "n": 2.5},
        "space document at $.n: expected an integer or nested lists of integers, got 2.5",
    ),
    "bool-in-shape": (
        {"type": "MultiBinary", "n": [2, True]},
        "space document at $.n: expected an integer or nested lists of integers, got [2, True]",
    ),
    "bad-bound": (
        {"type": "Dict", "spaces": {"pos": {**BOX_DOC, "low": ["-inf", "minus one"]}}},
        "space document at $.spaces.pos.low: expected numbers, 'inf' or '-inf', got 'minus one'",
    ),
    "bad-dtype": (
        {**BOX_DOC, "dtype": "flot32"},
        "space document at $: not a valid Box: data type 'flot32' not understood",
    ),
    "low-above-high": (
        {**BOX_DOC, "low": [0, 2]},
        "space document at $: not a valid Box: Box all low values must be less than or equal",
    ),
    "empty-tuple": (
        {"type": "Tuple", "spaces": []},
        "space document at $.spaces: expected a non-empty JSON list, got []",
    ),
    "gymnasium-check": (
        {"type": "Discrete", "n": 0},
        "space document at $: not a valid Discrete: ",
    ),
    "nested-missing-key": (
        {"type": "Dict", "spaces": {"a": {"type": "Tuple", "spaces": [{"type": "Discrete"}]}}},
        "space document at $.spaces.a.spaces.0: Discrete is missing 'n'",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("doc", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_json_documents(doc: Any, message: str) -> None:
    with pytest.raises(SpaceError, match=re.escape(message)):
        space_from_json(doc)


def test_space_from_field_needs_its_metadata() -> None:
    message = (
        "field 'x' has no rlpipe.space metadata; only fields made by space_field() carry a space"
    )
    with pytest.raises(SpaceError, match=re.escape(message)):
        space_from_field(pa.field("x", pa.int64()))
    with pytest.raises(
        SpaceError, match=re.escape("field 'x' has type int32, but its space is stored as int64")
    ):
        space_from_field(space_field("x", Discrete(2)).with_type(pa.int32()))


def test_float_box_fast_check_agrees_with_to_arrow_rows() -> None:
    box = Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    good = [[0.5, 2.0], [1, 0]]  # bounds are not enforced; ints cast
    batch = float_box_rows(box, good)
    assert batch is not None and batch.dtype == np.float32 and batch.shape == (2, 2)
    assert batch.tolist() == to_arrow_rows(box, good).to_pylist()
    for bad in ([[np.nan, 0.0]], [[0.0]], [["a", "b"]], [[0.0, 1.0], [0.0]]):
        assert float_box_rows(box, bad) is None  # the full check then names the problem
    assert float_box_rows(Discrete(3), [1, 2]) is None

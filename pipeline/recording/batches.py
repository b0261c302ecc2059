"""Batches of a space's values as the step core takes them: checked once, rows taken.

A batch has :mod:`pipeline.format.codec`'s layout: an array with the row axis first, and dicts
and tuples of such arrays for Dict and Tuple spaces. Every observation and logged action a step
carries, on the server or in the client, is checked by :func:`checked` and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.dataset.batch import length
from pipeline.errors import Problem, SchemaError
from pipeline.format import codec


def checked(space: gym.Space[Any], values: Sequence[Any], names: Sequence[str] | str) -> Any:
    """The values as one batch of the space's layout, or a SchemaError listing every bad value.

    ``names`` names the values in errors: one name per value, or one name for the column (then
    problems name their rows)."""
    one = _one_array(space, values)
    if one is not None:
        return one
    fast = codec.float_box_rows(space, values)  # a Box of floats: one numpy pass
    if fast is not None:
        return fast
    field = names if isinstance(names, str) else names[0] if len(names) == 1 else "values"
    try:
        return codec.from_arrow(space, codec.to_arrow_rows(space, values, field=field))
    except SchemaError as error:
        if isinstance(names, str):
            raise
        problems = error.problems if len(names) == 1 else _each(space, values, names)
    raise SchemaError(problems)


def one(space: gym.Space[Any], value: Any, name: Sequence[str] | str) -> Any:
    """One value checked, as the env takes it (:func:`row_of` of a batch of one): a local
    client's every step, kept short for the common case, an env's own array."""
    row = _plain_row(space, value)
    return row if row is not None else row_of(checked(space, [value], name), 0)


def _one_array(space: gym.Space[Any], values: Sequence[Any]) -> np.ndarray | None:
    """One observation as an env hands it out as a batch of one (see :func:`_plain_row`)."""
    if len(values) != 1:
        return None
    row = _plain_row(space, values[0])
    return None if row is None else row[None]


def _plain_row(space: gym.Space[Any], value: Any) -> np.ndarray | None:
    """An array of a Box's dtype and shape, copied (an env may reuse its array); None for
    anything else. A few values are checked finite in Python: numpy's two calls would cost
    more than the check."""
    if type(value) is not np.ndarray or not isinstance(space, gym.spaces.Box):
        return None
    if value.dtype != space.dtype or value.shape != space.shape:
        return None
    if space.dtype.kind in "iub":  # every value of the dtype is kept (bounds are not enforced)
        return value.copy()
    finite = (
        all(map(math.isfinite, value.tolist())) if value.size <= 16 else np.isfinite(value).all()
    )
    return value.copy() if finite else None


def _each(space: gym.Space[Any], values: Sequence[Any], names: Sequence[str]) -> list[Problem]:
    """Every problem of ``values``, each checked alone under its own name."""
    problems = []
    for value, name in zip(values, names, strict=True):
        try:
            codec.to_arrow_rows(space, [value], field=name)
        except SchemaError as error:
            problems += error.problems
    return problems


def row_of(batch: Any, i: int) -> Any:
    """Row ``i`` of a batch, as the env would take it (a scalar space's row as a Python value)."""
    return _leaves(batch, lambda array: array[i].item() if array.ndim == 1 else array[i])


def rows_of(batch: Any) -> list[Any]:
    """Every row of a batch, as :func:`row_of` gives them (an array's rows are views)."""
    if type(batch) is np.ndarray:
        if batch.ndim == 1:
            return batch.tolist()
        return [batch[0]] if len(batch) == 1 else list(batch)  # one step: list() costs 5x
    return [row_of(batch, i) for i in range(length(batch))]


def value_of(batch: Any, i: int) -> Any:
    """Row ``i`` of a batch as the JSON value that the step table's column holds."""
    return _leaves(batch, lambda array: array[i].tolist(), tuples=list)


def take(batch: Any, rows: list[int]) -> Any:
    """Rows of a batch, as a batch."""
    return _leaves(batch, lambda array: array[rows])


def _leaves(batch: Any, leaf: Callable[[np.ndarray], Any], tuples: type = tuple) -> Any:
    """``leaf`` of each array of a batch, in the batch's dicts and tuples (``tuples`` for those)."""
    if isinstance(batch, dict):
        return {key: _leaves(value, leaf, tuples) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuples(_leaves(value, leaf, tuples) for value in batch)
    return leaf(np.asarray(batch))

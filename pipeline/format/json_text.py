"""JSON text columns: ``info`` and ``reset_options`` hold any JSON value, stored as its text."""

from __future__ import annotations

import itertools
import json
import operator
import re
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.errors import SchemaError


def column(field: pa.Field, values: Any) -> pa.Array:
    """``info`` and ``reset_options`` take dicts (serialized here) or JSON text (checked here).

    Arrow text is checked in place: only its non-null rows are parsed (an upload's ``info`` is
    mostly null, and listing every row cost most of validating the batch).
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array) and pa.types.is_string(values.type):
        present = values.is_valid()
        rows = np.flatnonzero(present.to_numpy(zero_copy_only=False))
        for row, given in zip(rows.tolist(), values.filter(present).to_pylist(), strict=True):
            _checked(field.name, given, row)
        return values
    if isinstance(values, pa.Array):
        values = values.to_pylist()
    if all(map(operator.is_, values, itertools.repeat(None))):  # most steps carry no info
        return pa.nulls(len(values), pa.string())
    texts = [_checked(field.name, value, row) for row, value in enumerate(values)]
    try:
        return pa.array(texts, type=pa.string())
    except UnicodeEncodeError as error:  # a lone surrogate: JSON text carries it, UTF-8 cannot
        row = next(i for i, got in enumerate(texts) if got and _SURROGATE.search(got))
        raise SchemaError.single(field.name, "UTF-8 text", error.reason, row) from None


_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, always lone: UTF-8 cannot encode it


def _checked(name: str, value: Any, row: int) -> str | None:
    try:
        return text(value)
    except json.JSONDecodeError:
        raise SchemaError.single(name, "JSON text", repr(value[:40]), row) from None
    except (TypeError, ValueError) as error:
        raise SchemaError.single(name, "JSON-serializable data", str(error), row) from None


def text(value: Any) -> str | None:
    """An info or reset-options value as the JSON text stored (text must be JSON already)."""
    if value is None:
        return None
    if isinstance(value, str):
        json.loads(value)
        return value
    return json.dumps(value, allow_nan=False, default=default)


def default(value: Any) -> Any:
    """numpy scalars and arrays are common in ``info`` dicts; anything else is refused."""
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")

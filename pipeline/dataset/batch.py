"""The one ``Batch`` type every reader yields and every trainer takes.

Fields are the step table's columns in plural (``observation`` -> ``observations``). A field is None
when its column was not read. Observations and actions of Dict and Tuple spaces are dicts and
tuples of arrays, nested like the space; everything else is a numpy array with the batch first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.format import schema
from pipeline.format.schema import length

# Step-table column -> Batch field: the plural, where it has one.
_SAME = ("training_enabled", "logged_at")
FIELD_OF_COLUMN = {
    name: "ts" if name == "t" else name if name in _SAME else f"{name}s"
    for name in schema.STEP_COLUMNS
}
COLUMN_OF_FIELD = {value: key for key, value in FIELD_OF_COLUMN.items()}


@dataclass(frozen=True)
class Batch:
    """A batch of transitions (or one whole episode), as named arrays.

    ``extras`` carries what trainers derive (advantages, returns) under their own names, so the
    type stays one for every algorithm.
    """

    observations: Any = None
    actions: Any = None
    rewards: Any = None
    next_observations: Any = None
    terminateds: Any = None
    truncateds: Any = None
    action_logps: Any = None
    policy_versions: Any = None
    episode_ids: Any = None
    agent_ids: Any = None
    ts: Any = None
    training_enabled: Any = None
    infos: Any = None
    client_ids: Any = None
    logged_at: Any = None
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value is not None:
                return length(value)
        return 0

    def __getitem__(self, index: Any) -> Batch:
        """Rows by slice, integer array or boolean mask, on every field at once."""
        if isinstance(index, np.ndarray) and index.dtype.kind in "iu":
            # np.take is ~10x faster than fancy indexing on (N, d) arrays
            return self.map(lambda array: np.take(array, index, axis=0))
        return self.map(lambda array: array[index])

    @staticmethod
    def concat(batches: Iterable[Batch]) -> Batch:
        """The rows of all, in order; a field or extra missing from any of them is dropped."""
        parts = list(batches)
        if len(parts) <= 1:
            return parts[0] if parts else Batch()
        fields = {
            name: join([getattr(part, name) for part in parts])
            for name in _FIELD_NAMES
            if all(getattr(part, name) is not None for part in parts)
        }
        shared = [key for key in parts[0].extras if all(key in part.extras for part in parts)]
        extras = {key: join([part.extras[key] for part in parts]) for key in shared}
        return Batch(**fields, extras=extras)

    def map(self, function: Any) -> Batch:
        """Apply ``function`` to every array, through nested dicts and tuples.

        Readers call this for every batch they yield, so plain arrays skip the recursion.
        """
        fields = {}
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if value is not None:
                plain = type(value) is np.ndarray
                fields[name] = function(value) if plain else map_leaves(function, value)
        extras = {key: map_leaves(function, value) for key, value in self.extras.items()}
        return Batch(**fields, extras=extras)

    def split(self, size: int) -> list[Batch]:
        """Consecutive batches of ``size`` rows (the last may be shorter), all views.

        Each field is cut once for all batches (``torch.split`` for tensors) instead of once
        per batch: readers cut every scanned chunk this way, because slicing field by field per
        batch cost the reader more than scanning the files did.
        """
        starts = range(0, len(self), size)
        fields = {
            name: _split(value, size, starts)
            for name in _FIELD_NAMES
            if (value := getattr(self, name)) is not None
        }
        extras = {key: _split(value, size, starts) for key, value in self.extras.items()}
        return [
            _make(
                {name: parts[i] for name, parts in fields.items()},
                {key: parts[i] for key, parts in extras.items()},
            )
            for i in range(len(starts))
        ]

    def replace(self, **changes: Any) -> Batch:
        return dataclasses.replace(self, **changes)

    def to_torch(self, device: Any = "cpu") -> Batch:
        """Numeric arrays become tensors on ``device``; string and object arrays stay numpy.

        On the CPU a tensor shares memory with the batch's array where it can (no copy), so
        in-place ops on one show in the other. Arrays numpy marks read-only (zero-copy views of
        Arrow memory) are copied, since torch must not write into Arrow's buffers.
        """
        import torch  # torch is needed only by those who ask for tensors

        def convert(array: Any) -> Any:
            if isinstance(array, np.ndarray) and array.dtype.kind in "biuf":
                if not array.flags.writeable:
                    array = array.copy()
                return torch.as_tensor(array, device=device)
            return array

        return self.map(convert)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Batch) if f.name != "extras")


def _make(fields: dict[str, Any], extras: dict[str, Any]) -> Batch:
    """A Batch without the dataclass ``__init__``, which costs more than the slicing around it.

    Fields left out keep their class-level default (None); ``extras`` has none, so it is set.
    """
    batch = object.__new__(Batch)
    batch.__dict__.update(fields)
    batch.__dict__["extras"] = extras
    return batch


def _split(value: Any, size: int, starts: range) -> list[Any]:
    if isinstance(value, Mapping):
        parts = {key: _split(item, size, starts) for key, item in value.items()}
        return [{key: cut[i] for key, cut in parts.items()} for i in range(len(starts))]
    if isinstance(value, tuple):
        items = [_split(item, size, starts) for item in value]
        return [tuple(cut[i] for cut in items) for i in range(len(starts))]
    if type(value).__module__.partition(".")[0] == "torch":
        return list(value.split(size))
    return [value[start : start + size] for start in starts]


def join(values: list[Any]) -> Any:
    """Values of one field (arrays, or dicts and tuples of them) as one, rows in order."""
    first = values[0]
    if isinstance(first, Mapping):
        return {key: join([value[key] for value in values]) for key in first}
    if isinstance(first, tuple):
        return tuple(join([value[i] for value in values]) for i in range(len(first)))
    if type(first).__module__.partition(".")[0] == "torch":
        import torch  # a batch already on torch (``InputReader(..., device=...)``)

        return torch.cat(values)
    return np.concatenate([np.asarray(value) for value in values])


def map_leaves(function: Any, value: Any) -> Any:
    """``function`` of each array of a value, in its dicts and tuples (Dict and Tuple spaces)."""
    if isinstance(value, Mapping):
        return {key: map_leaves(function, item) for key, item in value.items()}
    if isinstance(value, tuple):
        return tuple(map_leaves(function, item) for item in value)
    return function(value)

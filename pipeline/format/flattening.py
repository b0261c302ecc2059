"""Flat float vectors of a space's values, the input layout of every policy and value network.

The layout is ``gymnasium.spaces.flatten``'s (one-hot discretes, Dict in key order, Box
row-major), so a network built for gymnasium's flattening reads logged data unchanged; but a whole
column or batch is flattened at once, not row by row.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from pipeline.format.codec import from_arrow
from pipeline.format.schema import length
from pipeline.format.spaces import split_value, subspaces, unsupported

# --- Flat vectors for networks -----------------------------------------------------------------


@functools.singledispatch
def flatdim(space: gym.Space[Any]) -> int:
    """Width of the rows :func:`flatten` makes (as ``gymnasium.spaces.flatdim``)."""
    raise unsupported(space)


flatdim.register(Box, lambda space: math.prod(space.shape))
flatdim.register(MultiBinary, lambda space: math.prod(space.shape))
flatdim.register(Discrete, lambda space: int(space.n))
flatdim.register(MultiDiscrete, lambda space: int(space.nvec.sum()))
flatdim.register(Dict, lambda space: sum(flatdim(sub) for _, sub in subspaces(space)))
flatdim.register(Tuple, lambda space: sum(flatdim(sub) for _, sub in subspaces(space)))


def flatten(space: gym.Space[Any], array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column as float32 rows of width :func:`flatdim`, to feed a neural network."""
    return flatten_batch(space, from_arrow(space, array))


def flatten_batch(space: gym.Space[Any], batch: Any) -> np.ndarray:
    """A batch in :func:`to_arrow`'s layout (numpy, not Arrow) flattened as :func:`flatten` does.

    The client's numpy policy and the server's remote inference take observations as they come
    from an env, so they flatten without a round trip through Arrow.
    """
    out = np.zeros((length(batch), flatdim(space)), np.float32)
    _flatten_into(space, batch, out)
    return out


@functools.singledispatch
def _flatten_into(space: gym.Space[Any], batch: Any, out: np.ndarray) -> None:
    raise unsupported(space)


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
    for (_, sub), part in zip(subspaces(space), split_value(space, batch), strict=True):
        _flatten_into(sub, part, out[:, column : column + flatdim(sub)])
        column += flatdim(sub)

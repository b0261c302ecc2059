"""Seeded samples of a space, many at once, in :mod:`pipeline.format.codec`'s batch layout."""

from __future__ import annotations

import functools
from typing import Any, cast

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

from pipeline.format.spaces import assemble, subspaces, unsupported


def sample_batch(space: gym.Space[Any], n: int, seed: int) -> Any:
    """``n`` seeded samples of ``space``, in the batch layout :mod:`~pipeline.format.codec`
    encodes.

    Vectorized (``space.sample()`` in a loop is slow), so tests and benchmarks can make a million
    rows quickly; every value is finite, so the batch always passes ``codec.to_arrow``.
    """
    return _sample(space, n, np.random.default_rng(seed))


@functools.singledispatch
def _sample(space: gym.Space[Any], n: int, rng: np.random.Generator) -> Any:
    raise unsupported(space)


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
@_sample.register(MultiDiscrete)
def _sample_discrete(space: Discrete | MultiDiscrete, n: int, rng: np.random.Generator) -> Any:
    high = space.start + (space.n if isinstance(space, Discrete) else space.nvec)
    return rng.integers(space.start, high, (n, *np.shape(space.start))).astype(space.dtype)


@_sample.register(MultiBinary)
def _sample_multi_binary(space: MultiBinary, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, 2, (n, *space.shape), np.int8)


@_sample.register(Dict)
@_sample.register(Tuple)
def _sample_container(space: Dict | Tuple, n: int, rng: np.random.Generator) -> Any:
    return assemble(space, [_sample(sub, n, rng) for _, sub in subspaces(space)])

"""The checks of a small append logged as a line, beside what the log's encoder checks.

``rowlog.RowEncoder`` takes each value as its column's Arrow type (none missing, finite floats,
JSON text), so these need check only the rest of what
:func:`~pipeline.format.schema.steps_from_columns` refuses; they say only "not valid", and on
False the caller runs the full validation, whose error names the row and field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.errors import SchemaError
from pipeline.format import codec
from pipeline.format.schema import END_REASONS


def step_values_fit(
    columns: Mapping[str, Any], observation_space: gym.Space[Any], action_space: gym.Space[Any]
) -> bool:
    """Non-empty episode ids, ``t`` >= 0, and observations and actions their spaces keep."""
    if not all(columns["episode_id"]) or min(columns["t"]) < 0:  # strings, ints: encoder-checked
        return False
    spaces = {
        "observation": observation_space,
        "next_observation": observation_space,
        "action": action_space,
    }
    return all(_values_fit(space, columns[name]) for name, space in spaces.items())


def _values_fit(space: gym.Space[Any], values: Any) -> bool:
    """Whether values the encoder took as the space's Arrow type (lists: flat or shaped, of the
    right size) are ones ``codec.to_arrow`` keeps."""
    if isinstance(space, gym.spaces.Discrete):
        return bool(min(values) >= space.start and max(values) < space.start + space.n)
    if isinstance(space, gym.spaces.Box) and space.dtype.kind == "f":
        return True  # the encoder refused NaN, infinity and values beyond the dtype
    try:
        shape: tuple[int, ...] = space.shape or ()
        codec.to_arrow(space, np.asarray(values).reshape(len(values), *shape))
    except (SchemaError, ValueError, TypeError):
        return False
    return True


def episode_values_fit(columns: Mapping[str, Any]) -> bool:
    """:func:`step_values_fit` for episodes: non-empty ids, lengths >= 0, known end reasons,
    and no episode ending before it started (times of one type; others take the full checks)."""
    try:
        ordered = all(
            start <= end
            for start, end in zip(columns["started_at"], columns["ended_at"], strict=True)
        )
    except (TypeError, ValueError):
        return False
    return (
        ordered
        and all(columns["episode_id"])
        and min(columns["length"]) >= 0
        and all(reason in END_REASONS for reason in columns["end_reason"])
        and all(seed is None or seed >= 0 for seed in columns["seed"])  # < 2**63: encoder-checked
    )

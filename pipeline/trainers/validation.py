"""Checks shared by the trainers' config dataclasses; each raises ConfigError naming the field."""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError
from pipeline.policy.checkpoint import ACTIVATIONS


def positive(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(type(config).__name__, name, "a number > 0", value)


def non_negative(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise ConfigError(type(config).__name__, name, "a number >= 0", value)


def unit_interval(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ConfigError(type(config).__name__, name, "a number in [0, 1]", value)


def counts(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(type(config).__name__, name, "an integer >= 1", value)


def network(config: Any) -> None:
    """``hidden`` and ``activation``, as :class:`pipeline.policy.ModelSpec` will demand them."""
    owner = type(config).__name__
    hidden = config.hidden
    if (
        not isinstance(hidden, tuple)
        or not hidden
        or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in hidden)
    ):
        raise ConfigError(owner, "hidden", "a non-empty tuple of positive integers", hidden)
    if config.activation not in ACTIVATIONS:
        raise ConfigError(owner, "activation", f"one of {ACTIVATIONS}", config.activation)

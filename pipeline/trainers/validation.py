"""Checks shared by the trainers' and loops' configs; each raises ConfigError naming the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.errors import ConfigError
from pipeline.policy.checkpoint import ACTIVATIONS


def positive(config: Any, *names: str, owner: str | None = None) -> None:
    _check(config, names, "a number > 0", lambda v: _number(v) and v > 0, owner)


def non_negative(config: Any, *names: str, owner: str | None = None) -> None:
    _check(config, names, "a number >= 0", lambda v: _number(v) and v >= 0, owner)


def unit_interval(config: Any, *names: str, owner: str | None = None) -> None:
    _check(config, names, "a number in [0, 1]", lambda v: _number(v) and 0 <= v <= 1, owner)


def optional_number(config: Any, *names: str) -> None:
    _check(config, names, "a number or None", lambda v: v is None or _number(v), None)


def counts(config: Any, *names: str, owner: str | None = None) -> None:
    _check(
        config,
        names,
        "an integer >= 1",
        lambda v: _number(v) and isinstance(v, int) and v >= 1,
        owner,
    )


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


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check(
    config: Any, names: tuple[str, ...], expected: str, ok: Callable[[Any], bool], owner: str | None
) -> None:
    for name in names:
        value = getattr(config, name)
        if not ok(value):
            raise ConfigError(owner or type(config).__name__, name, expected, value)

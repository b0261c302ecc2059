"""server/messages.py: a JSON body nested deeper than MAX_DEPTH is refused, whatever its strings
hold. The depth is read from the body's bytes, so the property test writes documents whose
strings are full of brackets, quotes and backslashes, in both of json's escaping styles, and
nests them around the limit."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.errors import ApiError
from server.messages import MAX_DEPTH, parse_json

_TRICKY = st.text(alphabet=st.sampled_from('[]{}"\\/ aé\n\u2028'), max_size=6)
_NUMBERS = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
_VALUES = st.recursive(
    st.none() | st.booleans() | _NUMBERS | _TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
    max_leaves=12,
)


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in ``value`` (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_VALUES, st.integers(-2, 2), st.booleans(), st.booleans())
def test_a_body_is_refused_exactly_when_it_nests_deeper_than_the_limit(
    value: Any, offset: int, ascii_only: bool, spaced: bool
) -> None:
    doc: Any = {"info": value}
    for i in range(max(0, MAX_DEPTH - _depth(doc) + offset)):  # objects and arrays in turn
        doc = [doc, "{"] if i % 2 else {"info": doc, "x": "]"}
    doc = {"doc": doc}
    separators = (", ", ": ") if spaced else (",", ":")
    body = json.dumps(doc, ensure_ascii=ascii_only, separators=separators).encode()
    if _depth(doc) <= MAX_DEPTH:
        assert parse_json(body, "application/json") == doc
    else:
        with pytest.raises(ApiError, match=f"nested at most {MAX_DEPTH} deep"):
            parse_json(body, "application/json")

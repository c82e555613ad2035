"""json_text.dumps_indented: byte for byte what ``json.dumps(data, indent=1)`` writes, errors included."""

from __future__ import annotations

import enum
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.json_text import dumps_indented

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
KEYS = st.text(max_size=6) | st.integers(-5, 5) | st.floats(allow_nan=False) | st.booleans() | st.none()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_same_text_as_json_dumps(value: object) -> None:
    assert dumps_indented(value) == json.dumps(value, indent=1)


class Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, None, True, "é\n"], "b": {}, "c": [], "d": [[], {}, [[1]]]},
    [math.nan, math.inf, -math.inf, -0.0, 10**30],
    {"colour": Colour.RED, "nested": {"x": [Colour.RED]}},  # a subclass: the standard encoder's own rendering
    {1: "int key", None: [1], 2.5: {"k": False}},
])
def test_edge_cases(value: object) -> None:
    assert dumps_indented(value) == json.dumps(value, indent=1)


def test_errors_are_the_standard_ones() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_indented({"a": [1, {2, 3}]})
    loop: list[object] = []
    loop.append([loop])
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented({"a": loop})

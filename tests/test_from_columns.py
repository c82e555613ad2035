"""``from_columns``: records made from columns are the constructor's records, and bad calls are refused."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpplan.from_columns import from_columns
from mpplan.liveness import LiveRange, live_ranges
from mpplan.plan import Buffer
from strategies import graphs, random_order

rows = st.lists(st.tuples(st.text(max_size=3), st.integers(0, 2**70), st.integers(0, 2**70)), max_size=20)


@given(rows)
def test_records_equal_the_constructors(values: list[tuple[str, int, int]]) -> None:
    made = from_columns(Buffer, *([row[i] for row in values] for i in range(3)))
    expected = [Buffer(*row) for row in values]
    assert made == expected
    assert [hash(b) for b in made] == [hash(b) for b in expected]
    assert all(type(b) is Buffer for b in made)


def test_records_stay_frozen() -> None:
    (buffer,) = from_columns(Buffer, ["gpu0"], [0], [64])
    with pytest.raises(dataclasses.FrozenInstanceError):
        buffer.offset = 1  # type: ignore[misc]
    assert dataclasses.replace(buffer, offset=64) == Buffer("gpu0", 64, 64)


def test_bad_calls_are_refused() -> None:
    @dataclass(frozen=True)
    class Unslotted:
        a: int

    with pytest.raises(TypeError, match="one column per field"):
        from_columns(Buffer, ["gpu0"], [0])  # a field left without a column
    with pytest.raises(TypeError, match="slotted"):
        from_columns(Unslotted, [1])
    with pytest.raises(ValueError, match="differ in length"):
        from_columns(Buffer, ["gpu0", "gpu0"], [0], [64, 64])


@given(graphs(), st.randoms(use_true_random=False))
def test_live_ranges_pass_the_constructors_check(graph, rng) -> None:  # type: ignore[no-untyped-def]
    """``live_ranges`` skips ``LiveRange``'s check as valid by construction: the check accepts each range."""
    ranges = live_ranges(graph, random_order(graph, rng)).ranges
    assert ranges == tuple(LiveRange(r.storage, r.nbytes, r.first, r.last) for r in ranges)
    assert all(type(r) is LiveRange for r in ranges)

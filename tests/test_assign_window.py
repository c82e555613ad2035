"""Tests for ``mpplan.passes.assign.window``: re-packing some records under a cap, the rest held.

The answer is held to a brute force written here (every integer offset of every free
record, sharing no code with the MILP) on tiny instances: ``packed`` exactly when some
offsets exist, and then a valid packing (checked by the validator here) that moves
only the free records and keeps them under the cap and at or above the lowest of them.
"""

from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.passes.assign import assign_offsets
from mpplan.passes.assign import window as window_module
from mpplan.passes.assign.window import repack_under

UNIT = 8


def _clash(sizes: list[int], first: list[int], last: list[int], offsets: list[int], i: int, j: int) -> bool:
    in_time = first[i] <= last[j] and first[j] <= last[i]
    in_memory = offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]
    return in_time and in_memory


def _valid(sizes: list[int], first: list[int], last: list[int], offsets: list[int]) -> bool:
    return not any(_clash(sizes, first, last, offsets, i, j) for i, j in itertools.combinations(range(len(sizes)), 2))


def _exists(sizes: list[int], first: list[int], last: list[int], offsets: list[int], free: list[int], cap: int) -> bool:
    base = min(offsets[j] for j in free)
    ranges = [range(base, cap - sizes[j] + 1, UNIT) for j in free]
    for choice in itertools.product(*ranges):
        trial = list(offsets)
        for j, o in zip(free, choice):
            trial[j] = o
        if _valid(sizes, first, last, trial):
            return True
    return False


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[int], list[int], list[int], list[int], list[int], int]:
    n = draw(st.integers(2, 6))
    sizes = [UNIT * draw(st.integers(1, 3)) for _ in range(n)]
    first = [draw(st.integers(0, 4)) for _ in range(n)]
    last = [a + draw(st.integers(0, 3)) for a in first]
    offsets = list(assign_offsets(list(zip(sizes, first, last)), alignment=UNIT, algorithm="best_fit").offsets)
    free = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=min(n, 4))))
    arena = max(o + s for o, s in zip(offsets, sizes))
    cap = UNIT * draw(st.integers(1, arena // UNIT + 1))
    return sizes, first, last, offsets, free, cap


@settings(max_examples=120, deadline=None)
@given(instances())
def test_repack_matches_brute_force(case: tuple[list[int], list[int], list[int], list[int], list[int], int]) -> None:
    sizes, first, last, offsets, free, cap = case
    found = repack_under(sizes, first, last, offsets, free, cap, 30.0)
    assert found.status == ("packed" if _exists(sizes, first, last, offsets, free, cap) else "infeasible")
    if found.offsets is not None:
        moved = list(found.offsets)
        assert _valid(sizes, first, last, moved)
        base = min(offsets[j] for j in free)
        assert all(base <= moved[j] and moved[j] + sizes[j] <= cap for j in free)
        assert all(moved[k] == offsets[k] for k in range(len(sizes)) if k not in free)


def test_repack_lowers_a_top_the_heuristic_left() -> None:
    """A packing with one record sticking out: re-packing the top records fits it under LOAD."""
    sizes, first, last = [8, 8, 8], [0, 2, 1], [1, 3, 2]
    offsets = [0, 8, 16]  # arena 24, LOAD 16
    assert repack_under(sizes, first, last, offsets, [1, 2], 16, 30.0).status == "infeasible"
    found = repack_under(sizes, first, last, offsets, [0, 1, 2], 16, 30.0)
    assert found.status == "packed" and found.offsets is not None
    assert _valid(sizes, first, last, list(found.offsets))
    assert max(o + s for o, s in zip(found.offsets, sizes)) == 16


def test_doctests() -> None:
    assert doctest.testmod(window_module).failed == 0


def test_a_record_named_twice_is_one_free_record() -> None:
    """Naming a free record twice must not make it avoid itself (a false proof of no room)."""
    sizes, first, last, offsets = [4, 4, 4], [0, 2, 1], [1, 3, 2], [0, 4, 8]
    assert repack_under(sizes, first, last, offsets, [0, 1, 2, 2], 8, 30.0).status == "packed"


@pytest.mark.parametrize("status", ["optimal", "error"])
def test_a_solver_point_that_overlaps_is_an_error_not_a_packing(monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """Values that are no packing (here every free record at one offset), whatever status comes
    with them, are reported as ``error``, never as ``packed``."""
    sizes, first, last, offsets = [4, 4, 4], [0, 2, 1], [1, 3, 2], [0, 4, 8]

    def at_one_offset(milp, backend, time_limit_s):  # type: ignore[no-untyped-def]
        return status, np.array(milp.col_lo), None, None

    monkeypatch.setattr(window_module, "solve_arrays", at_one_offset)
    assert repack_under(sizes, first, last, offsets, [0, 1, 2], 8, 30.0).status == "error"

"""profile_tree: the segment tree's excess and peak, scored and made, against the
naive profile (a dict of step key -> live bytes, changed step by step)."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.passes.remat import profile_tree
from mpplan.passes.remat.profile_tree import Leaves, ProfileTree, Steps

SPAN = 4


def excess(profile: dict[int, int], budget: int) -> int:
    return sum(max(0, v - budget) for v in profile.values())


def leaf_values(profile: dict[int, int]) -> list[list[int]]:
    """The values of each leaf (op), in key order; every op has its own step (its last key)."""
    ops = max(profile) // SPAN + 1
    return [[profile[k] for k in sorted(profile) if k // SPAN == op] for op in range(ops)]


@st.composite
def profiles(draw: st.DrawFn) -> dict[int, int]:
    """A profile over a few ops: each op's own step (key ``op * SPAN + SPAN - 1``) and
    maybe recompute steps before it (lower keys of its leaf)."""
    ops = draw(st.integers(1, 40))
    value = st.integers(-50, 200)
    profile = {op * SPAN + SPAN - 1: draw(value) for op in range(ops)}
    for key in draw(st.sets(st.integers(0, ops * SPAN - 1), max_size=ops)):
        profile.setdefault(key, draw(value))
    return profile


@st.composite
def changes(draw: st.DrawFn, profile: dict[int, int]) -> tuple[list[tuple[int, int, int]], dict[int, int], set[int]]:
    """Runs of added bytes ``(first, last, add)`` over keys, new steps (key -> bytes) in
    free slots below an op's own step, and old recompute steps that go."""
    top = max(profile)
    run = st.tuples(st.integers(0, top), st.integers(0, top), st.integers(-120, 120))
    runs = [(min(a, b), max(a, b), add) for a, b, add in draw(st.lists(run, max_size=6))]
    free = [k for k in range(top) if k not in profile and k % SPAN != SPAN - 1]
    new = {k: draw(st.integers(-50, 250)) for k in draw(st.sets(st.sampled_from(free), max_size=3))} if free else {}
    slots = [k for k in profile if k % SPAN != SPAN - 1]
    gone = draw(st.sets(st.sampled_from(slots), max_size=3)) if slots else set()
    return runs, new, gone


@settings(max_examples=300, deadline=None)
@given(profiles(), st.data())
def test_scores_and_updates_match_the_naive_profile(profile: dict[int, int], data: st.DataObject) -> None:
    """Over a series of changes, each scored then made: the score is the naive change of
    excess and the peak after it, the tree then holds the naive excess and peak, and it
    equals a tree built afresh; nodes valued at once (``DIRECT``) or opened down to
    their leaves alike."""
    direct = data.draw(st.sampled_from([1, 2, 8, profile_tree.DIRECT]))
    with mock.patch.object(profile_tree, "DIRECT", direct):
        check_changes(profile, data)


def check_changes(profile: dict[int, int], data: st.DataObject) -> None:
    budget = data.draw(st.integers(-60, 220))
    tree = ProfileTree.build(leaf_values(profile), budget)
    assert (tree.excess, tree.peak) == (excess(profile, budget), max(profile.values()))
    for _ in range(data.draw(st.integers(1, 6))):
        runs, new, gone = data.draw(changes(profile))
        steps = Steps.of(runs, marks=[*new, *gone])
        after = {k: v + sum(add for a, b, add in runs if a <= k <= b) for k, v in profile.items() if k not in gone}
        after.update(new)
        values = leaf_values(after)
        leaves = Leaves(SPAN, wide={k // SPAN for k in profile if k % SPAN != SPAN - 1}, fresh={k // SPAN for k in new})
        between = lambda a, b: np.array([v for leaf in values[a:b] for v in leaf], np.int64)
        gain, peak = tree.score(steps, leaves, between)
        assert (gain, peak) == (excess(after, budget) - excess(profile, budget), max(after.values()))
        tree.update(steps, leaves, between)
        profile = after
        fresh = ProfileTree.build(values, budget)
        assert (tree.excess, tree.peak) == (excess(profile, budget), max(profile.values()))
        assert tree.over[1] == fresh.over[1]
        if tree.over[1]:  # least over / largest under the budget, where there is one
            assert tree.low[1] == fresh.low[1]
        if tree.over[1] < len(profile):
            assert tree.high[1] == fresh.high[1]


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(-9, 9)), max_size=6),
       st.sets(st.integers(0, 30), max_size=3))
def test_steps_are_the_sum_of_their_runs(runs: list[tuple[int, int, int]], marks: set[int]) -> None:
    runs = [(min(a, b), max(a, b), add) for a, b, add in runs]
    steps = Steps.of(runs, marks=marks)
    for key in range(-2, 34):
        total = sum(add for a, b, add in runs if a <= key <= b)
        assert steps.at(key) == (None if key in marks else total)
        assert steps.gain(key) == (0 if key in marks else total)
    keys = list(range(-2, 34))
    assert steps.gains(np.array(keys)).tolist() == [steps.gain(k) for k in keys]

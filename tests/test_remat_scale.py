"""The budget greedy's fast paths (issue 16, scaling), each held to the simple
computation it replaces on random inputs: the over-budget counts by op, the steps
over the budget between two ops, and the order of the ranked moves."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpplan.capture import synthetic
from mpplan.passes.remat.choice import Choice
from mpplan.passes.remat.model import build_model
from mpplan.passes.remat.moves import in_order, steps_over


@st.composite
def choices(draw: st.DrawFn) -> tuple[Choice, int]:
    """A choice of recomputes on a small random graph (built, then changed by a commit)
    and a budget between 0 and its load."""
    graph = synthetic.random_layered(
        draw(st.integers(6, 40)), seed=draw(st.integers(0, 10_000)),
        degree=draw(st.sampled_from([1.0, 2.0, 3.0])), train=draw(st.booleans()))
    model = build_model(graph)
    candidates = st.sets(st.integers(0, max(model.num_candidates - 1, 0)), max_size=6)
    chosen = draw(candidates) if model.num_candidates else set()
    choice = Choice.build(model, chosen)
    budget = draw(st.integers(0, max(choice.load, 1)))
    if model.num_candidates:
        add, remove = draw(candidates), draw(candidates)
        choice.commit(choice.trial(budget, add=add - remove, remove=remove))
    return choice, budget


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choices())
def test_over_counts_are_a_count_of_the_profile(drawn: tuple[Choice, int]) -> None:
    """``through[p]``: steps over the budget up to op ``p``'s own step; ``own[p]``: its step."""
    choice, budget = drawn
    evaluation = choice.evaluation()
    over = [v > budget for v in evaluation.profile]
    through, own = choice.over_counts(budget)
    assert through.tolist() == [sum(over[: step + 1]) for step in evaluation.orig_step]
    assert own.tolist() == [int(over[step]) for step in evaluation.orig_step]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(choices(), st.data())
def test_steps_over_counts_the_steps_strictly_between_two_ops(drawn: tuple[Choice, int], data: st.DataObject) -> None:
    """Clipping at 0 gives the count for ``y > x`` and 0 otherwise (``y == x`` included)."""
    choice, budget = drawn
    evaluation = choice.evaluation()
    ops = st.integers(0, choice.model.num_ops - 1)
    pairs = data.draw(st.lists(st.tuples(ops, ops), min_size=1, max_size=30))
    through, own = choice.over_counts(budget)
    x, y = (np.array(column, np.int64) for column in zip(*pairs))
    got = steps_over(through, through - own, x, y).tolist()
    step = evaluation.orig_step
    expected = [sum(v > budget for v in evaluation.profile[step[a] + 1 : step[b]]) if b > a else 0 for a, b in pairs]
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_in_order_sorts_by_score_then_members(data: st.DataObject) -> None:
    """The runs of ``in_order`` put together are a stable sort of the rows by (score,
    members as a tuple), however many ties and whatever ``take``."""
    count = data.draw(st.integers(0, 60))
    width = data.draw(st.integers(1, 4))
    cells = st.lists(st.integers(-1, 3), min_size=count, max_size=count)
    members = [np.array(data.draw(cells), np.int64) for _ in range(width)]
    scores = data.draw(st.lists(st.sampled_from([-2.0, -1.5, -1.0]), min_size=count, max_size=count))
    rows = np.array(data.draw(st.permutations(range(count))), np.int64)[: data.draw(st.integers(0, count))]
    score = np.array(scores, np.float64)[: len(rows)]
    take = data.draw(st.integers(1, 70))
    got = [int(r) for run in in_order(members, rows, score, take) for r in run]
    key = {int(r): (float(s), tuple(int(column[r]) for column in members)) for r, s in zip(rows, score)}
    assert got == sorted(rows.tolist(), key=key.__getitem__)

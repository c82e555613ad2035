"""The peak simulator's fast paths against the records they stand for, on random graphs."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan import sim
from mpplan.graph import Graph
from mpplan.liveness import LiveRange, live_ranges, spans
from strategies import graphs, random_order


def _brute_spans(graph: Graph, order: list[int]) -> dict[int, tuple[int, int]]:
    """First and last step of each touched storage, straight from the memory semantics."""
    topo = graph.topology
    steps: dict[int, list[int]] = {}
    for step, k in enumerate(order):
        for t in (*topo.op_inputs[k], *topo.op_outputs[k]):
            steps.setdefault(topo.storage_of[t], []).append(step)
    end = len(order) - 1
    return {s: (min(at), end if s in topo.output_storages else max(at)) for s, at in steps.items()}


@settings(max_examples=150, deadline=None)
@given(graphs(max_ops=14), st.integers(0, 2**16))
def test_spans_and_ranges_follow_the_semantics(graph: Graph, seed: int) -> None:
    order = random_order(graph, random.Random(seed))
    expected = _brute_spans(graph, order)
    first, last = spans(graph, order)
    assert {s: (first[s], last[s]) for s in range(len(first)) if first[s] >= 0} == expected
    topo = graph.topology
    liveness = live_ranges(graph, order)
    assert [(r.storage, r.first, r.last) for r in liveness.ranges] == [
        (s, *expected[s]) for s in sorted(expected) if not topo.is_static[s]
    ]
    assert liveness.static_bytes == sum(topo.nbytes[s] for s in expected if topo.is_static[s])


@settings(max_examples=150, deadline=None)
@given(graphs(max_ops=14), st.integers(0, 2**16))
def test_order_profile_is_the_profile_of_the_live_ranges(graph: Graph, seed: int) -> None:
    order = random_order(graph, random.Random(seed))
    ranges = live_ranges(graph, order).ranges
    assert sim.order_profile(graph, order) == sim.live_profile(ranges, len(order))
    assert sim.order_load(graph, order) == sim.load(ranges, len(order))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12).flatmap(lambda steps: st.tuples(st.just(steps), st.lists(
    st.tuples(st.integers(0, 2**40), st.integers(0, steps - 1), st.integers(0, steps - 1)), max_size=20))))
def test_live_profile_array_is_the_live_profile(case: tuple[int, list[tuple[int, int, int]]]) -> None:
    """The int64 sweep the scheduler and the assigner share equals the loop over ranges, ranges
    sharing steps, starting at step 0 and ending at the last step included."""
    steps, spans_ = case
    ranges = [LiveRange(j, size, min(a, b), max(a, b)) for j, (size, a, b) in enumerate(spans_)]
    columns = [np.array([getattr(r, f) for r in ranges], dtype=np.int64) for f in ("nbytes", "first", "last")]
    found = sim.live_profile_array(*columns, steps)
    assert found.dtype == np.int64
    assert found.tolist() == sim.live_profile(ranges, steps)

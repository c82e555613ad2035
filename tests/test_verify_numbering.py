"""The verifier's replay numbers tensors by the graph's cached topology when it has one, else by its own
count: both must give the same verdict, word for word, on good plans and on shuffled (mostly broken) ones."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import device
from mpplan.errors import VerificationError
from mpplan.graph import Graph, Op
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from strategies import graphs

EXACT = PlannerSettings(schedule="as_given", assign="greedy_by_size", alignment=1)


def _verdict(graph: Graph, p) -> object:
    try:
        return verify(graph, p)
    except VerificationError as exc:
        return str(exc)


def _twice(op: Op) -> Op:
    """``op`` listing its first input, and its first in-place output, twice (the topology lists each once)."""
    again = tuple(t for t in op.outputs if t in op.inputs)[:1]
    return replace(op, inputs=op.inputs[:1] + op.inputs, outputs=op.outputs + again)


@settings(max_examples=150, deadline=None)
@given(graphs(max_ops=10), st.randoms(use_true_random=False), st.booleans())
def test_replay_gives_one_verdict_with_or_without_the_cached_topology(graph, rng, listed_twice):
    if listed_twice:
        graph = replace(graph, ops=tuple(_twice(o) if o.inputs else o for o in graph.ops)).validate()
    p = plan(graph, [device(1 << 30)], EXACT)
    schedule = list(p.schedule)
    rng.shuffle(schedule)
    for candidate in (p, replace(p, schedule=tuple(schedule))):
        fresh = Graph(graph.name, graph.tensors, graph.ops, graph.outputs)  # same graph, nothing cached
        assert "topology" in vars(graph) and "topology" not in vars(fresh)
        assert _verdict(fresh, candidate) == _verdict(graph, candidate)
    assert not isinstance(_verdict(graph, p), str)

"""The verifier reads the graph's ``Topology`` (the planner's view) only as a cache of numbers that it
proves against the names first: a fault in the topology must not change a verdict.

Each example takes a planned graph (``test_verify_fuzz.planned``), its plan untouched or tampered
with, corrupts one number of the graph's cached topology (a tensor's or an op's number, an op's
input or output), and compares the verdict with the one on the same graph with a sound topology.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Buffer, DevicePlan, Plan
from mpplan.planner import rematerialised
from mpplan.verify import verify
from test_verify_fuzz import TAMPERS, _truth, planned


def _with_topology(graph: Graph, **wrong: object) -> Graph:
    """A copy of ``graph`` whose cached topology has the fields ``wrong`` replaced."""
    copy = Graph(graph.name, graph.tensors, graph.ops, graph.outputs)
    copy.__dict__["topology"] = replace(graph.topology, **wrong)
    return copy


def _verdict(graph: Graph, p: Plan) -> object:
    try:
        return verify(graph, p, truth=_truth(p))
    except VerificationError as exc:
        return str(exc)


def _corrupted(graph: Graph, data: st.DataObject) -> Graph | None:
    """``graph`` with one number of its topology wrong, or ``None`` where there is nothing to change."""
    topo = graph.topology
    field = data.draw(st.sampled_from(("tensor_index", "op_index", "op_inputs", "op_outputs")))
    event(field)
    if field in ("tensor_index", "op_index"):
        index = dict(getattr(topo, field))
        if len(index) < 2:
            return None
        a, b = data.draw(st.lists(st.sampled_from(sorted(index)), min_size=2, max_size=2, unique=True))
        index[a], index[b] = index[b], index[a]
        return _with_topology(graph, **{field: index})
    listed = [list(numbers) for numbers in getattr(topo, field)]
    at = [k for k, numbers in enumerate(listed) if numbers]
    if not at or len(graph.tensors) < 2:
        return None
    k = data.draw(st.sampled_from(at))
    j = data.draw(st.integers(0, len(listed[k]) - 1))
    n = len(graph.tensors)  # other tensors' numbers, their negative twins (t - n names t from the end) and past the end
    listed[k][j] = data.draw(st.sampled_from([t for t in range(-n, n + 2) if t != listed[k][j]]))
    return _with_topology(graph, **{field: tuple(map(tuple, listed))})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(planned(), st.data())
def test_a_wrong_number_in_the_topology_changes_no_verdict(case: tuple[Graph, Plan], data: st.DataObject) -> None:
    graph, p = case
    corrupted = _corrupted(graph, data)
    if corrupted is None:
        return
    tamper = data.draw(st.sampled_from(TAMPERS))
    broken = tamper(data, rematerialised(graph, p), p)
    for candidate in (p, broken) if broken is not None else (p,):
        assert _verdict(corrupted, candidate) == _verdict(graph, candidate)


def test_a_topology_that_drops_a_read_does_not_free_the_tensor_early() -> None:
    """``g`` reads ``y``; a topology that says it reads ``x`` would end ``y`` at ``f``, so ``z`` could take
    ``y``'s bytes while ``g`` still reads them.  The verifier goes by the names: an overlap."""
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("y", 8), Tensor("z", 8))
    ops = (Op("f", "f", ("x",), ("y",)), Op("g", "g", ("x", "y"), ("z",)))
    graph = Graph("g", tensors, ops, ("z",)).validate()
    shared = Plan("g", graph.content_hash, (DevicePlan("gpu0", 64, 8, 8, 16, 16),), ("f", "g"),
                  {"f": "gpu0", "g": "gpu0"}, {"y": Buffer("gpu0", 0, 8), "z": Buffer("gpu0", 0, 8)},
                  max_peak_bytes=16)
    x, y = graph.topology.tensor_index["x"], graph.topology.tensor_index["y"]
    blind = _with_topology(graph, op_inputs=(graph.topology.op_inputs[0], (x, x)))
    for candidate in (graph, blind):
        try:
            verify(candidate, shared)
        except VerificationError as exc:
            assert "overlap" in str(exc) or "y" in str(exc), str(exc)
        else:
            raise AssertionError("a plan that gives y's bytes to z while g reads y verified")

"""Every placement, with and without ``parallel_safe``, writes plans the verifier accepts.

Regression for the reliability issue: with ``parallel_safe: true``, pipeline, shift and
auto placements on DAGs with branches and parameters shared between modules gave plans
the verifier rejected ("share memory but may run concurrently"): it counted an op that
reads a tensor's *copy* on another device as a user of the tensor's own buffer.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpplan.config import Device
from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Buffer, Copy, DevicePlan, Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from strategies import graphs

PLACEMENTS = ("single", "manual", "pipeline", "shift", "auto")
MODULES = ("enc", "enc.a", "enc.b", "dec", "dec.a")


@st.composite
def modular_graphs(draw: st.DrawFn) -> Graph:
    """A random DAG whose ops belong to modules, so parameters are shared between modules."""
    graph = draw(graphs(max_ops=14, min_ops=2))
    ops = tuple(
        Op(o.name, o.type, o.inputs, o.outputs, o.cost, o.device, o.backward_of, draw(st.sampled_from(MODULES)))
        for o in graph.ops
    )
    return Graph(graph.name, graph.tensors, ops, graph.outputs).validate()


def written(result: Plan) -> Plan:
    """The plan as ``plan.json`` holds it: written and read back."""
    return Plan.from_dict(json.loads(json.dumps(result.to_dict())))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    modular_graphs(),
    st.sampled_from(PLACEMENTS),
    st.booleans(),
    st.integers(2, 3),
    st.integers(40, 600),
)
def test_every_placement_verifies(graph: Graph, placement: str, parallel_safe: bool, count: int, capacity: int):
    devices = [Device(name=f"gpu{i}", capacity=capacity) for i in range(count)]
    device_map = {"enc": "gpu0", "dec": f"gpu{count - 1}"} if placement == "manual" else {}
    chosen = PlannerSettings(placement=placement, parallel_safe=parallel_safe, alignment=1, device_map=device_map)
    result = written(plan(graph, devices, chosen))
    verify(graph, result, check_capacity=False)
    assert result.settings["parallel_safe"] is parallel_safe


def copied_branches() -> Graph:
    """``a`` is made on the first device and read on the second by two parallel ops through one copy;
    on the first device only the copy touches ``a`` after ``A``, so ``c`` (made after the copy and one
    of the readers) may reuse ``a``'s bytes even with ``parallel_safe``."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("a", 64),
        Tensor("r1", 8),
        Tensor("r2", 8),
        Tensor("c", 64),
        Tensor("y", 8),
    )
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("R1", "f", ("a",), ("r1",)),
        Op("R2", "f", ("a",), ("r2",)),
        Op("C", "f", ("r1",), ("c",)),
        Op("Y", "f", ("c", "r2"), ("y",)),
    )
    return Graph("copied", tensors, ops, ("y",)).validate()


def test_remote_readers_do_not_pin_the_source_buffer():
    graph = copied_branches()
    copies = (
        Copy("a@gpu1", "a", "gpu0", "gpu1", 64),
        Copy("r1@gpu0", "r1", "gpu1", "gpu0", 8),
        Copy("r2@gpu0", "r2", "gpu1", "gpu0", 8),
    )
    schedule = ("A", "a@gpu1", "R1", "R2", "r1@gpu0", "C", "r2@gpu0", "Y")
    placement = {name: "gpu1" if name in ("a@gpu1", "R1", "R2") else "gpu0" for name in schedule}
    buffers = {
        "a": Buffer("gpu0", 0, 64),
        "c": Buffer("gpu0", 0, 64),  # a's bytes: on gpu0 only A and the copy touch a, both before C
        "r1@gpu0": Buffer("gpu0", 64, 8),
        "r2@gpu0": Buffer("gpu0", 72, 8),
        "y": Buffer("gpu0", 80, 8),
        "a@gpu1": Buffer("gpu1", 0, 64),
        "r1": Buffer("gpu1", 64, 8),
        "r2": Buffer("gpu1", 72, 8),
    }
    devices = (DevicePlan("gpu0", 1000, 8, 88, 96, 88), DevicePlan("gpu1", 1000, 0, 80, 80, 80))
    good = Plan("copied", graph.content_hash, devices, schedule, placement, buffers, copies,
                max_peak_bytes=96, cross_device_bytes=80, settings={"parallel_safe": True, "alignment": 1})
    verify(graph, good)
    # R2 reads a's copy; were it to read a itself on gpu0, C (not after R2) could clobber it.
    local = replace(
        good,
        devices=(devices[0], DevicePlan("gpu1", 1000, 0, 80, 80, 72)),
        schedule=tuple(s for s in schedule if s != "r2@gpu0"),
        placement={**{k: v for k, v in placement.items() if k != "r2@gpu0"}, "R2": "gpu0"},
        buffers={**{k: v for k, v in buffers.items() if k != "r2@gpu0"}, "r2": Buffer("gpu0", 72, 8)},
        copies=copies[:2],
        cross_device_bytes=72,
    )
    with pytest.raises(VerificationError, match="parallel_safe: tensors '(a|c)' and '(a|c)' share memory"):
        verify(graph, local)

"""The verifier accepts planner output and rejects each kind of hand-corrupted plan by name."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import chain, device, diamond, tiny
from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Buffer, Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify

EXACT = PlannerSettings(schedule="as_given", assign="greedy_by_size", alignment=1)


def planned(graph: Graph, settings: PlannerSettings = EXACT, capacity: int = 1 << 30) -> Plan:
    result = plan(graph, [device(capacity)], settings)
    verify(graph, result)
    return result


def corrupt_buffers(p: Plan, **changes: Buffer) -> Plan:
    return replace(p, buffers={**p.buffers, **changes})


def test_planner_output_verifies():
    for graph in (chain(6), diamond(), tiny()):
        report = verify(graph, planned(graph))
        assert report.ops == len(graph.ops)


def test_overlapping_offsets_rejected():
    graph = diamond()
    p = planned(graph)
    b, c = p.buffers["b"], p.buffers["c"]  # live together until D runs
    small, large = sorted((b, c), key=lambda buf: buf.bytes)
    name = "b" if small is b else "c"
    bad = corrupt_buffers(p, **{name: replace(small, offset=large.offset)})
    with pytest.raises(VerificationError, match=r"tensors '(b|c)' and '(b|c)' are live together .* overlap"):
        verify(graph, bad)


def test_broken_order_rejected():
    graph = chain(4)
    p = planned(graph)
    swapped = (p.schedule[1], p.schedule[0], *p.schedule[2:])
    with pytest.raises(VerificationError, match=r"schedule step 0: op 'op1' reads tensor 't0' before it is produced"):
        verify(graph, replace(p, schedule=swapped))


def test_missing_and_duplicate_ops_rejected():
    graph = chain(3)
    p = planned(graph)
    with pytest.raises(VerificationError, match="op 'op2' is never scheduled"):
        verify(graph, replace(p, schedule=p.schedule[:-1]))
    with pytest.raises(VerificationError, match="op 'op0' scheduled twice"):
        verify(graph, replace(p, schedule=(*p.schedule, "op0")))
    with pytest.raises(VerificationError, match="unknown op 'ghost'"):
        verify(graph, replace(p, schedule=("ghost", *p.schedule)))


def test_wrong_peak_rejected():
    graph = chain(4)
    p = planned(graph)
    dev = p.devices[0]
    with pytest.raises(VerificationError, match="peak_bytes .* != static .* \\+ arena"):
        verify(graph, replace(p, devices=(replace(dev, peak_bytes=dev.peak_bytes - 1),)))
    with pytest.raises(VerificationError, match="lower_bound_bytes"):
        verify(graph, replace(p, devices=(replace(dev, lower_bound_bytes=dev.lower_bound_bytes - 1),)))
    with pytest.raises(VerificationError, match="static_bytes claimed"):
        verify(graph, replace(p, devices=(replace(dev, static_bytes=0, peak_bytes=dev.arena_bytes),)))
    with pytest.raises(VerificationError, match="predicted.max_peak_bytes"):
        verify(graph, replace(p, max_peak_bytes=1))


def test_buffer_defects_rejected():
    graph = chain(4)
    p = planned(graph)
    t1 = p.buffers["t1"]
    with pytest.raises(VerificationError, match="buffer of 1 bytes holds a tensor of 64"):
        verify(graph, corrupt_buffers(p, t1=replace(t1, bytes=1)))
    with pytest.raises(VerificationError, match="overruns"):
        verify(graph, corrupt_buffers(p, t1=replace(t1, offset=p.devices[0].arena_bytes)))
    with pytest.raises(VerificationError, match="'t1': dynamic storage without a buffer"):
        verify(graph, replace(p, buffers={k: v for k, v in p.buffers.items() if k != "t1"}))
    with pytest.raises(VerificationError, match="buffer 'w0': not a dynamic storage"):
        verify(graph, corrupt_buffers(p, w0=Buffer("gpu0", 0, 16)))
    aligned = planned(graph, replace(EXACT, alignment=64))
    with pytest.raises(VerificationError, match="not aligned to 64"):
        verify(graph, corrupt_buffers(aligned, t1=replace(aligned.buffers["t1"], offset=aligned.buffers["t1"].offset + 1)))


def test_capacity_and_graph_identity():
    graph = chain(4)
    p = planned(graph)
    dev = p.devices[0]
    small = replace(p, devices=(replace(dev, capacity_bytes=dev.peak_bytes - 1),))
    with pytest.raises(VerificationError, match="exceeds capacity"):
        verify(graph, small)
    verify(graph, small, check_capacity=False)
    with pytest.raises(VerificationError, match="plan is for graph hash"):
        verify(chain(5), p)


def in_place_graph() -> Graph:
    """b is read by R, then overwritten in place by W: R must run before W."""
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("b", 32), Tensor("r", 16), Tensor("y", 16))
    ops = (
        Op("P", "f", ("x",), ("b",)),
        Op("R", "f", ("b",), ("r",)),
        Op("W", "relu_", ("b",), ("b",)),
        Op("Y", "add", ("b", "r"), ("y",)),
    )
    return Graph("inplace", tensors, ops, ("y",)).validate()


def test_in_place_write_moved_before_reader_rejected():
    graph = in_place_graph()
    p = planned(graph)
    moved = ("P", "W", "R", "Y")
    with pytest.raises(VerificationError, match="op 'R' reads tensor 'b' at version 1, .* version 0"):
        verify(graph, replace(p, schedule=moved))


def test_view_keeps_base_alive():
    """A view read late keeps its base's buffer reserved: sharing it earlier is caught."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("a", 64),
        Tensor("av", 64, alias_of="a"),
        Tensor("c", 64),
        Tensor("y", 8),
    )
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("V", "view", ("a",), ("av",)),
        Op("C", "f", ("x",), ("c",)),
        Op("Y", "f", ("av", "c"), ("y",)),
    )
    graph = Graph("view", tensors, ops, ("y",)).validate()
    p = planned(graph)
    assert "av" not in p.buffers
    bad = corrupt_buffers(p, c=replace(p.buffers["c"], offset=p.buffers["a"].offset))
    with pytest.raises(VerificationError, match="live together"):
        verify(graph, bad)


def two_branches() -> Graph:
    """x -> A -> a -> A2 -> ya and x -> B -> b -> B2 -> yb: a and b never meet in a serial order."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("a", 100),
        Tensor("ya", 4),
        Tensor("b", 100),
        Tensor("yb", 4),
    )
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("A2", "f", ("a",), ("ya",)),
        Op("B", "f", ("x",), ("b",)),
        Op("B2", "f", ("b",), ("yb",)),
    )
    return Graph("branches", tensors, ops, ("ya", "yb")).validate()


def test_parallel_safe_checked():
    graph = two_branches()
    serial = planned(graph)
    assert serial.buffers["a"].offset == serial.buffers["b"].offset, "a serial plan shares a and b"
    with pytest.raises(VerificationError, match="parallel_safe: tensors '(a|b)' and '(a|b)' share memory but may run concurrently"):
        verify(graph, replace(serial, settings={**serial.settings, "parallel_safe": True}))
    safe = planned(graph, replace(EXACT, parallel_safe=True))
    assert safe.buffers["a"].offset != safe.buffers["b"].offset

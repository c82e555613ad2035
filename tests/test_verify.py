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
        moved = replace(aligned.buffers["t1"], offset=aligned.buffers["t1"].offset + 1)
        verify(graph, corrupt_buffers(aligned, t1=moved))


def test_capacity_and_graph_identity():
    graph = chain(4)
    p = planned(graph)
    dev = p.devices[0]
    small = replace(p, devices=(replace(dev, capacity_bytes=dev.peak_bytes - 1),))
    with pytest.raises(VerificationError, match="exceeds capacity"):
        verify(graph, small)
    verify(graph, small, check_capacity=False)
    # by how much, in human sizes too (regression: raw bytes only, as `mpplan plan` once said it)
    human = rf"by 1 bytes \({dev.peak_bytes} B > {dev.peak_bytes - 1} B, 1 B over\)"
    with pytest.raises(VerificationError, match=human):
        verify(graph, small)
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
    shared = "parallel_safe: tensors '(a|b)' and '(a|b)' share memory but may run concurrently"
    with pytest.raises(VerificationError, match=shared):
        verify(graph, replace(serial, settings={**serial.settings, "parallel_safe": True}))
    safe = planned(graph, replace(EXACT, parallel_safe=True))
    assert safe.buffers["a"].offset != safe.buffers["b"].offset


def _param_grad_graph() -> Graph:
    """``w``'s gradient ``gw`` is made at step 1 and read by nobody; ``y`` is made after it."""
    tensors = (Tensor("x", 64, Kind.INPUT), Tensor("w", 64, Kind.PARAM), Tensor("h", 64),
               Tensor("gw", 64, Kind.GRAD, grad_of="w"), Tensor("y", 64))
    ops = (Op("f", "f", ("x", "w"), ("h",)), Op("g", "g", ("h",), ("gw",)), Op("k", "k", ("h",), ("y",)))
    return Graph("pg", tensors, ops, ("y",))


def test_dynamic_param_grad_held_to_the_end():
    """``grads: dynamic``: a parameter's gradient is held to the end of the step, so a buffer made
    later must not share its bytes, though nothing reads the gradient again."""
    graph = _param_grad_graph()
    p = planned(graph, replace(EXACT, grads="dynamic"))
    gw = p.buffers["gw"]
    with pytest.raises(VerificationError, match=r"tensors 'gw' and 'y' are live together"):
        verify(graph, corrupt_buffers(p, y=replace(p.buffers["y"], offset=gw.offset)))


def test_static_param_grad_counted_as_static():
    """``grads: static``: a parameter's gradient is static (no buffer, counted in static_bytes) along with
    inputs and parameters; a claim that leaves it out, or a buffer for it, is rejected."""
    graph = _param_grad_graph()
    p = planned(graph, replace(EXACT, grads="static"))
    assert "gw" not in p.buffers and p.devices[0].static_bytes == 3 * 64
    dev = p.devices[0]
    short = replace(dev, static_bytes=dev.static_bytes - 64, peak_bytes=dev.peak_bytes - 64,
                    lower_bound_bytes=dev.lower_bound_bytes - 64)
    with pytest.raises(VerificationError, match="static_bytes claimed 128, the graph gives 192"):
        verify(graph, replace(p, devices=(short,), max_peak_bytes=short.peak_bytes))
    with pytest.raises(VerificationError, match="buffer 'gw': not a dynamic storage"):
        verify(graph, corrupt_buffers(p, gw=Buffer("gpu0", 0, 64)))


def test_placement_defects_rejected():
    """On one device, an op placed on a device the plan does not list is named; an op left out of the
    placement runs on the one device.  On two, an op without a device is named."""
    graph = chain(3)
    p = planned(graph)
    with pytest.raises(VerificationError, match="op 'op1': placed on unknown device 'gpu7'"):
        verify(graph, replace(p, placement={**p.placement, "op1": "gpu7"}))
    assert verify(graph, replace(p, placement={k: v for k, v in p.placement.items() if k != "op1"})).ops == 3
    two = replace(p, devices=(p.devices[0], replace(p.devices[0], name="gpu1", static_bytes=0, arena_bytes=0,
                                                    peak_bytes=0, lower_bound_bytes=0)),
                  placement={k: v for k, v in p.placement.items() if k != "op2"})
    with pytest.raises(VerificationError, match="op 'op2': no device in placement"):
        verify(graph, two)

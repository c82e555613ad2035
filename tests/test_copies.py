"""Copy injection on one device, and the reordered graph it returns: the shortcut gives exactly
what the general pass and a rebuilt topology give (the general pass's rules are in test_place.py)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chain
from mpplan.errors import GraphError
from mpplan.graph import Graph, Op, _build_topology, _dependencies, _permuted_dependencies, reordered
from mpplan.liveness import live_ranges
from mpplan.passes.copies import _on_one_device, _with_copies, inject_copies, legalize, listing
from mpplan.passes.place import module_devices
from strategies import graphs, random_order


@settings(max_examples=150, deadline=None)
@given(graphs(max_ops=14), st.integers(0, 2**16))
def test_one_device_shortcut_is_the_general_pass(graph: Graph, seed: int) -> None:
    order = random_order(graph, random.Random(seed))
    assert legalize(graph, order, ["gpu0"] * len(graph.ops)) == ("gpu0",) * len(graph.ops)
    fast = inject_copies(graph, order, ["gpu0"] * len(graph.ops))
    general = _with_copies(graph, order, ["gpu0"] * len(graph.ops))
    assert fast == general  # graph (ops, tensors, outputs), devices, copies
    assert fast.graph.topology == _build_topology(general.graph)


@settings(max_examples=100, deadline=None)
@given(graphs(max_ops=14), st.integers(0, 2**16))
def test_reordered_topology_is_the_rebuilt_one(graph: Graph, seed: int) -> None:
    order = random_order(graph, random.Random(seed))
    ops = [graph.ops[k] for k in order]
    assert reordered(graph, order, ops).topology == Graph(graph.name, graph.tensors, tuple(ops), graph.outputs).topology


@settings(max_examples=200, deadline=None)
@given(graphs(max_ops=14), st.randoms(use_true_random=False), st.booleans())
def test_renumbered_dependencies_are_the_derived_ones_or_none(graph: Graph, rng: random.Random, valid: bool) -> None:
    """``reordered``'s shortcut renumbers the old dependencies only where deriving them for the new
    listing gives the same; any listing, valid or not (then it must decline: the derivation names the op)."""
    if valid:
        order = random_order(graph, rng)
    else:
        order = list(range(len(graph.ops)))
        rng.shuffle(order)
    topo = graph.topology
    position = [0] * len(order)
    for i, k in enumerate(order):
        position[k] = i
    renumbered = _permuted_dependencies(topo, order, position)
    producer = [p if p < 0 else position[p] for p in topo.producer]
    derived = _dependencies([topo.op_inputs[k] for k in order], [topo.op_outputs[k] for k in order], producer,
                            topo.storage_of)
    if renumbered is not None:
        assert renumbered == derived
    in_place = any(set(o) & set(i) for i, o in zip(topo.op_inputs, topo.op_outputs))
    if valid and not in_place and all(topo.producer[topo.storage_of[t]] <= k
                                      for k, ins in enumerate(topo.op_inputs) for t in ins):
        assert renumbered is not None  # the shortcut is taken where it can be


def test_reordered_rejects_what_validate_would() -> None:
    """An order that breaks a dependency, an op listed twice, an op that is not the one it replaces, and a link
    to no op of the graph."""
    graph = chain(3)
    with pytest.raises(GraphError, match="op 'op2': listed before op 'op1' it depends on"):
        reordered(graph, [0, 2, 1], [graph.ops[k] for k in (0, 2, 1)])
    with pytest.raises(GraphError, match="each of its 3 ops once"):
        reordered(graph, [0, 1, 1], [graph.ops[k] for k in (0, 1, 1)])
    with pytest.raises(ValueError, match="keeps each op's name, inputs and outputs"):
        reordered(graph, [0, 1, 2], [graph.ops[0], graph.ops[1], Op("other", "f", ("t1",), ("t2",))])
    with pytest.raises(GraphError, match="op 'op2': recompute_of names unknown op 'nope'"):
        reordered(graph, [0, 1, 2], [*graph.ops[:2], dataclasses.replace(graph.ops[2], recompute_of="nope")])


def test_one_device_marks_each_op_and_copies_nothing() -> None:
    graph = chain(4)
    order = list(range(4))
    placed = _on_one_device(graph, order, "gpu3")
    assert [op.device for op in placed.graph.ops] == ["gpu3"] * 4
    assert placed.copies == () and set(placed.storage_device) == {"gpu3"} and placed.op_device == ("gpu3",) * 4


@settings(max_examples=150, deadline=None)
@given(graphs(max_ops=14), st.integers(0, 2**16))
def test_one_device_listing_runs_what_the_relisted_graph_runs(graph: Graph, seed: int) -> None:
    """The planner's listing without relisting (the graph as given, run in ``order``) gives the
    schedule, placement, lifetimes and module devices that the relisted graph of ``inject_copies`` gives."""
    rng = random.Random(seed)
    ops = tuple(dataclasses.replace(op, module=rng.choice([None, "a", "a.b", "c"])) for op in graph.ops)
    graph = Graph(graph.name, graph.tensors, ops, graph.outputs)
    order = random_order(graph, rng)
    devices = ["gpu0"] * len(graph.ops)
    fast, slow = listing(graph, order, devices, relist=False), listing(graph, order, devices, relist=True)
    assert fast.graph is graph and slow.graph is not graph  # each path is the one it claims to be

    def runs(listed):  # what the planner reads of a listing
        names = [listed.graph.ops[k].name for k in listed.order]
        return names, listed.op_device, listed.storage_device, listed.copies, listed.cross_device_bytes

    assert runs(fast) == runs(slow)
    assert runs(fast)[0] == [graph.ops[k].name for k in order]
    everything = frozenset(range(len(graph.tensors)))
    assert live_ranges(fast.graph, fast.order, everything) == live_ranges(slow.graph, slow.order, everything)
    assert list(module_devices(fast).items()) == list(module_devices(slow).items())

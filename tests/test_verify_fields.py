"""``verify`` handed a graph or plan built in Python with one field of the wrong type: a ``VerificationError``
naming the tensor, op or plan field (or, for a field no check reads, a pass), never a bare ``TypeError``,
``KeyError`` or ``AttributeError``.

The plans are the planner's own (a diamond over two devices, with copies; a training chain with sqrt(n)
recomputation) with blocks added as an older file holds them (one per device: the whole arena, all
steps), so each verifies untouched.  A graph edited in a hashable way is given a plan of its new hash,
so the field, not the hash, is what fails.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import diamond
from mpplan.capture import synthetic
from mpplan.config import Device
from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Block, Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from mpplan.verify.fields import check_fields


def _with_blocks(p: Plan) -> Plan:
    steps = len(p.schedule)
    return replace(p, blocks=tuple(Block(d.name, 0, d.arena_bytes, 0, steps - 1) for d in p.devices))


def _cases() -> list[tuple[Graph, Plan]]:
    two = diamond()
    train = synthetic.chain(6, train=True, batch=4, width=8, seed=1)
    cases = [(two, plan(two, [Device("a", 1 << 20), Device("b", 1 << 20)])),
             (train, plan(train, [Device("gpu0", 1 << 40)], PlannerSettings(remat="sqrt")))]
    cases = [(g, _with_blocks(p)) for g, p in cases]
    assert cases[0][1].copies and cases[1][1].remat
    for g, p in cases:
        verify(g, p)
    return cases


CASES = _cases()

#: Wrong values for each kind of field: of another type, or (sizes) below zero.
_WRONG: dict[str, list[Any]] = {
    "str": [8, 8.5, None, ["x"], True],
    "optional str": [8, ["x"], True],
    "int": ["8", 8.5, True, None, [8]],
    "size": ["8", 8.5, True, None, -8],
    "number": ["8", None, True],
    "kind": ["activation", 1, None],
    "names": ["x", 8, None, {"x": 1}],
    "shape": ["4", 4, ("4",)],
}
_GRAPH_KINDS = {
    (Tensor, "nbytes"): "size", (Tensor, "kind"): "kind", (Tensor, "shape"): "shape",
    (Op, "inputs"): "names", (Op, "outputs"): "names", (Op, "cost"): "number",
}
_OPTIONAL = {"dtype", "alias_of", "grad_of", "device", "backward_of", "module", "stage", "recompute_of", "from_op",
             "adopts"}


def _kind(cls: type, name: str, value: Any) -> str:
    if (cls, name) in _GRAPH_KINDS:
        return _GRAPH_KINDS[(cls, name)]
    if name in _OPTIONAL:
        return "optional str"
    return "int" if type(value) is int else "str"


@st.composite
def graph_edits(draw: st.DrawFn) -> tuple[Graph, Plan, str]:
    """A graph with one tensor's or op's field wrong, its plan, and what the error must say."""
    graph, p = draw(st.sampled_from(CASES))
    records, cls = draw(st.sampled_from([(graph.tensors, Tensor), (graph.ops, Op)]))
    i = draw(st.integers(0, len(records) - 1))
    record = records[i]
    name = draw(st.sampled_from([f.name for f in fields(cls)]))
    value = draw(st.sampled_from(_WRONG[_kind(cls, name, getattr(record, name))]))
    edited = (*records[:i], replace(record, **{name: value}), *records[i + 1:])
    bad = replace(graph, tensors=edited) if cls is Tensor else replace(graph, ops=edited)
    if name == "name":  # a record without a name of its own is named by its place
        return bad, p, f"graph.{'tensors' if cls is Tensor else 'ops'}[{i}]: name: expected"
    return bad, p, f"{'tensor' if cls is Tensor else 'op'} {record.name!r}: {name}: expected"


@st.composite
def plan_edits(draw: st.DrawFn) -> tuple[Graph, Plan, str]:
    """A plan with one field of a record wrong (or a whole record, or an entry of a list or mapping), and the
    field as ``plan.json`` names it."""
    graph, p = draw(st.sampled_from(CASES))
    lists = [f for f in ("devices", "copies", "remat", "blocks") if getattr(p, f)]
    site = draw(st.sampled_from([*lists, "buffers", "buffer", "placement", "schedule", "predicted", "hash"]))
    if site in lists:
        records = getattr(p, site)
        i = draw(st.integers(0, len(records) - 1))
        if site != "remat" and draw(st.booleans()):  # a Plan makes each remat entry a record itself, or refuses it
            edited = list(records)
            edited[i] = draw(st.sampled_from(["x", 8, None, {"name": "a"}]))
            return graph, replace(p, **{site: tuple(edited)}), f"{site}[{i}]: expected a"
        name = draw(st.sampled_from([f.name for f in fields(records[i])]))
        value = draw(st.sampled_from(_WRONG[_kind(type(records[i]), name, getattr(records[i], name))]))
        edited = list(records)
        edited[i] = replace(records[i], **{name: value})
        return graph, replace(p, **{site: tuple(edited)}), f"{site}[{i}]: {name}: expected"
    if site in ("buffers", "buffer"):
        key = draw(st.sampled_from(sorted(p.buffers)))
        if site == "buffers":
            value = draw(st.sampled_from(["x", 8, None, {"offset": 0}]))
            return graph, replace(p, buffers={**p.buffers, key: value}), f"buffers.{key}: expected a Buffer"
        name = draw(st.sampled_from(["device", "offset", "bytes"]))
        value = draw(st.sampled_from(_WRONG["str" if name == "device" else "int"]))
        edited = {**p.buffers, key: replace(p.buffers[key], **{name: value})}
        return graph, replace(p, buffers=edited), f"buffers.{key}: {name}: expected"
    if site == "placement":
        key = draw(st.sampled_from(sorted(p.placement)))
        value = draw(st.sampled_from(_WRONG["str"]))
        return graph, replace(p, placement={**p.placement, key: value}), f"placement.{key}: expected"
    if site == "schedule":
        i = draw(st.integers(0, len(p.schedule) - 1))
        value = draw(st.sampled_from(_WRONG["str"]))
        return graph, replace(p, schedule=(*p.schedule[:i], value, *p.schedule[i + 1:])), f"schedule[{i}]: expected"
    if site == "predicted":
        name = draw(st.sampled_from(["max_peak_bytes", "cross_device_bytes"]))
        return graph, replace(p, **{name: draw(st.sampled_from(_WRONG["int"]))}), f"predicted.{name}: expected"
    return graph, replace(p, graph_hash=draw(st.sampled_from([8, None, b"v2"]))), "graph.hash: expected"


def _rehashed(graph: Graph, p: Plan) -> Plan:
    """``p`` for ``graph``'s hash, where the graph can be hashed at all (a field JSON has no form for cannot)."""
    try:
        return replace(p, graph_hash=graph.content_hash)
    except (TypeError, ValueError, AttributeError):  # the hash meets the bad field first: the verifier must not
        return p


def _refused_or_passed_and_named(graph: Graph, p: Plan, says: str) -> None:
    """``verify`` raises nothing but a ``VerificationError`` (a wrong type that no check reads, such as an op's
    ``module``, may pass: it decides nothing), and ``check_fields``, which words the faults ``verify`` meets
    as bare errors, names the field."""
    try:
        verify(graph, p)
    except VerificationError:
        pass
    with pytest.raises(VerificationError) as caught:
        check_fields(graph, p)
    assert str(caught.value).startswith(says), str(caught.value)


@settings(max_examples=300, deadline=None)
@given(graph_edits())
def test_a_graph_field_of_the_wrong_type_is_refused_or_passes_and_is_named(edit: tuple[Graph, Plan, str]) -> None:
    graph, p, says = edit
    _refused_or_passed_and_named(graph, _rehashed(graph, p), says)


@settings(max_examples=300, deadline=None)
@given(plan_edits())
def test_a_plan_field_of_the_wrong_type_is_refused_or_passes_and_is_named(edit: tuple[Graph, Plan, str]) -> None:
    _refused_or_passed_and_named(*edit)


def _last_tensor(**change: Any) -> Any:
    return lambda g: replace(g, tensors=(*g.tensors[:-1], replace(g.tensors[-1], **change)))


def _first_op(**change: Any) -> Any:
    return lambda g: replace(g, ops=(replace(g.ops[0], **change), *g.ops[1:]))


@pytest.mark.parametrize(("edit", "says"), [
    (_last_tensor(nbytes=-8), "tensor 'd': nbytes: expected a non-negative integer, got -8"),  # these passed
    (_last_tensor(nbytes=8.5), "tensor 'd': nbytes: expected a non-negative integer, got 8.5"),
    (_last_tensor(nbytes=True), "tensor 'd': nbytes: expected a non-negative integer, got True"),
    (_last_tensor(kind="activation"), "tensor 'd': kind: expected a Kind (input, "),  # equal, but no Kind
    (_first_op(inputs="x"), "op 'A': inputs: expected a tuple of tensor names, got 'x'"),  # read as characters
    (lambda g: replace(g, outputs="d"), "graph.outputs: expected a tuple of tensor names, got 'd'"),
    (lambda g: replace(g, tensors="x"), "graph.tensors: expected a tuple of Tensor records, got 'x'"),
    (lambda g: replace(g, ops=(*g.ops, "op")), "graph.ops[4]: expected an Op, got 'op'"),
    # and those a later check raised a bare error on, named by ``check_fields``
    (_last_tensor(nbytes="8"), "tensor 'd': nbytes: expected a non-negative integer, got '8'"),
    (_last_tensor(kind=[1]), "tensor 'd': kind: expected a Kind"),
    (_last_tensor(name=[1]), "graph.tensors[4]: name: expected a string, got [1]"),
    (_last_tensor(alias_of=["a"]), "tensor 'd': alias_of: expected a string or None, got ['a']"),
    (_first_op(name={"a": 1}), "graph.ops[0]: name: expected a string, got {'a': 1}"),
    (_first_op(module=object), "op 'A': module: expected a string or None, got <class 'object'>"),  # in the hash
])
def test_wrong_graph_fields_are_named(edit: Any, says: str) -> None:
    """The cases the review found, by name: a negative or fractional size (which passed), a kind given as a
    plain string (``is Kind.GRAD`` is false for it), a string where a tuple belongs (read as characters),
    and fields whose type made a later check (or the graph hash) raise a bare error."""
    graph = diamond()
    p = plan(graph, [Device("a", 1 << 20)])
    bad = edit(graph)
    with pytest.raises(VerificationError) as caught:
        verify(bad, _rehashed(bad, p))
    assert str(caught.value).startswith(says), str(caught.value)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda p: replace(p, buffers={**p.buffers, "a": "x"}), "buffers.a: expected a Buffer, got 'x'"),
    (lambda p: replace(p, buffers={**p.buffers, "a": replace(p.buffers["a"], offset="8")}),
     "buffers.a: offset: expected an integer, got '8'"),
    (lambda p: replace(p, devices=(replace(p.devices[0], capacity_bytes="8"), *p.devices[1:])),
     "devices[0]: capacity_bytes: expected an integer, got '8'"),
    (lambda p: replace(p, devices=(replace(p.devices[0], name=[1]), *p.devices[1:])),
     "devices[0]: name: expected a string, got [1]"),
    (lambda p: replace(p, copies=(replace(p.copies[0], bytes="8"),)), "copies[0]: bytes: expected an integer"),
    (lambda p: replace(p, copies=(replace(p.copies[0], tensor=["a"]),)), "copies[0]: tensor: expected a string"),
    (lambda p: replace(p, placement="x"), "placement: expected a mapping, got 'x'"),
    (lambda p: replace(p, schedule=-8), "schedule: expected a tuple of op names, got -8"),
    (lambda p: replace(p, schedule=({"a": 1}, *p.schedule[1:])), "schedule[0]: expected an op name"),
    (lambda p: replace(p, blocks=(replace(p.blocks[0], first="0"), *p.blocks[1:])),
     "blocks[0]: first: expected an integer, got '0'"),
    (lambda p: replace(p, graph_hash=8), "graph.hash: expected a string, got 8"),
])
def test_wrong_plan_fields_are_named(edit: Any, says: str) -> None:
    """Plan fields whose type made a later check raise a bare error (``TypeError``, ``AttributeError``, numpy's
    ``ValueError``), named as ``plan.json`` names them."""
    graph, p = CASES[0]
    with pytest.raises(VerificationError) as caught:
        verify(graph, edit(p))
    assert str(caught.value).startswith(says), str(caught.value)

"""The verifier's storage roots by number (``_root_numbers``) against a plain walk of the alias chains.

``_root_numbers`` resolves only the views, by number, and leaves any fault (an alias cycle, an
unknown base) to the walk by name (``_roots``), which words it.  So on random alias forests, cycles
and dangling bases included, it must give each tensor's (and copy's) root exactly as a walk written
here does, and fail exactly as the walk by name does; and the verifier must give every plan the
verdict it gives with the roots walked by name.  A graph built without validation whose tensor or
op names repeat is refused by ``verify`` before any root is sought.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Buffer, Copy, DevicePlan, Plan
from mpplan.planner import rematerialised
from mpplan.verify import verify
from mpplan.verify.record import numbering
from test_verify_fuzz import TAMPERS, _truth, planned

VERIFY = importlib.import_module("mpplan.verify")  # the module: ``mpplan.verify`` is also the function


@st.composite
def aliased(draw: st.DrawFn) -> tuple[Graph, dict[str, Copy]]:
    """Up to 9 tensors, each its own storage or a view of any tensor (later ones and itself too, so
    cycles), now and then of a missing one; and up to 2 copies."""
    count = draw(st.integers(1, 9))
    names = [f"t{i}" for i in range(count)]
    bases = st.one_of(st.none(), st.none(), st.sampled_from(names), st.just("missing"))
    tensors = tuple(Tensor(name, 4, alias_of=draw(bases)) for name in names)
    copies = {f"c{k}": Copy(f"c{k}", draw(st.sampled_from(names)), "gpu0", "gpu1", 4)
              for k in range(draw(st.integers(0, 2)))}
    return Graph("g", tensors, (), ()), copies


def _walked(graph: Graph, copies: dict[str, Copy]) -> list[str] | str:
    """Each tensor's root, then each copy (its own), by walking its chain; or the fault, in words."""
    base = {t.name: t.alias_of for t in graph.tensors}
    roots = []
    for t in graph.tensors:
        seen, cur = [], t.name
        while base[cur] is not None:
            if cur in seen:
                return "an alias cycle"
            seen.append(cur)
            cur = base[cur]  # type: ignore[assignment]
            if cur not in base:
                return "an unknown base"
        roots.append(cur)
    return roots + list(copies)


def _numbered(graph: Graph, copies: dict[str, Copy], how: str) -> list[str] | str:
    """The roots ``_root_numbers`` (``how="numbers"``) or ``_roots_by_name`` finds, as names; or its error."""
    names, index = numbering(graph)
    names = names + list(copies)
    index.update(zip(copies, range(len(graph.tensors), len(names))))
    find = VERIFY._root_numbers if how == "numbers" else VERIFY._roots_by_name
    try:
        return [names[r] for r in find(graph, copies, names, index)]
    except VerificationError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=500, deadline=None)
@given(aliased())
def test_root_numbers_match_a_plain_walk(case: tuple[Graph, dict[str, Copy]]) -> None:
    graph, copies = case
    expected = _walked(graph, copies)
    fast, by_name = _numbered(graph, copies, "numbers"), _numbered(graph, copies, "name")
    event(expected if isinstance(expected, str) else "resolved")
    assert fast == by_name  # the same roots, or the same error, word for word
    if isinstance(expected, list):
        assert fast == expected
    elif expected == "an alias cycle":
        assert isinstance(fast, str) and fast.startswith("VerificationError") and "alias cycle" in fast
    elif expected == "an unknown base":
        assert isinstance(fast, str) and fast.startswith("VerificationError") and "unknown tensor 'missing'" in fast


def test_a_cycle_is_worded_by_name() -> None:
    """A cycle behind a chain of views names the tensor whose walk found it, as the walk by name always did."""
    tensors = (Tensor("a", 4, Kind.INPUT), Tensor("v", 4, alias_of="w"), Tensor("w", 4, alias_of="x"),
               Tensor("x", 4, alias_of="w"))
    graph = Graph("g", tensors, (), ())
    assert _numbered(graph, {}, "numbers") == "VerificationError: tensor 'v': alias cycle"


def _one_op_plan(graph: Graph) -> Plan:
    """A plan that runs ``graph``'s op ``f`` on one device, its output ``y`` at offset 0."""
    return Plan("g", graph.content_hash, (DevicePlan("gpu0", 64, 8, 8, 16, 16),), ("f",), {"f": "gpu0"},
                {"y": Buffer("gpu0", 0, 8)}, max_peak_bytes=16)


@pytest.mark.parametrize(("tensors", "op", "outputs", "refused"), [
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), Op("f", "f", ("ghost",), ("y",)), ("y",),
     "op 'f': reads unknown tensor 'ghost'"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), Op("f", "f", ("x",), ("y", "ghost")), ("y",),
     "op 'f': writes unknown tensor 'ghost'"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), Op("f", "f", ("x",), ("y",)), ("y", "ghost"),
     "graph: output 'ghost' is an unknown tensor"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8, Kind.GRAD, grad_of="ghost")), Op("f", "f", ("x",), ("y",)), ("y",),
     "tensor 'y': the gradient of unknown tensor 'ghost'"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8, grad_of="ghost")), Op("f", "f", ("x",), ("y",)), ("y",),
     "tensor 'y': the gradient of unknown tensor 'ghost'"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), Op("f", "f", ("x",), ("y",), backward_of="ghost"), ("y",),
     "op 'f': backward_of names unknown op 'ghost'"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), Op("f", "f", ("x",), ("y",), recompute_of="ghost"), ("y",),
     "op 'f': recompute_of names unknown op 'ghost'"),
])
def test_an_unvalidated_graph_naming_no_tensor_is_refused(
        tensors: tuple[Tensor, ...], op: Op, outputs: tuple[str, ...], refused: str) -> None:
    """An op's input or output, a graph output, a gradient's tensor (of any kind), or an op that ``backward_of``
    or ``recompute_of`` links, that the graph does not have is a ``VerificationError`` naming it, not a bare
    ``KeyError`` (or, for the gradient and the links, a plan passed)."""
    graph = Graph("g", tensors, (op,), outputs)
    with pytest.raises(VerificationError) as refusal:
        verify(graph, _one_op_plan(graph))
    assert str(refusal.value) == refused


@pytest.mark.parametrize(("tensors", "ops", "refused"), [
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8), Tensor("y", 8)), 1, "graph: tensor 'y' is given twice"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8, alias_of="x"), Tensor("y", 8)), 1, "graph: tensor 'y' is given twice"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), 2, "graph: op 'f' is given twice"),
    ((Tensor("x", 8, Kind.INPUT), Tensor("y", 8, alias_of="gone")), 1, "tensor 'y': a view of unknown tensor 'gone'"),
])
def test_an_unvalidated_graph_with_a_name_twice_or_a_missing_base_is_refused(
        tensors: tuple[Tensor, ...], ops: int, refused: str) -> None:
    """Through the API a graph need not be validated: a repeated tensor or op name (which a dict by name
    would silently merge, and the plan then passed) or a view of no tensor is a ``VerificationError`` naming it."""
    graph = Graph("g", tensors, (Op("f", "f", ("x",), ("y",)),) * ops, ("y",))
    with pytest.raises(VerificationError) as refusal:
        verify(graph, _one_op_plan(graph))
    assert str(refusal.value) == refused


def _verdict(graph: Graph, p: Plan) -> object:
    try:
        return verify(graph, p, truth=_truth(p))
    except VerificationError as exc:
        return str(exc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(planned(), st.data())
def test_verdicts_match_the_roots_walked_by_name(case: tuple[Graph, Plan], data: st.DataObject) -> None:
    """Planned plans, untouched or tampered with: the same verdict, word for word, with either way to the roots."""
    graph, p = case
    tamper = data.draw(st.sampled_from(TAMPERS))
    broken = tamper(data, rematerialised(graph, p), p)  # tampers pick from the ops the schedule runs
    for candidate in (p, broken) if broken is not None else (p,):
        fast = _verdict(graph, candidate)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(VERIFY, "_root_numbers", VERIFY._roots_by_name)
            assert _verdict(graph, candidate) == fast


def _remat_case() -> tuple[Graph, Plan, int]:
    """A training chain planned with sqrt(n) recomputation, and the place in its ops of a recomputed op."""
    from mpplan.capture import synthetic
    from mpplan.config import Device
    from mpplan.planner import PlannerSettings, plan

    graph = synthetic.chain(10, train=True, batch=16, width=8, seed=1)
    planned = plan(graph, [Device("gpu0", 1 << 40)], PlannerSettings(remat="sqrt"))
    recomputed = planned.remat[0].op
    return graph, planned, next(k for k, o in enumerate(graph.ops) if o.name == recomputed)


@pytest.mark.parametrize("fault", ["op twice", "reads ghost", "writes ghost", "tensor twice", "view of ghost"])
def test_a_malformed_graph_under_a_remat_plan_is_refused_before_the_rewrite(fault: str) -> None:
    """The recomputes are rewritten into the graph by name; an unvalidated graph's names are checked first, so
    its faults are the same ``VerificationError`` as without recomputes, not a bare ``KeyError`` in the rewrite."""
    graph, planned, k = _remat_case()
    ops, op = list(graph.ops), graph.ops[k]
    bad = {
        "op twice": lambda: Graph(graph.name, graph.tensors, (*ops[:k + 1], op, *ops[k + 1:]), graph.outputs),
        "reads ghost": lambda: Graph(graph.name, graph.tensors,
                                     (*ops[:k], replace(op, inputs=(*op.inputs, "ghost")), *ops[k + 1:]),
                                     graph.outputs),
        "writes ghost": lambda: Graph(graph.name, graph.tensors,
                                      (*ops[:k], replace(op, outputs=(*op.outputs, "ghost")), *ops[k + 1:]),
                                      graph.outputs),
        "tensor twice": lambda: Graph(graph.name, (*graph.tensors, graph.tensors[-1]), graph.ops, graph.outputs),
        "view of ghost": lambda: Graph(graph.name, (*graph.tensors, Tensor("vv", 8, alias_of="ghost")), graph.ops,
                                       graph.outputs),
    }[fault]()
    with pytest.raises(VerificationError, match="given twice|unknown tensor 'ghost'"):
        verify(bad, replace(planned, graph_hash=bad.content_hash))


def test_a_tensor_two_ops_make_is_refused() -> None:
    """Two ops writing one tensor, neither reading it (``Graph.validate`` refuses it; through the API the verifier
    must too): the second maker is named."""
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("y", 8))
    graph = Graph("g", tensors, (Op("f", "f", ("x",), ("y",)), Op("h", "h", ("x",), ("y",))), ("y",))
    p = Plan("g", graph.content_hash, (DevicePlan("gpu0", 64, 8, 8, 16, 16),), ("f", "h"), {"f": "gpu0", "h": "gpu0"},
             {"y": Buffer("gpu0", 0, 8)}, max_peak_bytes=16)
    with pytest.raises(VerificationError, match="op 'h' makes tensor 'y', which another op made"):
        verify(graph, p)


def test_a_remat_plan_has_its_names_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The names of the graph given are checked once, before the rewrite; the rewrite adds only fresh names, so
    the graph it gives is not checked again (the faults it catches are those of the test above)."""
    graph, planned, _ = _remat_case()
    calls: list[int] = []
    checked = VERIFY._check_names

    def counted(g: Graph, names: list[str], index: dict[str, int]) -> object:
        calls.append(len(g.tensors))
        return checked(g, names, index)

    monkeypatch.setattr(VERIFY, "_check_names", counted)
    verify(graph, planned)
    assert calls == [len(graph.tensors)]

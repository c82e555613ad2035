"""The verifier's own derivation of a recomputed graph equals the remat pass's rewrite.

``mpplan.verify.recompute`` re-derives the rewrite from its documented contract without
importing the pass; this test (and only this test) holds the two side by side, on
training graphs (late = after the first backward op) and on graphs without a backward
pass (late = after a storage's longest gap), with views and chains.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import REPO, device
from mpplan.capture import synthetic
from mpplan.errors import ConfigError, VerificationError
from mpplan.graph import Graph
from mpplan.plan import Plan
from mpplan.passes.remat import apply_recompute, recomputable
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from mpplan.verify.recompute import with_recomputes
from strategies import graphs, layered_graph

GRAPHS = {
    "chain": lambda: synthetic.chain(10, train=True, batch=16, width=8, seed=1),
    "resnet": lambda: synthetic.residual_cnn(1, train=True, batch=8, channels=4, image=16, classes=3, optimizer="sgd"),
    "transformer": lambda: synthetic.transformer(2, train=True, batch=4, seq=32, hidden=16, heads=2, vocab=32,
                                                 optimizer="adam"),
    "unet": lambda: synthetic.unet(2, train=True, batch=2, channels=4, image=16),
    "layered": lambda: layered_graph(120, seed=3),
}


def _records(graph: Graph, rewritten: Graph, from_ops: dict[str, str] | None = None) -> Plan:
    """A plan holding just what ``with_recomputes`` reads: the remat records of the pass's
    rewrite, with ``from_op`` for the tensors ``from_ops`` cuts."""
    tensors = {t.name: t for t in rewritten.tensors}
    ops = {o.name: o for o in graph.ops}
    cuts = from_ops or {}
    return Plan(
        graph.name, graph.content_hash, (), (), {}, {},
        remat=tuple(
            {"tensor": old, "op": op.recompute_of, "recompute_op": op.name, "recompute_tensor": new,
             "bytes": tensors[new].nbytes, **({"from_op": cuts[old]} if old in cuts else {})}
            for op in rewritten.ops
            if op.recompute_of is not None and tensors[op.outputs[0]].alias_of is None
            for old, new in zip(ops[op.recompute_of].outputs, op.outputs)
        ),
    )


def same_graph(a: Graph, b: Graph) -> None:
    assert {t.name: t for t in a.tensors} == {t.name: t for t in b.tensors}
    assert {o.name: o for o in a.ops} == {o.name: o for o in b.ops}


def check_subset(graph: Graph, chosen: list[str]) -> None:
    expected = apply_recompute(graph, chosen)
    same_graph(with_recomputes(graph, _records(graph, expected)), expected)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_single_recompute_and_all_at_once_match_the_pass(name: str) -> None:
    graph = GRAPHS[name]()
    candidates = list(recomputable(graph))
    assert candidates, "the graph offers something to recompute"
    for op in candidates:
        check_subset(graph, [op])
    check_subset(graph, candidates)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GRAPHS)), st.data())
def test_random_subsets_match_the_pass(name: str, data: st.DataObject) -> None:
    graph = GRAPHS[name]()
    candidates = list(recomputable(graph))
    check_subset(graph, data.draw(st.lists(st.sampled_from(candidates), unique=True)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_ops=14), st.data())
def test_random_dags_with_views_match_the_pass(graph: Graph, data: st.DataObject) -> None:
    candidates = list(recomputable(graph))
    chosen = data.draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
    check_subset(graph, chosen)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(GRAPHS)), st.data())
def test_random_cut_points_match_the_pass(name: str, data: st.DataObject) -> None:
    """Each chosen op's outputs cut at a random later reader (``from_op``)."""
    graph = GRAPHS[name]()
    topo = graph.topology
    chosen = data.draw(st.lists(st.sampled_from(list(recomputable(graph))), min_size=1, max_size=4, unique=True))
    from_ops = {}
    for op in chosen:
        k = topo.op_index[op]
        for out in graph.op(op).outputs:
            s = topo.storage_of[topo.tensor_index[out]]
            readers = [graph.ops[r].name for r in range(k + 1, len(graph.ops))
                       if s in {topo.storage_of[t] for t in topo.op_inputs[r]}]
            if readers:
                from_ops[out] = data.draw(st.sampled_from(readers))
    try:
        expected = apply_recompute(graph, chosen, from_ops)
    except ConfigError:
        assume(False)  # a cut that makes the op unrecomputable (nothing late, or an input updated before it)
    same_graph(with_recomputes(graph, _records(graph, expected, from_ops)), expected)


def test_a_record_of_an_in_place_or_unknown_op_is_refused() -> None:
    graph = GRAPHS["transformer"]()
    planned = plan(graph, [device(1 << 40)], PlannerSettings(remat="sqrt"))
    verify(graph, planned)
    in_place = next(o for o in graph.ops if o.in_place)
    bad = ({**planned.remat[0], "op": in_place.name, "tensor": in_place.outputs[0]}, *planned.remat[1:])
    with pytest.raises(VerificationError, match="not recomputable"):
        verify(graph, replace(planned, remat=bad))
    renamed = ({**planned.remat[0], "recompute_op": "elsewhere"}, *planned.remat[1:])
    with pytest.raises(VerificationError, match="is not in the rewritten graph"):
        verify(graph, replace(planned, remat=renamed))


def test_the_verifier_imports_none_of_what_it_checks() -> None:
    """Only the IR (with its topological sort, which checks a graph is acyclic, and its hash), the plan record, the
    config loader (with its bounded reader and durable writer, and the writer's JSON encoder) and the errors: no
    pass, planner or simulator."""
    import ast
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, mpplan.verify; "  # every module of it, the lazily imported ones too
        "[importlib.import_module(m.name) "
        "for m in pkgutil.iter_modules(sys.modules['mpplan.verify'].__path__, 'mpplan.verify.')]; "
        "print(sorted(m for m in sys.modules if m.startswith('mpplan.') and not m.startswith('mpplan.verify')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO).stdout
    loaded = set(ast.literal_eval(out))
    allowed = {"mpplan.config", "mpplan.errors", "mpplan.graph", "mpplan.graph_hash", "mpplan.plan", "mpplan.units",
               "mpplan.reading",
               "mpplan.durable", "mpplan.json_text", "mpplan.plan_records", "mpplan.topo"}
    # the config is a package: its modules, and the budget parser it re-exports, are the config loader
    loaded = {m for m in loaded if not m.startswith("mpplan.config.") and m != "mpplan.budget"}
    assert loaded <= allowed, loaded

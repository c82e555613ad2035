"""scripts/probe_remat_doubles.py's ``--focus``: the double-drop MILP with only some candidates
free proves an optimum for that family, so it must equal the brute force over the same family
(the docs' claim that RL250's 5.02% is optimal for the candidates live across a step over the
budget rests on it)."""

from __future__ import annotations

import sys

from conftest import REPO
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp import small_dags
from test_remat_cutmilp2 import MAX_COMBOS, combos
from test_remat_cutmulti import least_multi_cost
from test_remat_cuts import gapped_graphs, peak

from mpplan import sim
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import apply_recompute, build_model
from mpplan.passes.remat.cutmilp2 import double_names, double_program, neighbours
from mpplan.passes.remat.cutmulti import Drop

sys.path.insert(0, str(REPO / "scripts"))

from probe_remat_doubles import focus_candidates, solve_focused  # noqa: E402


def focused_cost(graph: Graph, budget: int, free: set[int]) -> tuple[float | None, float | None]:
    """The focused MILP's least cost with ``free`` decided (its rewrite checked to fit) and the
    brute force's over the same family: those candidates alone recomputed, a double drop's
    neighbours left alone (``cutmilp2``'s scope)."""
    model = build_model(graph)
    program = double_program(model, budget - model.static_bytes)
    assert program is not None
    found = solve_focused(program, free, {}, 20.0)
    cost = None
    if found is not None:
        assert found.status == "optimal" and set(found.chosen) <= free
        rewritten = apply_recompute(graph, *double_names(model, program, found.chosen))
        assert peak(rewritten) <= budget
        cost = sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
        assert found.bound is not None and found.bound <= cost + 1e-6

    def in_family(combo: tuple[object, ...]) -> bool:
        doubled = [i for i, c in enumerate(combo) if isinstance(c, Drop)]
        return (all(c is None for i, c in enumerate(combo) if i not in free)
                and all(combo[c] is None for i in doubled for c in neighbours(model, i)))

    return cost, least_multi_cost(graph, budget, in_family)


def expected_focus(graph: Graph, budget: int, inputs: bool) -> set[int]:
    """``focus_candidates`` from the graph and ``sim``'s profile rather than the model's
    storages: candidates with an output touched before and after a step over ``budget``
    (``static + LOAD`` as given), and with ``inputs`` the candidates making their inputs."""
    static = sim.static_bytes(graph)
    over = [p for p, held in enumerate(sim.order_profile(graph, range(len(graph.ops)))) if held + static > budget]
    touched: dict[str, list[int]] = {}
    for k, op in enumerate(graph.ops):
        for t in (*op.inputs, *op.outputs):
            touched.setdefault(t, []).append(k)
    names = build_model(graph).candidate_names()
    ops = {op.name: op for op in graph.ops}
    found = {i for i, name in enumerate(names)
             if any(min(touched[t]) < p <= max(touched[t]) for t in ops[name].outputs for p in over)}
    if inputs:
        maker = {t: op.name for op in graph.ops for t in op.outputs}
        wanted = {maker.get(t) for i in found for t in ops[names[i]].inputs}
        found |= {i for i, name in enumerate(names) if name in wanted}
    return found


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(gapped_graphs(), st.floats(0.7, 0.99), st.data())
def test_the_milp_with_some_candidates_free_equals_brute_force_over_them(graph: Graph, fraction: float,
                                                                         data: st.DataObject) -> None:
    """Any set of free candidates: the sub-MILP's optimum is the brute force's over that set
    (a sub-MILP that decided every candidate would undercut it on about a quarter of draws)."""
    assume(combos(graph) <= MAX_COMBOS)  # past what the brute force enumerates in seconds
    candidates = range(build_model(graph).num_candidates)
    free = data.draw(st.sets(st.sampled_from(candidates)) if candidates else st.just(set[int]()))
    found, brute = focused_cost(graph, int(fraction * peak(graph)), free)
    assert found == brute


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.7, 0.99), st.booleans())
def test_the_focus_is_what_the_profile_says_and_its_milp_equals_brute_force(graph: Graph, fraction: float,
                                                                           inputs: bool) -> None:
    """``focus_candidates`` names the candidates an independent reading of the profile names
    (on DAGs with chains and multi-output ops too), and the MILP over them is exact."""
    assume(combos(graph) <= MAX_COMBOS)
    budget = int(fraction * peak(graph))
    focus = focus_candidates(build_model(graph), budget, inputs)
    assert focus == expected_focus(graph, budget, inputs)
    found, brute = focused_cost(graph, budget, focus)
    assert found == brute


def test_the_focus_holds_the_tensors_live_across_a_step_over_the_budget() -> None:
    """``over`` names the candidate whose output is live across the peak's step (``B``: ``b``
    across its gap), not ``A`` (``a`` is dead by then); ``over+inputs`` adds ``A``, whose
    output ``B`` reads; a budget at the peak leaves no step over it."""
    model = build_model(small_chain())
    names = model.candidate_names()
    top = peak(model.graph)
    assert {names[i] for i in focus_candidates(model, top - 1, False)} == {"B"}
    assert {names[i] for i in focus_candidates(model, top - 1, True)} == {"A", "B"}
    assert focus_candidates(model, top, False) == set()


def small_chain() -> Graph:
    """``A`` makes ``a`` (read by ``B`` only), ``B`` makes ``b`` (read by ``C`` and again at
    the end); the peak is at ``D``, where ``b`` is held across its gap and ``a`` is dead."""
    act = Tensor
    tensors = (Tensor("x", 4, Kind.INPUT), act("a", 10), act("b", 10), act("c", 30), act("d", 40),
               Tensor("y", 1, Kind.OUTPUT))
    ops = (Op("A", "f", ("x",), ("a",), 1.0), Op("B", "f", ("a",), ("b",), 1.0), Op("C", "f", ("b",), ("c",), 1.0),
           Op("D", "f", ("c",), ("d",), 1.0), Op("E", "f", ("d", "b"), ("y",), 1.0))
    return Graph("small_chain", tensors, ops, ("y",)).validate()

"""The large-neighbourhood search whose sub-MILPs are built for the neighbourhood only
(``mpplan.passes.remat.cutwindow``).

A neighbourhood's own program has the optimum of the whole cut MILP with the other
candidates' columns fixed at "not recomputed" (``cutlns.fixed_columns``); the search's answers
fit (measured by ``sim`` on the rewritten graph, and their plans pass the verifier), never
cost more than the start, never go under the brute force over every subset and every cut,
and reach it when one window covers every candidate.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp import small_dags
from test_remat_cutsearch import checked, fitting_start
from test_remat_cuts import gapped_graphs, least_cut_cost, peak, uneven

from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import build_model
from mpplan.passes.remat.cutexact import choice_names, solve_program
from mpplan.passes.remat.cutlns import fits_choice, fixed_columns
from mpplan.passes.remat.cutmilp import CutProgram, cut_options
from mpplan.passes.remat.cutsearch import with_cuts
from mpplan.passes.remat.cutwindow import lns_local, neighbourhood_program
from mpplan.passes.remat.evaluation import evaluate


def local_cost(graph: Graph, start: dict[int, int], budget: int, window: int) -> float:
    """The search's cost from ``start``, ``checked``."""
    model = build_model(graph)
    found = lns_local(model, cut_options(model) or [], start, budget, time.perf_counter() + 20.0, window=window)
    return checked(graph, model, found, budget)[2]


def optimum(program: CutProgram) -> float | None:
    """The least cost of ``program`` (``None``: infeasible)."""
    found = solve_program(program, 20.0)
    assert found is None or found.status == "optimal"
    return None if found is None else sum(program.model.cand_cost[i] for i in found.chosen)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.3, 0.99), st.data())
def test_a_neighbourhood_program_has_the_optimum_of_the_whole_program_fixed_outside_it(
        graph: Graph, fraction: float, data: st.DataObject) -> None:
    """Budgets under the peak, and only neighbourhoods that must recompute (a positive,
    feasible optimum): where nothing need be recomputed both optima are 0 whatever the rows."""
    model = build_model(graph)
    options = cut_options(model)
    assume(options is not None)
    assert options is not None
    budget = int(fraction * peak(graph))
    free = {i for i in range(model.num_candidates) if data.draw(st.booleans())}
    assume(free)  # a neighbourhood frees its window; HiGHS takes no program without columns
    dyn = budget - model.static_bytes
    local = neighbourhood_program(model, options, free, dyn)
    whole = fixed_columns(CutProgram(model, options, dyn), {}, free)
    least = optimum(local)
    assert least == optimum(whole)
    assume(least is not None and least > 0)
    assert len(local.values_nz) <= len(whole.values_nz)
    found = solve_program(local, 20.0)
    assert found is not None and set(found.chosen) <= free
    assert fits_choice(model, options, found.chosen, budget)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.0, 0.9), st.integers(1, 3), st.data())
def test_small_windows_never_cost_more_than_the_start_nor_less_than_brute_force(
        graph: Graph, fraction: float, window: int, data: st.DataObject) -> None:
    start, budget = fitting_start(graph, fraction, data)
    model = build_model(graph)
    cost = local_cost(graph, start, budget, window)
    assert cost <= evaluate(with_cuts(model, cut_options(model) or [], start), start).cost
    exact = least_cut_cost(graph, budget)
    assert exact is not None and cost >= exact - 1e-9


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.0, 0.9), st.data())
def test_one_window_over_every_candidate_reaches_the_brute_force_optimum(
        graph: Graph, fraction: float, data: st.DataObject) -> None:
    start, budget = fitting_start(graph, fraction, data)
    assert local_cost(graph, start, budget, window=build_model(graph).num_candidates) == least_cut_cost(graph, budget)


def test_windows_of_one_candidate_replace_a_wasteful_start() -> None:
    """``uneven`` fits 310 bytes with ``A``, ``P1``, ``Q1`` and ``C`` recomputed; windows of
    one candidate (plus the chosen ones) reach ``A`` alone, cut at ``D``: the optimum."""
    graph = uneven()
    model = build_model(graph)
    index = {name: i for i, name in enumerate(model.candidate_names())}
    start = {index["A"]: 1, index["P1"]: 0, index["Q1"]: 0, index["C"]: 0}
    assert local_cost(graph, start, 310, window=1) == 1.0 == least_cut_cost(graph, 310)
    found = lns_local(model, cut_options(model) or [], start, 310, time.perf_counter() + 20.0, window=1)
    assert choice_names(model, found) == (("A",), {"a": "D"})


def test_without_time_the_answer_is_the_start_less_what_no_late_use_needs() -> None:
    graph = uneven()
    model = build_model(graph)
    options = cut_options(model) or []
    index = {name: i for i, name in enumerate(model.candidate_names())}
    start = {index["A"]: 1, index["P1"]: 0, index["Q1"]: 0, index["C"]: 0}
    effective = evaluate(with_cuts(model, options, start), start).chosen
    assert lns_local(model, options, start, 310, time.perf_counter()) == {i: start[i] for i in effective}


def test_a_sub_milp_that_hands_back_its_start_is_solved_again() -> None:
    """Hypothesis's example: started from every candidate recomputed (cost 4), HiGHS 1.16 reports
    the optimum's objective (2) with the start's values; the search solves again without the
    start and reaches the brute force's optimum."""
    def act(name: str, nbytes: int) -> Tensor:
        return Tensor(name, nbytes)

    tensors = (Tensor("x", 4, Kind.INPUT), act("t0", 1), act("t1", 36), act("t2", 37), act("u2", 1), act("t3", 49),
               act("t4", 1), act("t5", 1), Tensor("out", 1, Kind.OUTPUT))
    io = {"O0": ("x", "t0"), "O1": ("t0", "t1"), "O2": ("x t0", "t2 u2"), "O3": ("x", "t3"), "O4": ("t1 t2", "t4"),
          "O5": ("t4", "t5"), "OUT": ("t4 t5", "out")}
    ops = tuple(Op(name, "f", tuple(ins.split()), tuple(outs.split()), cost=2.0 if name == "O2" else 1.0)
                for name, (ins, outs) in io.items())
    graph = Graph("dag", tensors, ops, ("out",))
    assert local_cost(graph, {0: 0, 1: 0, 2: 0}, 90, window=3) == 2.0 == least_cut_cost(graph, 90)

"""The large-neighbourhood search whose sub-MILPs are built for the neighbourhood only
(``mpplan.passes.remat.cutwindow``).

A neighbourhood's own program has the optimum of the whole cut MILP with the other
candidates' columns fixed at "not recomputed" (``cutlns.fixed_columns``).  The search's answers
are held to the brute force beside ``cutlns``' in ``tests/test_remat_cutlns.py``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_remat_cutlns import lns_cost
from test_remat_cutmilp import small_dags
from test_remat_cuts import gapped_graphs, least_cut_cost, peak

from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import build_model
from mpplan.passes.remat.cutexact import solve_program
from mpplan.passes.remat.cutlns import fits_choice, fixed_columns
from mpplan.passes.remat.cutmilp import CutProgram, cut_options
from mpplan.passes.remat.cutwindow import lns_local, neighbourhood_program


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
    assert lns_cost(graph, {0: 0, 1: 0, 2: 0}, 90, 3, lns_local) == 2.0 == least_cut_cost(graph, 90)

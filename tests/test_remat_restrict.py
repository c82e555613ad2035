"""The LNS's restricted sub-MILP (``mpplan.passes.remat.restrict``): with the candidates
outside a neighbourhood substituted out, HiGHS finds the optimum the whole program with
those candidates fixed by their bounds (``cutlns.fixed_columns``) has, infeasible exactly
when it is, and every expanded answer keeps the whole program's rows and bounds."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp import small_dags
from test_remat_cutmulti import twice_read
from test_remat_cuts import gapped_graphs

from mpplan.graph import Graph
from mpplan import sim
from mpplan.passes.remat import build_model
from mpplan.passes.remat.cutexact import warm_point
from mpplan.passes.remat.cutlns import fixed_columns
from mpplan.passes.remat.cutmilp2 import DoubleProgram, double_program
from mpplan.passes.remat.ilp import solve_arrays
from mpplan.passes.remat.restrict import Restriction

TOLERANCE = 1e-6


def within_rows(restriction: Restriction, x: list[float]) -> bool:
    """Whether ``x`` keeps every row and column bound of the restriction's program."""
    point = np.asarray(x)
    activity = restriction.activity(point)
    return bool(np.all(activity >= restriction.row_lo - TOLERANCE)
                and np.all(activity <= restriction.row_hi + TOLERANCE)
                and np.all(point >= restriction.col_lo - TOLERANCE) and np.all(point <= restriction.col_hi + TOLERANCE))


def check_sub_milp(program: DoubleProgram, chosen: dict[int, int], free: set[int]) -> str:
    """Checks the restricted sub-MILP freeing ``free`` around ``chosen`` against the whole
    program with the others fixed: ``"none"`` (infeasible fixed point), ``"empty"`` (nothing
    left to decide) or ``"solved"``."""
    whole = solve_arrays(fixed_columns(program, chosen, free), "highs", 20.0, warm_point(program, chosen))
    restriction = Restriction(program)
    sub = restriction.sub_milp(chosen, free)
    if sub is None:
        assert whole[0] == "infeasible"
        return "none"
    if not sub.cost:  # nothing left to decide: the fixed point holds every row
        assert whole[0] == "optimal" and within_rows(restriction, restriction.expand(sub, []))
        return "empty"
    status, x, _, _ = solve_arrays(sub, "highs", 20.0, restriction.restrict(sub, warm_point(program, chosen)))
    assert status == whole[0]
    if status == "optimal":
        assert x is not None and whole[1] is not None
        full = restriction.expand(sub, x)
        assert within_rows(restriction, full)
        cost = restriction.cost  # of the points: HiGHS's reported objective can be off when presolve fixes it all
        assert math.isclose(float(cost @ np.asarray(full)), float(cost @ np.asarray(whole[1])), abs_tol=1e-7)
    return "solved"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.75, 0.99), st.data())
def test_the_restricted_sub_milp_has_the_fixed_programs_optimum(graph: Graph, fraction: float,
                                                                data: st.DataObject) -> None:
    model = build_model(graph)
    program = double_program(model, int(fraction * sim.given_peak(graph)) - model.static_bytes)
    assume(program is not None and program.y_cols)
    assert program is not None
    n = len(program.y_cols)
    chosen = {i: data.draw(st.integers(0, len(program.y_cols[i]) - 1)) for i in range(n)
              if data.draw(st.integers(0, 3)) == 0}
    free = {i for i in range(n) if data.draw(st.booleans())} | (set(chosen) if data.draw(st.booleans()) else set())
    event(f"sub-MILP: {check_sub_milp(program, chosen, free)}")


def test_nothing_left_to_decide_at_a_budget_that_fits_without_recomputing() -> None:
    """Under the peak the fixed point with nothing chosen breaks a row, so the hypothesis test
    above meets an empty sub-MILP only by chance: at the peak, with nothing freed, every
    column is fixed and the fixed point holds every row."""
    graph = twice_read()
    model = build_model(graph)
    program = double_program(model, sim.given_peak(graph) - model.static_bytes)
    assert program is not None and program.y_cols
    assert check_sub_milp(program, {}, set()) == "empty"
    assert check_sub_milp(program, {}, set(range(len(program.y_cols)))) == "solved"

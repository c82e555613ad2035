"""The MILP builder's shared pieces (``mpplan.passes.remat.sparse`` and ``CutProgram``'s
cached bounds): the caches that make RL250's double-drop program build in seconds must give
the rows and columns a fresh computation gives, whatever order the terms come in."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from test_remat_cutmilp import small_dags

from mpplan.graph import Graph
from mpplan.passes.remat import build_model
from mpplan.passes.remat.cutmilp import CutProgram, cut_options
from mpplan.passes.remat.sparse import INF, SparseMilp, add_scaled


def test_aux_shares_one_column_per_set_in_any_order() -> None:
    """The same bounds, repeated or reordered (terms and bounds), share one column and its
    rows; another set gets its own."""
    milp = SparseMilp()
    a, b = milp.column(1.0, 0.0, 1.0), milp.column(1.0, 0.0, 1.0)
    first = milp.aux([({a: 1.0, b: -1.0}, 0.0), ({b: 1.0}, -1.0)])
    assert milp.aux([({a: 1.0, b: -1.0}, 0.0), ({b: 1.0}, -1.0)]) == first
    assert milp.aux([({b: 1.0}, -1.0), ({b: -1.0, a: 1.0}, 0.0)]) == first
    assert len(milp.cost) == 3 and len(milp.row_lo) == 2
    other = milp.aux([({a: 1.0, b: -1.0}, 0.0)])
    assert other != first and milp.aux([({b: -1.0, a: 1.0}, 0.0)]) == other
    assert len(milp.cost) == 4 and len(milp.row_lo) == 3
    assert milp.row_lo == [0.0, -1.0, 0.0] and milp.row_hi == [INF] * 3
    assert list(zip(milp.index_nz, milp.values_nz))[:2] == [(first, 1.0), (a, -1.0)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags())
def test_later_bounds_equal_a_fresh_computation(graph: Graph) -> None:
    """``CutProgram._later``, cached per anchor interval, equals ``r_h - Z_h`` (less
    ``r_kept``, plus column ``started``) computed afresh at every step, asked in any order."""
    model = build_model(graph)
    options = cut_options(model)
    assume(options is not None)
    assert options is not None
    program = CutProgram(model, options, 0)
    n = len(options)
    asks = [(h, p, before, kept, started) for h in range(n) for p in reversed(range(model.num_ops + 1))
            for before in (True, False) for kept in range(-1, n) for started in (-1, 0, len(program.cost) - 1)]
    for h, p, before, kept, started in asks:
        fresh = add_scaled(program.r[h], program.z(h, p if before else p - 1), scale=-1.0)
        fresh = add_scaled(fresh, program.r[kept] if kept >= 0 else {}, scale=-1.0)
        fresh = add_scaled(fresh, {started: 1.0} if started >= 0 else {})
        assert program._later(h, p, before, kept, started) == fresh

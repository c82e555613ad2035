"""The cut-choosing MILP (``mpplan.passes.remat.cutmilp``): the exact reference for cut points.

Held equal to brute force over every subset of recomputes and every cut of each
(``test_remat_cuts.least_cut_cost``) on tiny graphs, chains and multi-output ops
included; the cut heuristic (``cuts``) is never cheaper than it; every answer's rewrite
fits and its plan passes the verifier.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_remat import training_graphs
from test_remat_cuts import gapped_graphs, least_cut_cost, peak, planned_with, uneven

from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import RECOMPUTES_ONLY, apply_recompute, build_model
from mpplan.passes.remat.result import result_of
from mpplan.passes.remat.cutexact import choice_names, option_of, solve_cuts, solve_program, warm_point
from mpplan.passes.remat.cutmilp import CutOption, CutProgram, cut_options
from mpplan.passes.remat.cuts import fit_cuts, fit_least_cuts
from mpplan.passes.remat.cutsearch import with_cuts
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.verify import verify


def milp_cost(graph: Graph, budget: int) -> float | None:
    """The MILP's least cost for ``budget`` (``None``: nothing fits), after checking that its
    answer's rewrite fits, costs what it says, and plans into a plan the verifier passes."""
    model = build_model(graph)
    found = solve_cuts(model, budget - model.static_bytes, 20.0)
    if found is None:
        return None
    assert found.status == "optimal"
    names, from_ops = choice_names(model, found.chosen)
    rewritten = apply_recompute(graph, names, from_ops)
    assert peak(rewritten) <= budget
    cost = sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
    assert cost == sum(model.cand_cost[i] for i in found.chosen)
    if names:
        verify(graph, planned_with(graph, result_of(graph, names, "budget", peak(graph), 0.0, from_ops=from_ops)))
    return cost


@st.composite
def small_dags(draw: st.DrawFn) -> Graph:
    """Random DAGs of four to eight ops, each reading one to three earlier tensors, one op
    in three writing two, and half of those with an output nobody reads (a recompute
    re-makes it all the same): chains of recomputes, multi-output candidates, several gaps."""
    tensors, ops, made = [Tensor("x", 4, Kind.INPUT)], [], ["x"]
    for k in range(draw(st.integers(4, 8))):
        reads = draw(st.lists(st.sampled_from(made), min_size=1, max_size=3, unique=True))
        outs = [f"t{k}", *([f"u{k}"] if draw(st.integers(0, 2)) == 0 else [])]
        tensors += [Tensor(o, draw(st.integers(1, 100))) for o in outs]
        ops.append(Op(f"O{k}", "f", tuple(reads), tuple(outs), float(draw(st.integers(1, 3)))))
        dead = draw(st.sampled_from([None, None, *outs])) if len(outs) == 2 else None
        made += [o for o in outs if o != dead]
    tensors.append(Tensor("out", 1, Kind.OUTPUT))
    ops.append(Op("OUT", "f", tuple(made[-2:]), ("out",), 1.0))
    return Graph("dag", tuple(tensors), tuple(ops), ("out",)).validate()


def unlinked(options: list[list[CutOption]]) -> list[list[CutOption]]:
    """``options`` less every chain link (``RECOMPUTES_ONLY``): the family before links."""
    return [[o for o in opts if not o.is_link] for opts in options]


def test_the_milp_cuts_uneven_at_the_shorter_gap_and_refuses_under_it() -> None:
    graph = uneven()
    model = build_model(graph)
    found = solve_cuts(model, 320 - model.static_bytes, 10.0)
    assert found is not None and choice_names(model, found.chosen) == (("A",), {"a": "D"})
    assert milp_cost(graph, 310) == 1.0
    assert milp_cost(graph, 308) is None and least_cut_cost(graph, 308) is None


def test_a_chain_link_lets_the_milp_recompute_a_reader_without_holding_its_input() -> None:
    """At 309 bytes ``C`` must be recomputed before ``D``; it reads ``b``, which no op reads
    late.  ``B`` recomputed as a chain link (``RECOMPUTES_ONLY``: only ``C``'s recompute
    reads it) frees ``b`` after ``C``: without links nothing fits."""
    graph = uneven()
    model = build_model(graph)
    found = solve_cuts(model, 309 - model.static_bytes, 10.0)
    assert found is not None
    names, from_ops = choice_names(model, found.chosen)
    assert from_ops["b"] == RECOMPUTES_ONLY and {"B", "C"} <= set(names)
    rewritten = apply_recompute(graph, names, from_ops)
    assert rewritten.op("C").inputs == ("a", "q1", "b") and rewritten.op("C@recompute").inputs[2] == "b@recompute"
    assert [op.name for op in rewritten.ops if "b@recompute" in op.inputs] == ["C@recompute"]
    assert milp_cost(graph, 309) == least_cut_cost(graph, 309) == 5.0
    options = cut_options(model)
    assert options is not None
    assert solve_program(CutProgram(model, unlinked(options), 309 - model.static_bytes), 10.0) is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gapped_graphs(), st.floats(0.4, 0.95))
def test_the_milp_equals_brute_force_over_every_cut(graph: Graph, fraction: float) -> None:
    budget = int(fraction * peak(graph))
    assert milp_cost(graph, budget) == least_cut_cost(graph, budget)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(small_dags(), st.floats(0.6, 0.99))
def test_the_milp_equals_brute_force_on_random_dags_with_chains(graph: Graph, fraction: float) -> None:
    options = cut_options(build_model(graph)) or []
    combos = 1
    for per in options:
        combos *= len(per) + 1
    assume(combos <= 2000)
    budget = int(fraction * peak(graph))
    assert milp_cost(graph, budget) == least_cut_cost(graph, budget)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(), st.data())
def test_the_milp_holds_any_choice_at_its_real_peak_and_not_a_byte_under(graph: Graph, data: st.DataObject) -> None:
    """A choice of options (chain links drawn half the time where offered) whose recomputes all
    run: ``evaluate`` on the re-cut model gives ``sim``'s peak of the rewrite, and the MILP with
    that choice fixed fits the peak and not one byte under it (no under- or over-count)."""
    model = build_model(graph)
    options = cut_options(model)
    assume(options)
    assert options is not None
    chosen = {}
    for i, opts in enumerate(options):
        links = [k for k, o in enumerate(opts) if o.is_link]
        pick = data.draw(st.sampled_from([None, *range(len(opts)), *links]))
        if pick is not None:
            chosen[i] = pick
    ev = evaluate(with_cuts(model, options, chosen), chosen)
    assume(ev.chosen and set(ev.chosen) == set(chosen))  # a recompute that never runs: no choice of its own
    real = peak(apply_recompute(graph, *choice_names(model, chosen)))
    assert ev.peak == real
    for budget, fits in ((real, True), (real - 1, False)):
        program = CutProgram(model, options, budget - model.static_bytes)
        for i, cols in enumerate(program.y_cols):
            for k, col in enumerate(cols):
                program.col_lo[col] = program.col_hi[col] = float(chosen.get(i) == k)
        backend = available_backend()
        assert backend is not None
        assert (solve_arrays(program, backend, 10.0)[0] == "optimal") == fits


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.4, 0.95))
def test_the_cut_heuristic_is_never_cheaper_than_the_milp(graph: Graph, fraction: float) -> None:
    """And the heuristic's answers fit (the rewritten graph's peak, dead sibling outputs
    included) and, started from, are feasible points of the MILP."""
    budget = int(fraction * peak(graph))
    exact = milp_cost(graph, budget)
    model = build_model(graph)
    for found in (fit_cuts(model, budget, "exact", 10.0, beat=float("inf")), fit_least_cuts(model, budget)):
        if found is None:
            continue
        assert peak(apply_recompute(graph, found.names, found.from_ops)) <= budget
        assert exact is not None and found.cost >= exact - 1e-9
        chosen = option_of(model, found.names, found.from_ops)
        assert chosen is not None
        program = CutProgram(model, cut_options(model) or [], budget - model.static_bytes)
        assert violated_rows(program, warm_point(program, chosen)) == []


def violated_rows(program: CutProgram, x: list[float]) -> list[int]:
    """The rows of ``program`` that the column values ``x`` break."""
    broken = []
    for k, (lo, hi) in enumerate(zip(program.row_lo, program.row_hi)):
        span = range(program.starts[k], program.starts[k + 1])
        value = sum(program.values_nz[e] * x[program.index_nz[e]] for e in span)
        if not lo - 1e-6 <= value <= hi + 1e-6:
            broken.append(k)
    return broken


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(), st.data())
def test_the_milp_rows_hold_at_a_choice_exactly_when_its_rewrite_fits(graph: Graph, data: st.DataObject) -> None:
    """At every choice of recomputes and cuts, the MILP's rows (its anchors and the least
    auxiliaries: ``warm_point``) hold for the rewritten graph's real peak and break one
    byte under it: the model counts every step ``sim`` counts, dead sibling outputs too."""
    model = build_model(graph)
    options = cut_options(model)
    assume(options is not None)
    assert options is not None
    drawn = {i: data.draw(st.integers(0, len(opts) - 1)) for i, opts in enumerate(options) if data.draw(st.booleans())}
    effective = evaluate(with_cuts(model, options, drawn), drawn).chosen
    chosen = {i: drawn[i] for i in effective}
    real = peak(apply_recompute(graph, *choice_names(model, chosen)))
    fits = CutProgram(model, options, real - model.static_bytes)
    assert violated_rows(fits, warm_point(fits, chosen)) == []
    tight = CutProgram(model, options, real - 1 - model.static_bytes)
    assert violated_rows(tight, warm_point(tight, chosen)) != []


def test_the_heuristic_equals_the_milp_on_uneven() -> None:
    graph = uneven()
    found = fit_cuts(build_model(graph), 320, "exact", 10.0, beat=float("inf"))
    assert found is not None and found.cost == milp_cost(graph, 320) == 1.0


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(training_graphs())
def test_graphs_with_a_backward_pass_are_outside_the_model(graph: Graph) -> None:
    model = build_model(graph)
    assert cut_options(model) is None and solve_cuts(model, 1, 1.0) is None


def dead_sibling_dag() -> Graph:
    """Found by hypothesis on ``small_dags`` (CI, 2026-11-27): two-output ops whose other
    outputs nobody reads (``t0``/``u0``, ``t3``)."""
    sizes = {"t0": 1, "u0": 1, "t1": 2, "t2": 1, "t3": 2, "u3": 1, "t4": 1}
    reads = [("x",), ("x",), ("x",), ("x",), ("t1",), ("u3", "t4")]
    writes = [("t0", "u0"), ("t1",), ("t2",), ("t3", "u3"), ("t4",), ("out",)]
    tensors = (Tensor("x", 4, Kind.INPUT), *(Tensor(t, b) for t, b in sizes.items()), Tensor("out", 1, Kind.OUTPUT))
    names = ["O0", "O1", "O2", "O3", "O4", "OUT"]
    ops = tuple(Op(name, "f", ins, outs, 1.0) for name, ins, outs in zip(names, reads, writes))
    return Graph("dag", tensors, ops, ("out",)).validate()


def test_a_recompute_that_rewrites_a_dead_sibling_output() -> None:
    """``O3``'s recompute before ``OUT`` re-makes ``t3`` too, which lives for that step: the
    MILP once left it out there and called a rewrite of peak 8 optimal for budget 7."""
    graph = dead_sibling_dag()
    budget = int(0.875 * peak(graph))
    assert peak(apply_recompute(graph, ["O1", "O3"], {"t1": "O4", "u3": "OUT"})) == 8 > budget
    assert milp_cost(graph, budget) is None and least_cut_cost(graph, budget) is None
    assert milp_cost(graph, 8) == least_cut_cost(graph, 8)


def dead_siblings_dag() -> Graph:
    """Found by a random search for a cut heuristic's answer that recomputes an op with an
    output nobody reads (``O2`` writing ``u2``; ``O6`` writing ``u6``) and fits its budget
    of 30 bytes exactly."""
    sizes = {"t0": 6, "t1": 3, "t2": 5, "u2": 7, "t3": 8, "t4": 2, "t5": 7, "t6": 7, "u6": 4, "t7": 6}
    reads = [("x",), ("t0", "x"), ("t1",), ("t1",), ("x", "t1"), ("t3", "t4", "x"), ("t4", "t5", "x"),
             ("t3", "t4", "t2"), ("t6", "t7")]
    writes = [("t0",), ("t1",), ("t2", "u2"), ("t3",), ("t4",), ("t5",), ("t6", "u6"), ("t7",), ("out",)]
    tensors = (Tensor("x", 4, Kind.INPUT), *(Tensor(t, b) for t, b in sizes.items()), Tensor("out", 1, Kind.OUTPUT))
    names = [f"O{k}" for k in range(8)] + ["OUT"]
    ops = tuple(Op(name, "f", ins, outs, 1.0) for name, ins, outs in zip(names, reads, writes))
    return Graph("dag", tensors, ops, ("out",)).validate()


def test_the_cut_heuristic_counts_a_dead_sibling_output() -> None:
    """``fit_cuts`` recomputes ``O2`` (re-making ``u2``) and fits 30 bytes exactly, at the
    least cost of the brute force and of the MILP; its plan passes the verifier."""
    graph = dead_siblings_dag()
    found = fit_cuts(build_model(graph), 30, "exact", 10.0, beat=float("inf"))
    assert found is not None and "O2" in found.names
    rewritten = apply_recompute(graph, found.names, found.from_ops)
    assert "u2@recompute" in {t.name for t in rewritten.tensors} and peak(rewritten) == 30
    assert found.cost == least_cut_cost(graph, 30) == milp_cost(graph, 30)
    verify(graph, planned_with(graph, result_of(graph, found.names, "budget", peak(graph), 0.0,
                                                from_ops=found.from_ops)))

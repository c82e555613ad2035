"""remat's budget in the planner: the budget bounds what the device holds, order comes first.

``plan`` with ``remat: budget`` returns a plan whose planned peak (arena at the
alignment plus static, on every device) is within the budget, or raises
``RematInfeasibleError`` carrying the best infeasible plan, which the CLI writes
next to the refusal (exit 3).  When the planner's own order fits, nothing is
recomputed.  Every plan goes through the verifier.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import run, write_config
from test_remat import layered_graphs, peak, small_chain, training_graphs

from mpplan.capture import synthetic
from mpplan.capture.graph_file import save_graph
from mpplan.config import Device
from mpplan.graph import Graph
from mpplan.passes.remat import RematInfeasibleError, apply_recompute, remat
from mpplan.passes.remat.result import records_of
from mpplan.passes.remat.fit import fit_planned, in_order, next_target
from mpplan.plan import load_plan
from mpplan.planner import PlannerSettings, memory_model, plan, rematerialised
from mpplan.units import format_size
from mpplan.verify import verify

ONE = [Device("cuda:0", 1 << 40)]


def planned_or_refused(graph: Graph, budget: int | float, **kwargs: object):
    """The plan, or the refusal's best plan; both verified."""
    settings = PlannerSettings(remat="budget", remat_budget=budget, remat_time_limit_s=20, **kwargs)
    try:
        made = plan(graph, ONE, settings)
    except RematInfeasibleError as exc:
        assert exc.plan is not None
        verify(graph, exc.plan)
        return exc.plan, False
    verify(graph, made)
    return made, True


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(training_graphs(), layered_graphs()), st.floats(0.3, 1.0), st.sampled_from([1, 64, 512]),
       st.sampled_from(["auto", "as_given"]))
def test_the_planned_peak_is_within_the_budget_or_the_best_plan_is_refused(
    graph: Graph, fraction: float, alignment: int, schedule: str
) -> None:
    budget = int(fraction * peak(graph))
    made, fits = planned_or_refused(graph, budget, alignment=alignment, schedule=schedule)
    chosen = made.settings["remat_chosen"]
    assert chosen["budget_bytes"] == budget and chosen["fits"] == fits
    assert (made.max_peak_bytes <= budget) == fits
    assert made.settings["alignment"] == alignment
    ops = dict.fromkeys(r["op"] for r in made.remat)
    cuts = {r.tensor: r.from_op for r in made.remat if r.from_op is not None}  # a cut search's recompute points
    modelled = memory_model(graph, made.settings["grads"])  # the graph the planner recomputed in
    assert rematerialised(graph, made).content_hash == apply_recompute(modelled, ops, cuts).content_hash


def test_the_planners_order_first_recomputes_nothing_when_it_fits() -> None:
    """random_layered(40, seed=1): the planner's order needs 21% less than the given one."""
    graph = synthetic.random_layered(40, seed=1, train=False)
    own = plan(graph, ONE, PlannerSettings()).max_peak_bytes
    given_order = plan(graph, ONE, PlannerSettings(schedule="as_given")).max_peak_bytes
    assert own < given_order
    made, fits = planned_or_refused(graph, own)
    assert fits and made.remat == () and made.compute_overhead == 0
    assert made.settings["remat_chosen"]["order"] == "none"
    fixed, fits_fixed = planned_or_refused(graph, own, schedule="as_given")
    assert fixed.remat or not fits_fixed  # the given order must recompute to get there, or cannot


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(training_graphs(), layered_graphs()), st.floats(0.3, 1.0), st.sampled_from([64, 512]))
def test_the_own_order_never_does_worse_than_the_fixed_order(graph: Graph, fraction: float, alignment: int) -> None:
    """The own order's fit also searches the given order, planned in the given order: it
    fits wherever the fixed order fits, at no more recomputation."""
    budget = int(fraction * peak(graph))
    fixed, fixed_fits = planned_or_refused(graph, budget, alignment=alignment, schedule="as_given")
    own, own_fits = planned_or_refused(graph, budget, alignment=alignment, schedule="auto")
    assert own_fits or not fixed_fits
    if fixed_fits:
        assert own.compute_overhead <= fixed.compute_overhead + 1e-12
    else:
        assert own_fits or own.max_peak_bytes <= fixed.max_peak_bytes


def test_the_own_order_plans_the_given_orders_recomputes_in_the_given_order() -> None:
    """A scheduler that plans every rewrite 50% over its ``static + LOAD`` (recomputes
    moved where they cost memory): the own order's fit still plans the given order's
    recomputes in the given order, so it fits where the fixed order fits, at its cost
    (before: refused, every rewrite planned by the own scheduler)."""
    graph = small_chain(12)
    budget = int(0.85 * peak(graph))
    given_calls: list[int] = []

    def plan_own(rewritten: Graph) -> tuple[int, int, list[str]]:
        planned = peak(rewritten) if rewritten is graph else int(1.5 * peak(rewritten))
        return planned, planned, [op.name for op in rewritten.ops]

    def plan_given(rewritten: Graph) -> tuple[int, int, list[str]]:
        given_calls.append(peak(rewritten))
        return peak(rewritten), peak(rewritten), [op.name for op in rewritten.ops]

    fixed = fit_planned(graph, budget, plan_given, solver="heuristic", time_limit_s=20)
    own = fit_planned(graph, budget, plan_own, plan_given=plan_given, solver="heuristic", time_limit_s=20)
    assert fixed.fits and fixed.result.added_cost > 0
    assert own.fits and own.order == "as_given" and own.result.added_cost == fixed.result.added_cost
    with pytest.raises(RematInfeasibleError):  # the own scheduler alone plans every rewrite over the budget
        fit_planned(graph, budget, plan_own, solver="heuristic", time_limit_s=20)


def test_the_arena_not_just_load_is_held_to_the_budget() -> None:
    """At alignment 512 the rewrite that fits ``static + LOAD`` plans 5% over the budget; the
    planner aims lower until the planned peak fits."""
    graph = synthetic.chain(12, train=True, batch=64, width=8, seed=1)
    budget = int(0.9 * peak(graph))
    load_only = remat(graph, "budget", budget=budget)
    assert load_only.peak_bytes <= budget
    # remat() bounds the graph as given, gradients static: plan it under that same model
    as_given = PlannerSettings(alignment=512, schedule="as_given", grads="static")
    assert plan(load_only.graph, ONE, as_given).max_peak_bytes > budget
    for schedule in ("as_given", "auto"):
        made, fits = planned_or_refused(graph, budget, alignment=512, schedule=schedule)
        assert fits and made.devices[0].peak_bytes <= budget


def test_in_order_keeps_the_ops_and_rejects_partial_orders() -> None:
    graph = small_chain(3)
    names = [op.name for op in graph.ops]
    assert in_order(graph, names) is graph
    with pytest.raises(ValueError, match="expected an order of all"):
        in_order(graph, names[:-1])


def test_cli_writes_the_best_infeasible_plan_next_to_the_refusal(capsys, tmp_path) -> None:
    graph_file = save_graph(small_chain(8), tmp_path / "chain.json")
    config = write_config(
        tmp_path,
        f"""
        model: {{graph: {{path: {graph_file.name}}}}}
        devices: [{{name: gpu0, capacity: 1GiB}}]
        planner: {{remat: {{policy: budget, budget: 1000, solver: heuristic}}}}
        """,
    )
    out = tmp_path / "o"
    code, stdout, err = run(capsys, "plan", str(config), "--out", str(out))
    assert code == 3
    written = load_plan(out / "plan.json")
    assert written.max_peak_bytes > 1000 and written.remat
    # regression: the refusal said the peak in raw bytes only, and wrote no table and no report
    over = written.max_peak_bytes - 1000
    named = f"gpu0 needs {format_size(over)} ({over} bytes) more than the remat budget of 1000 B (peak "
    summary, where = stdout.strip().splitlines()[-2:]
    assert summary.startswith(f"does not fit the remat budget on 1 of 1 device(s): {named}")
    assert where.startswith("the best plan found (verified, capacities aside) is written to ")
    assert stdout.startswith("device ") and "this plan" in stdout
    assert (out / "report.md").is_file() and (out / "timeline.json").is_file()
    error, detail = err.strip().splitlines()
    assert error.startswith(f"mpplan: error: does not fit the remat budget: {named}")
    assert detail.startswith("mpplan: ") and "remat budget 1000 bytes is infeasible" in detail
    assert json.loads((out / "plan.json").read_text())["planner"]["settings"]["remat_chosen"]["fits"] is False
    code, stdout, _ = run(capsys, "verify", str(out / "plan.json"), "--graph", str(graph_file))
    assert code == 0 and "ok" in stdout


def test_cli_names_every_device_over_an_infeasible_budget_and_no_one_device_bound(capsys, tmp_path) -> None:
    """Two devices: each over the budget is named, in human sizes.  The recompute search's own
    bound (the whole graph on one device) is left out: on two devices it is not the least budget."""
    config = write_config(
        tmp_path,
        """
        model: {synthetic: {kind: transformer, layers: 2, train: true, batch: 2, seq: 16, hidden: 32, heads: 2,
                            vocab: 32}}
        devices: [{name: a, capacity: 1GiB}, {name: b, capacity: 1GiB}]
        planner: {placement: pipeline, remat: {policy: budget, budget: 1000, solver: heuristic}}
        """,
    )
    code, stdout, err = run(capsys, "plan", str(config), "--out", str(tmp_path / "o"))
    assert code == 3
    written = load_plan(tmp_path / "o" / "plan.json")
    assert all(d.peak_bytes > 1000 for d in written.devices)
    (error,) = err.strip().splitlines()
    summary = stdout.strip().splitlines()[-2]
    assert summary.startswith("does not fit the remat budget on 2 of 2 device(s): ")
    for d in written.devices:
        over = d.peak_bytes - 1000
        named = f"{d.name} needs {format_size(over)} ({over} bytes) more than the remat budget of 1000 B"
        assert named in error and named in summary


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(training_graphs(), layered_graphs()), st.lists(st.floats(0.3, 1.0), min_size=2, max_size=5),
       st.sampled_from([64, 512]))
def test_a_larger_budget_is_never_refused_by_the_planner_where_a_smaller_one_fits(
    graph: Graph, fractions: list[float], alignment: int
) -> None:
    budgets = sorted({int(f * peak(graph)) for f in fractions})
    answers = [planned_or_refused(graph, b, alignment=alignment)[1] for b in budgets]
    assert answers == sorted(answers), list(zip(budgets, answers))


def test_the_first_aim_allows_for_the_fragmentation_the_graph_plans_at() -> None:
    """A planner whose arena is 5% over ``static + LOAD`` on every graph: aiming at the budget
    itself plans 5% over it; the first aim divides it by the 5% the graph planned at without
    recomputes, so the first rewrite already fits (before: a second round of aiming)."""
    graph = small_chain(12)
    budget = int(0.85 * peak(graph))
    calls: list[int] = []

    def plan_graph(rewritten: Graph) -> tuple[int, int, list[str]]:
        planned = int(1.05 * peak(rewritten)) + 1
        calls.append(planned)
        return planned, planned, [op.name for op in rewritten.ops]

    fitted = fit_planned(graph, budget, plan_graph, solver="heuristic", time_limit_s=20)
    assert fitted.fits and fitted.peak <= budget and fitted.order == "planner"
    assert len(calls) == 2, calls  # the graph as it is, then one rewrite
    assert apply_recompute(graph, [r["op"] for r in records_of(fitted.result.graph)]) == fitted.result.graph


def test_each_retry_aims_by_the_ratio_the_last_rewrite_planned_at_and_half_its_growth() -> None:
    assert next_target(1000, 990, [1.0, 1.03]) == 956  # 1000 / (1.03 + 0.03 / 2)
    assert next_target(1000, 990, [1.02]) == int(1000 / 1.02)
    assert next_target(1000, 900, [1.0, 1.01]) == 899  # always under the last rewrite's LOAD
    assert next_target(1000, 990, [1.05, 1.02]) == int(1000 / 1.02)  # a ratio that fell is not extrapolated

"""The budget policy's contract: monotone in the budget, and a refusal carries its best answer.

A larger budget must never be refused where a smaller one fits (on a 4-layer GPT-2
the heuristic refused 108.5 MB while it planned 107.98 MB); a refusal names the
least peak found and hands back that rewrite, which the planner plans and the CLI
writes next to the refusal.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remat import layered_graphs, peak, small_chain, training_graphs

from mpplan.capture import synthetic
from mpplan.capture.graph_file import graph_from_dict
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat import RematInfeasibleError, build_model, phases, remat
from mpplan.passes.remat import ilp
from mpplan.passes.remat.budget import least_peak_choice, min_feasible_budget
from mpplan.passes.remat.greedy import heuristic
from mpplan.passes.remat.ilp import available_backend

DATA = Path(__file__).parent / "data"


def fits(graph: Graph, budget: int, solver: str) -> bool:
    try:
        result = remat(graph, "budget", budget=budget, solver=solver, time_limit_s=30)
    except InfeasibleError:
        return False
    assert result.peak_bytes <= budget
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(training_graphs(), layered_graphs()), st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6),
       st.sampled_from(["heuristic", "auto"]))
def test_a_larger_budget_is_never_refused_where_a_smaller_one_fits(graph: Graph, where: list[float],
                                                                    solver: str) -> None:
    if solver == "auto" and available_backend() is None:
        solver = "heuristic"
    model = build_model(graph)
    lower, top = model.lower_bound(), peak(graph)
    budgets = sorted({max(1, int(lower + w * (top - lower))) for w in where})
    answers = [fits(graph, b, solver) for b in budgets]
    assert answers == sorted(answers), list(zip(budgets, answers))


def test_every_budget_from_the_least_peak_up_fits() -> None:
    """Budgets at and above the least peak found all fit: a sweep over a chain, byte by byte near it."""
    graph = small_chain(10)
    with pytest.raises(RematInfeasibleError) as info:
        remat(graph, "budget", budget=build_model(graph).lower_bound() - 1, solver="heuristic")
    least = info.value.best.peak_bytes
    for budget in [least, least + 1, least + 7, *range(least + 64, peak(graph), 997)]:
        assert fits(graph, budget, "heuristic"), budget


def test_a_refusal_carries_the_least_peak_rewrite() -> None:
    graph = small_chain(8)
    budget = build_model(graph).lower_bound() - 1
    with pytest.raises(RematInfeasibleError) as info:
        remat(graph, "budget", budget=budget, solver="heuristic")
    best = info.value.best
    best.graph.validate()
    assert best.peak_bytes == peak(best.graph) > budget
    assert best.recompute_ops and best.peak_bytes < best.baseline_peak_bytes
    assert info.value.missing_bytes == best.peak_bytes - budget
    assert f"is {best.peak_bytes} bytes" in str(info.value)


def gpt2_4layer() -> Graph:
    """The graph of the bug report, kept as a fixture: Hugging Face GPT-2 with n_layer 4,
    n_head 4, n_embd 256, vocab 2048, batch 4x256, Adam, under ``grads: dynamic``
    (``capture`` of ``mpplan.zoo.gpt2:gpt2``, then ``planner.memory_model``)."""
    doc = json.loads(gzip.decompress((DATA / "gpt2_4layer_adam_dynamic.json.gz").read_bytes()))
    return graph_from_dict(doc)


@pytest.mark.parametrize("budget", [107_414_536, 107_983_880, 108_500_000, 110_207_313, 111_122_648])
def test_regression_gpt2_budgets_over_the_least_peak_are_not_refused(budget: int) -> None:
    """The heuristic refused these budgets naming 107,414,536 bytes as the smallest feasible."""
    assert fits(gpt2_4layer(), budget, "heuristic")


@pytest.mark.skipif(available_backend() is None, reason="no MILP backend installed")
def test_a_milp_not_built_within_its_time_limit_is_skipped() -> None:
    """Building the MILP counts against ``time_limit_s``: on RL1000 the build alone took
    14-32 s (only to find it over the nonzero limit) while the solve was given 13, and the
    cut phases lost that time.  A build past the limit now stops, and the heuristic decides."""
    model = build_model(small_chain(8))
    budget = (model.lower_bound() - model.static_bytes) * 5 // 4
    solved = ilp.solve(model, budget, time_limit_s=30)
    assert solved.status == "optimal" and solved.chosen
    late = ilp.solve(model, budget, time_limit_s=1e-9)
    assert (late.status, late.chosen) == ("too_large", None) and "not built within" in late.note


@pytest.mark.skipif(available_backend() is None, reason="no MILP backend installed")
@pytest.mark.parametrize("train", [False, True])
def test_a_budget_over_the_milps_least_peak_fits_though_the_milp_aimed_at_it_finds_nothing(monkeypatch,
                                                                                          train: bool) -> None:
    """RL250 at 0.775 of its peak (113,801 bytes) was refused naming the greedy's least peak (119,900) as the
    smallest budget found feasible, while 114,535 planned: the MILP aimed at the budget found no fit in its
    time, and the MILP minimising the peak (it proves 113,380 in 12 s) ran only after it, with a second left,
    and even a least peak under the budget was refused.  Here the MILP aimed at the budget finds nothing at
    all, and the budget is the MILP's least peak, under the greedy's and where the greedy aimed at it misses."""
    graph, exact_least = missed_by_the_greedy(train)
    solve = ilp.solve

    def aimed_finds_nothing(model, budget, **kwargs):
        if budget is None:  # the MILP minimising the peak
            return solve(model, budget, **kwargs)
        return ilp.IlpSolution(None, "time_limit", None, None, 0.0, "highs")

    monkeypatch.setattr(ilp, "solve", aimed_finds_nothing)
    result = remat(graph, "budget", budget=exact_least, solver="exact", time_limit_s=30)
    assert result.peak_bytes == peak(result.graph) == exact_least


def missed_by_the_greedy(train: bool) -> tuple[Graph, int]:
    """A small random layered graph and its least peak (proved by the MILP), which both the
    heuristic aimed at it and the greedy's least peak miss."""
    graph = synthetic.random_layered(16, seed=61 if train else 11, degree=2.0, train=train)
    model = build_model(graph)
    exact_least, proved = min_feasible_budget(graph, time_limit_s=30)
    dyn = exact_least - model.static_bytes
    heur = heuristic(model, dyn, time.perf_counter() + 10)
    assert proved and heur.load > dyn and least_peak_choice(model, heur).load > dyn  # the path under test
    return graph, exact_least


@pytest.mark.skipif(available_backend() is None, reason="no MILP backend installed")
def test_the_milp_minimising_the_peak_runs_past_the_first_fits_share_when_the_aimed_one_finds_nothing(
        monkeypatch) -> None:
    """On a graph without a backward pass the first fit has a third of the limit; when its MILP aimed at
    the budget runs to its limit with no fit, the MILP minimising the peak may run until a quarter of the
    limit is left (``phases.REFUSAL_SHARE``), not the one second left of the fit's third."""
    graph, exact_least = missed_by_the_greedy(train=False)
    limit_s = 6.0
    solve = ilp.solve
    given: list[float] = []

    def aimed_times_out(model, budget, **kwargs):
        if budget is None:  # the MILP minimising the peak
            given.append(kwargs["time_limit_s"])
            return solve(model, budget, **kwargs)
        time.sleep(kwargs["time_limit_s"])
        return ilp.IlpSolution(None, "time_limit", None, None, kwargs["time_limit_s"], "highs")

    monkeypatch.setattr(ilp, "solve", aimed_times_out)
    result = remat(graph, "budget", budget=exact_least, solver="exact", time_limit_s=limit_s)
    assert result.peak_bytes == peak(result.graph) <= exact_least
    assert given[0] >= (1 - phases.REFUSAL_SHARE - 1 / 3) * limit_s - 0.5, given  # 1.0 before

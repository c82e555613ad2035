"""The local search on cut points (``mpplan.passes.remat.cutsearch``).

``with_cuts`` re-cuts a model exactly as ``build_model(..., cuts=...)`` does; the search
never ends worse than its start, its answers fit (measured by ``sim`` on the rewritten
graph, and their plans pass the verifier), and it never goes under the brute force over
every subset and every cut.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp import dead_sibling_dag, small_dags
from test_remat_cuts import gapped_graphs, least_cut_cost, peak, planned_with, uneven

from mpplan import sim
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import apply_recompute, build_model, phases, remat
from mpplan.passes.remat.phases import LOCAL_SHARE, SEARCH_SHARE
from mpplan.passes.remat.result import result_of
from mpplan.passes.remat.cutexact import choice_names
from mpplan.passes.remat.cutmilp import cut_options
from mpplan.passes.remat.cutsearch import improve_cuts, search_cuts, with_cuts
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.model import RematModel
from mpplan.verify import verify


def random_choice(draw: st.DrawFn, graph: Graph) -> dict[int, int]:
    options = cut_options(build_model(graph))
    assume(options is not None)
    assert options is not None
    return {i: draw(st.integers(0, len(opts) - 1)) for i, opts in enumerate(options) if draw(st.booleans())}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.data())
def test_with_cuts_is_the_model_built_with_those_cuts(graph: Graph, data: st.DataObject) -> None:
    model = build_model(graph)
    options = cut_options(model) or []
    chosen = random_choice(data.draw, graph)
    built = build_model(graph, cuts={t: at for i, k in chosen.items() for t, at in options[i][k].cuts})
    recut = with_cuts(model, options, chosen)
    assert (recut.split, recut.early_last, recut.late_first, recut.late_last) == (
        built.split, built.early_last, built.late_first, built.late_last)
    assert [recut.cand_first_late[i] for i in chosen] == [built.cand_first_late[i] for i in chosen]
    assert built.cand_op == recut.cand_op
    assert evaluate(recut, chosen) == evaluate(built, chosen)


def searched(graph: Graph, start: dict[int, int], budget: int) -> tuple[tuple[str, ...], dict[str, str], float]:
    """The search's answer from ``start``, ``checked``."""
    model = build_model(graph)
    options = cut_options(model) or []
    return checked(graph, model, improve_cuts(model, options, start, budget, time.perf_counter() + 10.0), budget)


def checked(graph: Graph, model: RematModel, found: dict[int, int],
            budget: int) -> tuple[tuple[str, ...], dict[str, str], float]:
    """A search's answer ``found`` as names, cuts and cost, after checking it fits
    (``sim``), costs what it says and plans into a plan the verifier passes."""
    names, from_ops = choice_names(model, found)
    rewritten = apply_recompute(graph, names, from_ops)
    assert peak(rewritten) <= budget
    cost = sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
    assert cost == sum(model.cand_cost[i] for i in found)
    if names:
        verify(graph, planned_with(graph, result_of(graph, names, "budget", peak(graph), 0.0, from_ops=from_ops)))
    return names, from_ops, cost


def fitting_start(graph: Graph, fraction: float, data: st.DataObject) -> tuple[dict[int, int], int]:
    """Every candidate at a random cut, and a budget between that start's peak and the
    peak without recomputation (the start's, when recomputing everything raises the peak:
    ``test_recomputing_every_candidate_can_raise_the_peak``), so the start fits as the
    searches require; graphs with over 2000 choices are left out (brute force)."""
    model = build_model(graph)
    options = cut_options(model)
    assume(options is not None)
    assert options is not None
    combos = 1
    for per in options:
        combos *= len(per) + 1
    assume(combos <= 2000)
    start = {i: data.draw(st.integers(0, len(opts) - 1)) for i, opts in enumerate(options)}
    least = evaluate(with_cuts(model, options, start), start).peak
    return start, least + int(fraction * max(0, peak(graph) - least))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.0, 0.9), st.data())
def test_the_search_fits_never_costs_more_than_its_start_nor_less_than_brute_force(
        graph: Graph, fraction: float, data: st.DataObject) -> None:
    """From a ``fitting_start``."""
    start, budget = fitting_start(graph, fraction, data)
    *_, cost = searched(graph, start, budget)
    assert cost <= sum(build_model(graph).cand_cost[i] for i in start)
    exact = least_cut_cost(graph, budget)
    assert exact is not None and cost >= exact - 1e-9


def test_the_search_drops_what_a_wasteful_start_does_not_need() -> None:
    """``uneven`` fits 310 bytes with ``A``, ``P1``, ``Q1`` and ``C`` recomputed (``a`` cut
    at ``D``); ``A`` alone, cut there, fits too."""
    graph = uneven()
    model = build_model(graph)
    options = cut_options(model) or []
    index = {name: i for i, name in enumerate(model.candidate_names())}
    start = {index["A"]: 1, index["P1"]: 0, index["Q1"]: 0, index["C"]: 0}
    names, from_ops = choice_names(model, start)
    assert from_ops["a"] == "D" and evaluate(with_cuts(model, options, start), start).peak <= 310
    assert searched(graph, start, 310) == (("A",), {"a": "D"}, 1.0)
    found = search_cuts(model, names, from_ops, 310, time.perf_counter() + 10.0)
    assert found is not None and (found.names, found.from_ops, found.cost) == (("A",), {"a": "D"}, 1.0)
    assert search_cuts(model, ("A",), {"a": "D"}, 310, time.perf_counter() + 10.0) is None


def test_the_search_counts_the_dead_sibling_a_recompute_re_makes() -> None:
    """From ``O1`` and ``O3`` recomputed (peak 8), dropping ``O1`` first would leave ``O3``'s
    recompute re-making ``t3``, which nobody reads, beside ``t4``: 9 bytes, over the budget.
    The search drops ``O3`` instead and fits 8 at the brute force's least cost."""
    graph = dead_sibling_dag()
    assert peak(apply_recompute(graph, ["O3"], {"u3": "OUT"})) == 9
    assert searched(graph, {0: 0, 1: 0}, 8) == (("O1",), {"t1": "O4"}, 1.0)
    assert least_cut_cost(graph, 8) == 1.0


def orphaned_chain_dag() -> Graph:
    """Found by a random search: from ``O0`` to ``O3`` recomputed, pruning (most expensive
    first) keeps ``O0`` and then drops the rest, after which no late use needs ``O0``."""
    sizes = {"t0": 8, "t1": 7, "t2": 2, "t3": 1, "u3": 1, "t4": 7, "u4": 1, "t5": 3, "t6": 5}
    reads = [("x",), ("x", "t0"), ("t1", "x", "t0"), ("t2", "t1"), ("t3", "t2", "t1"), ("u3", "t3", "t2"),
             ("t5", "u3", "t1"), ("t5", "t6")]
    writes = [("t0",), ("t1",), ("t2",), ("t3", "u3"), ("t4", "u4"), ("t5",), ("t6",), ("out",)]
    costs = [3.0, 3.0, 1.0, 2.0, 3.0, 3.0, 2.0, 1.0]
    tensors = (Tensor("x", 4, Kind.INPUT), *(Tensor(t, b) for t, b in sizes.items()), Tensor("out", 1, Kind.OUTPUT))
    names = [f"O{k}" for k in range(7)] + ["OUT"]
    ops = tuple(Op(name, "f", ins, outs, cost) for name, ins, outs, cost in zip(names, reads, writes, costs))
    return Graph("dag", tensors, ops, ("out",)).validate()


def test_the_answer_names_only_recomputes_it_makes_even_without_time_to_search() -> None:
    """Past its deadline the search returns its pruned start: the choice its scoring makes,
    without ``O0``, which the pruning left no late use for (it once came back, costing 3)."""
    graph = orphaned_chain_dag()
    model = build_model(graph)
    options = cut_options(model) or []
    start = {0: 0, 1: 0, 2: 0, 3: 0}
    assert model.candidate_names()[:4] == ("O0", "O1", "O2", "O3")
    assert evaluate(with_cuts(model, options, start), start).peak == 24 > peak(graph)
    assert improve_cuts(model, options, start, 24, 0.0) == {}


def chained_dag() -> Graph:
    """A ``small_dags`` graph (shrunk by hypothesis) where recomputing every candidate,
    chains included, needs more than recomputing none (101 against 81 bytes)."""
    sizes = {"t0": 7, "t1": 1, "t2": 8, "u2": 56, "t3": 11, "t4": 1, "t5": 8, "t6": 30}
    reads = [("x",), ("x",), ("x", "t0", "t1"), ("x", "u2", "t2"), ("x", "t1", "t2"), ("u2",), ("t3",), ("t5", "t6")]
    writes = [("t0",), ("t1",), ("t2", "u2"), ("t3",), ("t4",), ("t5",), ("t6",), ("out",)]
    tensors = (Tensor("x", 4, Kind.INPUT), *(Tensor(t, b) for t, b in sizes.items()), Tensor("out", 1, Kind.OUTPUT))
    names = [f"O{k}" for k in range(7)] + ["OUT"]
    ops = tuple(Op(name, "f", ins, outs, 1.0) for name, ins, outs in zip(names, reads, writes))
    return Graph("dag", tensors, ops, ("out",)).validate()


def test_recomputing_every_candidate_can_raise_the_peak() -> None:
    """Regression: the fit property once set its budget to ``least + fraction * (peak -
    least)``, under its own start's peak when that start (every candidate recomputed)
    needs more than no recompute (101 > 81 bytes here; 86 for ``fraction`` 0.75), and
    ``improve_cuts``, given a start that does not fit, returned it: an answer over the
    budget that looked like a disagreement of ``evaluate`` and ``sim``.  They agree, step
    by step; from a fitting start the search fits."""
    graph = chained_dag()
    model = build_model(graph)
    options = cut_options(model) or []
    start = {i: 0 for i in range(len(options))}
    ev = evaluate(with_cuts(model, options, start), start)
    names, from_ops = choice_names(model, start)
    rewritten = apply_recompute(graph, names, from_ops)
    assert ev.chosen == tuple(range(len(options))) and ev.peak == peak(rewritten) == 101 > peak(graph) == 81
    assert list(ev.profile) == sim.order_profile(rewritten, range(len(rewritten.ops)))
    for budget in (101, 110):
        names, _, cost = searched(graph, start, budget)
        assert cost <= len(start)


def test_the_search_keeps_its_share_where_the_rounds_would_use_the_whole_limit(monkeypatch) -> None:
    """With ``solver="auto"`` the second-round phase stops short of the last
    ``SEARCH_SHARE`` + ``LOCAL_SHARE`` of the limit: here the rounds and the search take
    every second they are given, and the search and then the neighbourhood LNS still
    start with their shares left (without it, RL1000 at 0.9 stayed at 0.82% where the
    search reached 0.74%)."""
    limit_s = 2.0
    seconds: dict[str, float] = {}

    def rounds(model: object, limit: int, solver: str, time_limit_s: float, *, beat: float) -> None:
        time.sleep(time_limit_s)

    def search(model: object, names: object, from_ops: object, limit: int, deadline: float) -> None:
        seconds["search"] = deadline - time.perf_counter()
        time.sleep(max(0.0, deadline - time.perf_counter()))

    def local(model: object, names: object, from_ops: object, limit: int, deadline: float) -> None:
        seconds["local"] = deadline - time.perf_counter()

    monkeypatch.setattr(phases, "eligible", lambda model: False)  # a graph too large for the LNS
    monkeypatch.setattr(phases, "fit_cuts", lambda *args, **kwargs: None)
    monkeypatch.setattr(phases, "fit_rounds", rounds)
    monkeypatch.setattr(phases, "search_cuts", search)
    monkeypatch.setattr(phases, "search_local", local)
    r = remat(uneven(), "budget", budget=320, time_limit_s=limit_s)
    assert r.peak_bytes <= 320 < peak(uneven()) and r.added_cost > 0
    assert seconds.get("search", 0.0) >= 0.8 * SEARCH_SHARE * limit_s
    assert seconds.get("local", 0.0) >= 0.8 * LOCAL_SHARE * limit_s

"""The large-neighbourhood searches on cut points: ``mpplan.passes.remat.cutlns`` (sub-MILPs
of the whole cut MILP) and ``mpplan.passes.remat.cutwindow`` (each built for its neighbourhood).

Their answers fit (measured by ``sim`` on the rewritten graph, and their plans pass the
verifier), never cost more than the start, never go under the brute force over every
subset and every cut, and reach it when one window covers every candidate.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp import small_dags
from test_remat_cutsearch import checked, fitting_start
from test_remat_cuts import gapped_graphs, least_cut_cost, uneven

from mpplan.graph import Graph
from mpplan.passes.remat import build_model
from mpplan.passes.remat.cutexact import choice_names
from mpplan.passes.remat.cutlns import lns_cuts, windows
from mpplan.passes.remat.cutmilp import cut_options
from mpplan.passes.remat.cutsearch import with_cuts
from mpplan.passes.remat.cutwindow import lns_local
from mpplan.passes.remat.evaluation import evaluate


#: The two searches, alike in signature and contract.
SEARCHES = pytest.mark.parametrize("search", [lns_cuts, lns_local], ids=["cutlns", "cutwindow"])


def lns_cost(graph: Graph, start: dict[int, int], budget: int, window: int, search: Any = lns_cuts) -> float:
    """``search``'s cost from ``start``, ``checked``."""
    model = build_model(graph)
    found = search(model, cut_options(model) or [], start, budget, time.perf_counter() + 20.0, window=window)
    return checked(graph, model, found, budget)[2]


@SEARCHES
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.0, 0.9), st.integers(1, 3), st.data())
def test_small_windows_never_cost_more_than_the_start_nor_less_than_brute_force(
        search: Any, graph: Graph, fraction: float, window: int, data: st.DataObject) -> None:
    start, budget = fitting_start(graph, fraction, data)
    model = build_model(graph)
    cost = lns_cost(graph, start, budget, window, search)
    assert cost <= evaluate(with_cuts(model, cut_options(model) or [], start), start).cost
    exact = least_cut_cost(graph, budget)
    assert exact is not None and cost >= exact - 1e-9


@SEARCHES
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(gapped_graphs(), small_dags()), st.floats(0.0, 0.9), st.data())
def test_one_window_over_every_candidate_reaches_the_brute_force_optimum(
        search: Any, graph: Graph, fraction: float, data: st.DataObject) -> None:
    start, budget = fitting_start(graph, fraction, data)
    window = build_model(graph).num_candidates
    assert lns_cost(graph, start, budget, window, search) == least_cut_cost(graph, budget)


@SEARCHES
def test_windows_of_one_candidate_replace_a_wasteful_start(search: Any) -> None:
    """``uneven`` fits 310 bytes with ``A``, ``P1``, ``Q1`` and ``C`` recomputed; windows of
    one candidate (plus the chosen ones) reach ``A`` alone, cut at ``D``: the optimum."""
    graph = uneven()
    model = build_model(graph)
    index = {name: i for i, name in enumerate(model.candidate_names())}
    start = {index["A"]: 1, index["P1"]: 0, index["Q1"]: 0, index["C"]: 0}
    assert lns_cost(graph, start, 310, 1, search) == 1.0 == least_cut_cost(graph, 310)
    found = search(model, cut_options(model) or [], start, 310, time.perf_counter() + 20.0, window=1)
    assert choice_names(model, found) == (("A",), {"a": "D"})


@SEARCHES
def test_without_time_the_answer_is_the_start_less_what_no_late_use_needs(search: Any) -> None:
    graph = uneven()
    model = build_model(graph)
    options = cut_options(model) or []
    index = {name: i for i, name in enumerate(model.candidate_names())}
    start = {index["A"]: 1, index["P1"]: 0, index["Q1"]: 0, index["C"]: 0}
    effective = evaluate(with_cuts(model, options, start), start).chosen
    assert search(model, options, start, 310, time.perf_counter()) == {i: start[i] for i in effective}


def test_windows_cover_every_candidate_and_overlap_by_at_least_half() -> None:
    for n in range(1, 12):
        for width in range(1, 14):
            found = windows(n, width)
            assert {i for w in found for i in w} == set(range(n))
            assert all(len(w) == min(n, width) for w in found)
            assert all(0 < b.start - a.start <= max(1, width // 2) for a, b in zip(found, found[1:]))

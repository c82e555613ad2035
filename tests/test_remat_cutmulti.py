"""Several drops per tensor (``mpplan.passes.remat.cutmulti``).

A double drop is two rounds of ``apply_recompute`` (``F`` cut at one reader, ``F@recompute``
cut at a later one): its rewrite fits as ``sim`` says, its plan passes the verifier, and
the search from a fitting one-round answer never costs more than that answer nor less
than the brute force over every subset, every cut and every double drop.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remat_cuts import cut_options, gapped_graphs, least_cut_cost, peak, planned_with
from test_remat_cutsearch import fitting_start

from mpplan.errors import ConfigError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import apply_recompute, build_model, phases, remat
from mpplan.passes.remat.phases import LOCAL_SHARE, SEARCH_SHARE
from mpplan.passes.remat.result import result_of
from mpplan.passes.remat import cutmulti
from mpplan.passes.remat.cutexact import choice_names
from mpplan.passes.remat.cutmulti import Drop, drops_of, joint_names, search_multi
from mpplan.passes.remat.model import storage_users
from mpplan.verify import verify


def twice_read() -> Graph:
    """``a`` (cost 1) and ``b`` (cost 5) are both held across two heavy stretches; ``b``
    alone across both, ``a`` across each of two gaps."""
    act = Tensor
    tensors = (Tensor("x", 8, Kind.INPUT), act("a", 100), act("b", 100), act("c0", 1), act("big1", 300),
               act("q1", 1), act("c1", 1), act("big2", 300), act("q2", 1), Tensor("d", 1, Kind.OUTPUT))
    ops = (Op("A", "f", ("x",), ("a",), 1.0), Op("B", "f", ("x",), ("b",), 5.0),
           Op("C0", "f", ("a", "b"), ("c0",), 1.0), Op("P1", "f", ("x",), ("big1",), 1.0),
           Op("Q1", "f", ("big1",), ("q1",), 1.0), Op("C1", "f", ("a", "q1", "c0"), ("c1",), 1.0),
           Op("P2", "f", ("x",), ("big2",), 1.0), Op("Q2", "f", ("big2",), ("q2",), 1.0),
           Op("D", "f", ("a", "b", "q2", "c1"), ("d",), 1.0))
    return Graph("twice_read", tensors, ops, ("d",)).validate()


def test_a_double_drop_fits_where_one_drop_of_the_same_tensor_cannot() -> None:
    graph = twice_read()
    assert peak(graph) == 510
    assert peak(apply_recompute(graph, ["A"], {"a": "C1"})) == peak(apply_recompute(graph, ["A"], {"a": "D"})) == 510
    names, cuts = joint_names([Drop("A", "a", "C1", "D")], (), {})
    assert (names, cuts) == (("A", "A@recompute"), {"a": "C1", "a@recompute": "D"})
    twice = apply_recompute(graph, names, cuts)
    assert peak(twice) == 410
    assert [op.name for op in twice.ops if op.recompute_of] == ["A@recompute", "A@recompute@recompute"]
    verify(graph, planned_with(graph, result_of(graph, names, "budget", 510, 0.0, from_ops=cuts)))


def test_the_search_replaces_the_dear_recompute_by_a_double_drop_of_the_cheap_one() -> None:
    """One recompute per tensor fits 410 bytes at 5 at least (``B``); ``A`` dropped twice costs 2."""
    graph = twice_read()
    assert least_cut_cost(graph, 410) == 5.0
    assert peak(apply_recompute(graph, ["B"], {"b": "D"})) <= 410
    found = search_multi(graph, ["B"], {"b": "D"}, 410, time.perf_counter() + 10.0)
    assert found is not None and found.cost == 2.0
    assert (found.names, found.from_ops) == (("A", "A@recompute"), {"a": "C1", "a@recompute": "D"})
    assert search_multi(graph, found.names[:1], {"a": "D"}, 510, time.perf_counter() + 10.0) is None
    assert search_multi(graph, found.names, found.from_ops, 410, time.perf_counter() + 10.0) is None  # its own start
    assert search_multi(graph, found.names, {"a": "C1"}, 410, time.perf_counter() + 10.0) is None  # a drop uncut


def test_a_screened_answer_that_fits_cheaper_is_kept_when_the_screening_spends_the_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The screening of ``A``'s double drops from ``B`` (5) already prunes ``B``: 2.  With the
    clock past the deadline once the screening ends (no trial runs), that answer is returned."""
    graph = twice_read()
    screened = cutmulti._screened
    late = [0.0]

    def spending(*args: Any) -> Any:
        found = screened(*args)
        late[0] = 3600.0 if found else 0.0  # ``B``'s own tier has no double drop
        return found

    monkeypatch.setattr(cutmulti, "_screened", spending)
    monkeypatch.setattr(cutmulti, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + late[0]))
    found = search_multi(graph, ["B"], {"b": "D"}, 410, time.perf_counter() + 10.0)
    assert late[0] and found is not None and found.cost == 2.0
    assert (found.names, found.from_ops) == (("A", "A@recompute"), {"a": "C1", "a@recompute": "D"})
    assert peak(apply_recompute(graph, found.names, found.from_ops)) <= 410


def test_the_search_goes_on_from_double_drops() -> None:
    """From ``A`` dropped twice and ``B`` recomputed (7 at 410 bytes), the search prunes ``B``."""
    graph = twice_read()
    names, cuts = joint_names([Drop("A", "a", "C1", "D")], ("B",), {"b": "D"})
    assert names == ("A", "B", "A@recompute") and peak(apply_recompute(graph, names, cuts)) <= 410
    found = search_multi(graph, names, cuts, 410, time.perf_counter() + 10.0)
    assert found is not None and (found.names, found.from_ops, found.cost) == (
        ("A", "A@recompute"), {"a": "C1", "a@recompute": "D"}, 2.0)


def test_storage_users_count_a_views_users_as_its_bases() -> None:
    """Ops by storage (numbered by root tensor), ascending: ``C`` reads the view ``v``, so it uses ``a``."""
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("a", 8), Tensor("v", 8, alias_of="a"), Tensor("b", 8),
               Tensor("c", 8, Kind.OUTPUT))
    ops = (Op("A", "f", ("x",), ("a",)), Op("V", "view", ("a",), ("v",)), Op("B", "f", ("x",), ("b",)),
           Op("C", "f", ("v", "b"), ("c",)))
    graph = Graph("g", tensors, ops, ("c",)).validate()
    assert storage_users(graph) == {0: [0, 2], 1: [0, 1, 3], 3: [2, 3], 4: [3]}


def test_drops_of_pairs_the_gaps_of_single_output_ops() -> None:
    graph = twice_read()
    assert list(drops_of(graph, storage_users(graph), ["A", "B"])) == [
        Drop("A", "a", "C0", "C1"), Drop("A", "a", "C0", "D"), Drop("A", "a", "C1", "D")]


def least_multi_cost(graph: Graph, budget: int,
                     keep: Callable[[tuple[object, ...]], bool] = lambda combo: True) -> float | None:
    """Brute force: the least added cost of any set of recomputes, each output cut at any of
    its gaps or (single-output ops) dropped at any two of them, whose rewrite fits ``budget``;
    only combinations (per candidate: ``None``, a cut dict or a ``Drop``) that ``keep`` keeps."""
    names = build_model(graph).candidate_names()
    uses = storage_users(graph)
    options: list[list[object]] = [[None, *cut_options(graph, name), *drops_of(graph, uses, [name])] for name in names]
    best = None
    for combo in itertools.product(*options):
        if not keep(combo):
            continue
        drops = [c for c in combo if isinstance(c, Drop)]
        ops = [name for name, c in zip(names, combo) if isinstance(c, dict)]
        cuts = {t: o for c in combo if isinstance(c, dict) for t, o in c.items()}
        try:
            rewritten = apply_recompute(graph, *joint_names(drops, ops, cuts))
        except ConfigError:
            continue
        if peak(rewritten) <= budget:
            cost = sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
            best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gapped_graphs(), st.floats(0.0, 0.9), st.data())
def test_the_multi_search_fits_never_costs_more_than_its_start_nor_less_than_brute_force(
        graph: Graph, fraction: float, data: st.DataObject) -> None:
    start, budget = fitting_start(graph, fraction, data)
    model = build_model(graph)
    names, from_ops = choice_names(model, start)
    found = search_multi(graph, names, from_ops, budget, time.perf_counter() + 5.0)
    if found is None:
        return
    rewritten = apply_recompute(graph, found.names, found.from_ops)
    assert peak(rewritten) <= budget
    assert found.cost == sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
    assert found.cost < sum(model.cand_cost[i] for i in start)
    combos = 1
    uses = storage_users(graph)
    for name in model.candidate_names():
        combos *= 1 + len(cut_options(graph, name)) + len(list(drops_of(graph, uses, [name])))
    if combos > 3000:  # past what the brute force enumerates in seconds; not an assume after the search
        return
    exact = least_multi_cost(graph, budget)
    assert exact is not None and found.cost >= exact - 1e-9
    verify(graph, planned_with(graph, result_of(graph, found.names, "budget", peak(graph), 0.0,
                                                from_ops=found.from_ops)))


def slow_first_fit_and_cuts(monkeypatch: pytest.MonkeyPatch, limit_s: float) -> dict[str, float]:
    """``phases``' first fit made to take a third of ``limit_s`` and its cut phase every second it is given;
    the seconds each phase is given, filled in as they run (the cut phase's under ``"cuts"``)."""
    seconds: dict[str, float] = {}
    fit_budget = phases.fit_budget

    def slow_fit(*args: Any, **kwargs: Any) -> Any:
        found = fit_budget(*args, **kwargs)
        time.sleep(limit_s / 3)
        return found

    def cuts(model: object, limit: int, solver: str, time_limit_s: float, *, beat: float) -> None:
        seconds["cuts"] = time_limit_s
        time.sleep(max(0.0, time_limit_s))

    monkeypatch.setattr(phases, "fit_budget", slow_fit)
    monkeypatch.setattr(phases, "fit_cuts", cuts)
    return seconds


def test_the_cut_phase_ends_by_the_rounds_end_so_the_search_keeps_its_share(monkeypatch) -> None:
    """The cut phase takes half the time to the limit, but no more than to the second-round
    phase's end: here the first fit takes a third of the limit and the cut phase every second
    it is given, and the search still starts with its whole share (before, the cut phase ran
    to two thirds of the limit, past the rounds' end, and the search got a third of its share)."""
    limit_s = 3.0
    seconds = slow_first_fit_and_cuts(monkeypatch, limit_s)

    def search(model: object, names: object, from_ops: object, limit: int, deadline: float) -> None:
        seconds["search"] = deadline - time.perf_counter()

    monkeypatch.setattr(phases, "eligible", lambda model: False)  # a graph too large for the LNS
    monkeypatch.setattr(phases, "search_cuts", search)
    monkeypatch.setattr(phases, "search_local", lambda *args: None)
    r = remat(twice_read(), "budget", budget=460, time_limit_s=limit_s)
    assert r.peak_bytes <= 460 < peak(twice_read()) and r.added_cost > 0
    assert seconds["cuts"] <= (1 - SEARCH_SHARE - LOCAL_SHARE - 1 / 3) * limit_s
    assert seconds.get("search", 0.0) >= 0.8 * SEARCH_SHARE * limit_s

"""The large-neighbourhood search on the double-drop MILP (``mpplan.passes.remat.cutlns2``).

Its answers fit (``sim`` on the rewritten graph; their plans pass the verifier), cost less
than the start, never go under the brute force over the double-drop MILP's family
(``test_remat_cutmilp2.least_family_cost``), and reach it when one window covers every
candidate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import needs_shared_data, shared_data_files
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp2 import MAX_COMBOS, combos, least_family_cost
from test_remat_cutmulti import slow_first_fit_and_cuts, twice_read
from test_remat_cuts import gapped_graphs, peak, planned_with
from test_remat_cutsearch import fitting_start

from mpplan.capture.graph_file import load_graph
from mpplan.graph import Graph
from mpplan.milp.worker import MilpWorker
from mpplan.passes.remat import (
    RematInfeasibleError, apply_recompute, build_model, cutlns2, phases, programbuild, remat,
)
from mpplan.passes.remat.phases import LNS_SHARE
from mpplan.passes.remat.result import result_of
from mpplan.passes.remat.cutlns2 import SUB_SECONDS, build_seconds, choice_of, eligible, lns_doubles, search_lns
from mpplan.passes.remat.cutmilp import cut_options
from mpplan.passes.remat.cutmilp2 import DoubleProgram, double_names, double_program
from mpplan.passes.remat.cutsearch import with_cuts
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.model import RematModel
from mpplan.passes.remat.programbuild import ProgramBuild
from mpplan.passes.remat.restrict import Restriction
from mpplan.verify import verify


def start_cost(graph: Graph, program: DoubleProgram, start: dict[int, int]) -> float:
    return sum(op.cost for op in apply_recompute(graph, *double_names(program.model, program, start)).ops
               if op.recompute_of is not None)


def lns_cost(graph: Graph, start: dict[int, int], budget: int, window: int) -> float:
    """The search's cost from ``start`` (the start's when it finds nothing cheaper), after
    checking a found answer fits, costs what it says, is cheaper and plans into a plan the
    verifier passes."""
    model = build_model(graph)
    program = double_program(model, budget - model.static_bytes)
    assert program is not None
    before = start_cost(graph, program, start)
    found = lns_doubles(graph, program, start, budget, time.perf_counter() + 20.0, window=window)
    if found is None:
        return before
    rewritten = apply_recompute(graph, found.names, found.from_ops)
    assert peak(rewritten) <= budget
    assert sum(op.cost for op in rewritten.ops if op.recompute_of is not None) == found.cost < before
    verify(graph, planned_with(graph, result_of(graph, found.names, "budget", peak(graph), 0.0,
                                                from_ops=found.from_ops)))
    return found.cost


def twice_read_at_410() -> tuple[Graph, DoubleProgram, dict[int, int]]:
    """``twice_read``, its double-drop program at 410 bytes, and the start ``B`` recomputed
    from ``D`` (one drop, cost 5)."""
    graph = twice_read()
    model = build_model(graph)
    program = double_program(model, 410 - model.static_bytes)
    assert program is not None
    start = choice_of(program, ["B"], {"b": "D"})
    assert start is not None
    return graph, program, start


def one_round_start(graph: Graph, fraction: float, data: st.DataObject) -> tuple[dict[int, int], int]:
    """``fitting_start`` less what no late use needs (a one-round answer that fits), on
    graphs the brute force enumerates."""
    assume(combos(graph) <= MAX_COMBOS)
    start, budget = fitting_start(graph, fraction, data)
    model = build_model(graph)
    chosen = evaluate(with_cuts(model, cut_options(model) or [], start), start).chosen
    return {i: start[i] for i in chosen}, budget


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gapped_graphs(), st.floats(0.0, 0.9), st.integers(1, 3), st.data())
def test_small_windows_never_cost_more_than_the_start_nor_less_than_brute_force(
        graph: Graph, fraction: float, window: int, data: st.DataObject) -> None:
    start, budget = one_round_start(graph, fraction, data)
    exact = least_family_cost(graph, budget)
    assert exact is not None and lns_cost(graph, start, budget, window) >= exact - 1e-9


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gapped_graphs(), st.floats(0.0, 0.9), st.data())
def test_one_window_over_every_candidate_reaches_the_brute_force_optimum(
        graph: Graph, fraction: float, data: st.DataObject) -> None:
    start, budget = one_round_start(graph, fraction, data)
    window = build_model(graph).num_candidates
    assert lns_cost(graph, start, budget, window) == least_family_cost(graph, budget)


def test_windows_of_one_candidate_find_the_double_drop() -> None:
    """``twice_read`` at 410 bytes: ``B`` cut at ``D`` (cost 5) fits; a window of ``A``
    alone (plus ``B``, chosen) finds ``A`` dropped twice (cost 2), the optimum."""
    graph = twice_read()
    model = build_model(graph)
    program = double_program(model, 410 - model.static_bytes)
    assert program is not None
    start = choice_of(program, ["B"], {"b": "D"})
    assert start is not None and lns_cost(graph, start, 410, window=1) == 2.0 == least_family_cost(graph, 410)
    found = lns_doubles(graph, program, start, 410, time.perf_counter() + 20.0, window=1)
    assert found is not None
    assert (found.names, found.from_ops) == (("A", "A@recompute"), {"a": "C1", "a@recompute": "D"})


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_batch_of_sub_milps_starts_from_one_incumbent(monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """With ``batch`` windows per incumbent, a sub-MILP starts from the best answer of the
    batches before: the incumbent changes only between batches (here the second sub-MILP
    finds ``A`` dropped twice; with ``batch`` 2 or 3 the third, not the second, starts there)."""
    graph, program, start = twice_read_at_410()
    bases: list[dict[int, int]] = []
    solve = cutlns2._sub_answer

    def recorded(restriction: Any, base: dict[int, int], *args: Any) -> dict[int, int] | None:
        bases.append(dict(base))
        return solve(restriction, base, *args)

    monkeypatch.setattr(cutlns2, "_sub_answer", recorded)
    found = lns_doubles(graph, program, start, 410, time.perf_counter() + 20.0, window=1, batch=batch)
    assert found is not None and found.cost == 2.0
    assert len(bases) > batch and bases[:batch] == [start] * batch and bases[-1] != start
    assert all(bases[k] == bases[k - 1] for k in range(1, len(bases)) if k % batch)  # it changes between batches


def test_choice_of_inverts_double_names() -> None:
    graph = twice_read()
    model = build_model(graph)
    program = double_program(model, 410 - model.static_bytes)
    assert program is not None
    for i, options in enumerate(program.options):
        for k in range(len(options)):
            assert choice_of(program, *double_names(model, program, {i: k})) == {i: k}
    names = ["A", "C0", "A@recompute"]  # a double drop of A with C0, which reads it, recomputed: out of scope
    assert choice_of(program, names, {"a": "C1", "a@recompute": "D", "c0": "C1"}) is None
    assert choice_of(program, ["A"], {"a": "Q1"}) is None  # no gap ends at Q1: no option cuts there


def test_without_time_nothing_is_found() -> None:
    graph, program, start = twice_read_at_410()
    assert lns_doubles(graph, program, start, 410, time.perf_counter()) is None


def test_a_program_built_in_the_background_is_the_program() -> None:
    graph = twice_read()
    model = build_model(graph)
    built, direct = ProgramBuild(model, 410).result(), double_program(model, 410 - model.static_bytes)
    assert built is not None and direct is not None
    assert (built.cost, built.row_lo, built.row_hi, built.starts, built.index_nz, built.values_nz) == (
        direct.cost, direct.row_lo, direct.row_hi, direct.starts, direct.index_nz, direct.values_nz)


def test_a_stopped_build_is_no_program() -> None:
    """``double_program``'s memory rows end at a set ``stop`` (``ProgramBuild.cancel``)."""
    graph = twice_read()
    model = build_model(graph)
    stop = threading.Event()
    assert double_program(model, 410 - model.static_bytes, stop=stop) is not None
    stop.set()
    assert double_program(model, 410 - model.static_bytes, stop=stop) is None


def blocked_build(monkeypatch: pytest.MonkeyPatch) -> tuple[list[threading.Event], threading.Event]:
    """``ProgramBuild``'s ``double_program`` made to wait on its stop event (10 s at most, then
    it fails); the stop events it was given, and an event set once it has returned."""
    seen: list[threading.Event] = []
    finished = threading.Event()

    def blocked(model: RematModel, dyn_budget: int, max_nonzeros: int, stop: threading.Event) -> None:
        seen.append(stop)
        stopped = stop.wait(10.0)
        finished.set()
        if not stopped:
            raise AssertionError("the build was never stopped")

    monkeypatch.setattr(programbuild, "double_program", blocked)
    return seen, finished


def test_a_build_not_done_by_the_deadline_is_cancelled(monkeypatch) -> None:
    seen, finished = blocked_build(monkeypatch)
    build = ProgramBuild(build_model(twice_read()), 410)
    assert build.result(time.perf_counter()) is None
    assert finished.wait(10.0) and seen[0].is_set()
    assert build.result() is None and build.done()


def test_remat_that_raises_stops_its_build(monkeypatch) -> None:
    """An infeasible budget raises before the LNS consumes the build: ``remat`` cancels it."""
    seen, finished = blocked_build(monkeypatch)
    graph = twice_read()
    assert eligible(build_model(graph))
    with pytest.raises(RematInfeasibleError):
        remat(graph, "budget", budget=200, time_limit_s=1.0)
    assert finished.wait(10.0) and len(seen) == 1 and seen[0].is_set()


def test_a_build_that_cannot_end_before_the_lns_share_is_not_started(monkeypatch) -> None:
    """With a limit too short for the build to end before the LNS's share, ``remat`` starts no
    build (it would hold the GIL beside the fits) and runs the cut searches instead; a little
    longer, and it does."""
    graph = twice_read()
    model = build_model(graph)
    limit_s = 3.0
    span = build_seconds(model) / cutlns2.SECONDS_PER_SPAN
    started: list[int] = []

    def recorded(model: RematModel, limit: int) -> ProgramBuild:
        started.append(limit)
        return ProgramBuild(model, limit)

    monkeypatch.setattr(phases, "ProgramBuild", recorded)
    for scale, builds in ((1.01, 0), (0.99, 1)):
        monkeypatch.setattr(cutlns2, "SECONDS_PER_SPAN", scale * (1 - LNS_SHARE) * limit_s / span)
        r = remat(graph, "budget", budget=410, time_limit_s=limit_s)
        assert len(started) == builds and r.peak_bytes <= 410
        verify(graph, planned_with(graph, r))


def test_search_lns_refuses_a_build_at_another_limit() -> None:
    graph = twice_read()
    build = ProgramBuild(build_model(graph), 410)
    with pytest.raises(AssertionError, match="another limit"):
        search_lns(graph, ["B"], {"b": "D"}, 420, time.perf_counter() + 5.0, build)


def test_a_sub_milp_built_past_the_deadline_is_not_solved(monkeypatch) -> None:
    """The time a sub-MILP's build takes counts: one done past the deadline is not solved
    (here a fake clock moves 10 s while it builds, with 5 s left before)."""
    graph, program, start = twice_read_at_410()
    now = [0.0]
    restriction = Restriction(program)
    build = restriction.sub_milp

    def slow_build(chosen: Mapping[int, int], free: set[int]) -> Any:
        now[0] += 10.0
        return build(chosen, free)

    def unused(*args: Any) -> None:
        raise AssertionError("a sub-MILP was solved past the deadline")

    monkeypatch.setattr(restriction, "sub_milp", slow_build)
    monkeypatch.setattr(cutlns2, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(cutlns2, "solve_arrays", unused)
    free = set(range(len(program.y_cols)))
    with MilpWorker() as worker:
        assert cutlns2._sub_answer(restriction, start, free, "highs", 5.0, SUB_SECONDS, worker) is None


def test_auto_gives_the_lns_its_share_after_a_short_cut_phase(monkeypatch) -> None:
    """On a graph whose double-drop program is ``eligible``, ``solver="auto"`` ends the cut
    phase short of the last ``LNS_SHARE`` of the limit and runs the LNS there instead of
    the two searches: here the first fit takes a third of the limit and the cut phase every
    second it is given, and the LNS still starts with its share, its program built meanwhile."""
    limit_s = 3.0
    seconds = slow_first_fit_and_cuts(monkeypatch, limit_s)

    def lns(graph: Graph, names: Sequence[str], from_ops: Mapping[str, str], limit: int, deadline: float,
            build: ProgramBuild | None = None) -> Any:
        seconds["lns"] = deadline - time.perf_counter()
        assert build is not None and build.done()  # built while the first fit ran
        return search_lns(graph, names, from_ops, limit, deadline, build)

    def unused(*args: Any) -> None:
        raise AssertionError("a search ran in the LNS's share")

    monkeypatch.setattr(phases, "search_lns", lns)
    monkeypatch.setattr(phases, "search_cuts", unused)
    monkeypatch.setattr(phases, "search_local", unused)
    graph = twice_read()
    r = remat(graph, "budget", budget=410, time_limit_s=limit_s)
    assert seconds["cuts"] <= (1 - LNS_SHARE - 1 / 3) * limit_s + 1e-9
    assert seconds["lns"] >= 0.8 * LNS_SHARE * limit_s
    assert r.peak_bytes <= 410 and r.added_cost == 2.0 == least_family_cost(graph, 410)
    verify(graph, planned_with(graph, r))


@needs_shared_data
def test_rl1000_is_not_eligible_and_rl250_is() -> None:
    """``MAX_SPAN`` lies between the two graphs the schedule was measured on."""
    found = {}
    for size in (250, 1000):
        (path,) = shared_data_files(f"random_layered_n{size}_*.json")
        found[size] = eligible(build_model(load_graph(path)))
    assert found == {250: True, 1000: False}

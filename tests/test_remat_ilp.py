"""``ilp.solve_arrays``' cold re-solve of a warm-started HiGHS answer whose values do not
make its objective: it gets only the time the first solve left, and none at all past the
limit (then the values handed back are the answer, at the objective they make).  Driven by
a fake HiGHS and a fake clock, not by timing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mpplan.passes.remat import ilp
from mpplan.passes.remat.sparse import SparseMilp


def two_columns() -> SparseMilp:
    milp = SparseMilp()
    for cost in (1.0, 2.0):
        milp.column(cost, 0.0, 1.0, True)
    return milp


def fake_highs(monkeypatch: pytest.MonkeyPatch, first_takes: float) -> list[tuple[float, list[float] | None]]:
    """The first (warm) solve takes ``first_takes`` s of a fake clock and hands back the start
    ``[1, 1]`` (cost 3) with the objective 1; a cold solve answers ``[1, 0]`` at 1.  The
    calls' time limits and starts, as made."""
    now = [100.0]
    calls: list[tuple[float, list[float] | None]] = []

    def solve(f: Any, time_limit_s: float, warm: list[float] | None) -> Any:
        calls.append((time_limit_s, warm))
        if warm is not None:
            now[0] += first_takes
            return "optimal", [1.0, 1.0], 1.0, 0.5
        return "optimal", [1.0, 0.0], 1.0, 1.0

    monkeypatch.setattr(ilp, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(ilp, "solve_highspy", solve)
    return calls


def test_the_cold_solve_gets_the_time_left(monkeypatch) -> None:
    calls = fake_highs(monkeypatch, first_takes=3.0)
    assert ilp.solve_arrays(two_columns(), "highs", 5.0, [1.0, 1.0]) == ("optimal", [1.0, 0.0], 1.0, 1.0)
    assert calls == [(5.0, [1.0, 1.0]), (2.0, None)]


def test_without_time_left_the_values_handed_back_are_the_answer(monkeypatch) -> None:
    calls = fake_highs(monkeypatch, first_takes=5.0)
    assert ilp.solve_arrays(two_columns(), "highs", 5.0, [1.0, 1.0]) == ("time_limit", [1.0, 1.0], 3.0, 0.5)
    assert len(calls) == 1


def test_a_warm_answer_that_makes_its_objective_is_kept(monkeypatch) -> None:
    calls = fake_highs(monkeypatch, first_takes=1.0)
    milp = two_columns()
    milp.cost[1] = 0.0  # [1, 1] now costs 1, the objective handed back
    assert ilp.solve_arrays(milp, "highs", 5.0, [1.0, 1.0]) == ("optimal", [1.0, 1.0], 1.0, 0.5)
    assert len(calls) == 1

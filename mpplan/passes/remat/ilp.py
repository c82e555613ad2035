"""The exact solver of remat's ``budget`` policy: build the MILP
(``mpplan.passes.remat.formulation``, which describes it), solve it with HiGHS
(``highspy``, else ``scipy.optimize.milp``), and map the answer back to candidates.
``solve_arrays`` is every remat and assign MILP's way to a backend (``backends``), through
a ``mpplan.milp.worker.MilpWorker`` so that a solve which ignores its time limit is killed."""

from __future__ import annotations

import importlib.util
import math
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mpplan.milp.backends import MilpArrays, Solved, solve_highspy, solve_scipy
from mpplan.milp.worker import MilpWorker
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.formulation import MAX_NONZEROS, MAX_Z_VARIABLES, Formulation
from mpplan.passes.remat.model import RematModel

__all__ = ["MAX_Z_VARIABLES", "IlpSolution", "MilpArrays", "available_backend", "solve", "solve_arrays", "warm_values"]


@dataclass(frozen=True, slots=True)
class IlpSolution:
    """A solve's outcome.  ``chosen``: candidate indices (``None``: no solution);
    ``status``: ``optimal``, ``time_limit``, ``infeasible``, ``too_large`` (over the
    size limits, or not built within the time limit) or ``error``; ``objective``/``bound``: the best cost found and a
    proved lower bound on it (bytes of dynamic peak when minimising the peak); ``size``: columns, rows,
    nonzeros of the MILP."""

    chosen: tuple[int, ...] | None
    status: str
    objective: float | None
    bound: float | None
    seconds: float
    backend: str
    note: str = ""
    size: tuple[int, int, int] = (0, 0, 0)


def available_backend() -> str | None:
    """``highs`` (highspy), ``scipy-highs`` (scipy.optimize.milp), or ``None``."""
    if importlib.util.find_spec("highspy") is not None:
        return "highs"
    if importlib.util.find_spec("scipy") is not None:
        try:
            from scipy.optimize import milp  # noqa: F401
        except ImportError:
            return None
        return "scipy-highs"
    return None


def solve(
    model: RematModel,
    dyn_budget: int | None,
    *,
    time_limit_s: float = 60.0,
    warm_start: Sequence[int] | None = None,
    backend: str | None = None,
) -> IlpSolution:
    """Least-cost candidates keeping every step's dynamic bytes within ``dyn_budget``
    (``None``: the candidates giving the least peak).  ``warm_start`` is a feasible
    choice to start from."""
    clock = time.perf_counter()
    backend = backend or available_backend()
    if backend is None:
        return IlpSolution(None, "error", None, None, 0.0, "none", "no MILP backend installed")
    built = Formulation(model, dyn_budget, deadline=clock + time_limit_s)
    if built.too_large:
        why = f"not built within {time_limit_s:g} s" if built.out_of_time else f"over {MAX_NONZEROS:,} nonzeros"
        return IlpSolution(
            None, "too_large", None, None, round(time.perf_counter() - clock, 6), backend,
            f"MILP skipped: {why}; used the heuristic",
        )
    warm = warm_values(built, warm_start) if warm_start is not None and backend == "highs" else None
    remaining = max(0.1, time_limit_s - (time.perf_counter() - clock))
    x: list[float] | None
    if not built.cost:  # nothing to decide: the rows are constants
        fits = all(lo <= 0.0 <= hi for lo, hi in zip(built.row_lo, built.row_hi))
        status, x, objective, bound = ("optimal", [], 0.0, 0.0) if fits else ("infeasible", None, None, None)
    else:
        status, x, objective, bound = solve_arrays(built, backend, remaining, warm)
    seconds = round(time.perf_counter() - clock, 6)
    size = (len(built.cost), len(built.row_lo), len(built.values_nz))
    chosen = None if x is None else tuple(i for i, c in enumerate(built.r_col) if x[c] > 0.5)
    scale = built.unit if dyn_budget is None else built.objective_scale
    objective = None if objective is None else objective * scale
    bound = None if bound is None or not math.isfinite(bound) else bound * scale
    if dyn_budget is None and bound is not None:
        bound = max(bound, float(built.lower_dyn))
    note = {"time_limit": f"time limit {time_limit_s:.0f}s reached", "error": "the MILP solver failed"}.get(status, "")
    return IlpSolution(chosen, status, objective, bound, seconds, backend, note, size)


def warm_values(f: Formulation, chosen: Sequence[int]) -> list[float]:
    """Column values of ``f`` for the choice ``chosen`` (a full point, feasible if the choice
    fits): the warm start HiGHS gets from the heuristic."""
    ev = evaluate(f.model, chosen)
    x = [0.0] * len(f.cost)
    for i in ev.chosen:
        x[f.r_col[i]] = 1.0
    for i, a in ev.anchor.items():
        for anchor, col in zip(f.anchors[i], f.z_cols[i]):
            if anchor >= a:
                x[col] = 1.0
    for i in set(chosen) - set(ev.chosen):
        x[f.r_col[i]] = 1.0
    for aux, bounds in f.aux_bounds:
        need = max((c0 + sum(coef * x[col] for col, coef in expr.items()) for expr, c0 in bounds), default=0.0)
        x[aux] = min(1.0, max(0.0, need))
    if f.m_col >= 0:
        x[f.m_col] = max(f.col_lo[f.m_col], ev.load / f.unit)
    return x


# --- backends ------------------------------------------------------------------------


def solve_arrays(
    f: MilpArrays, backend: str, time_limit_s: float, warm: list[float] | None = None,
    worker: MilpWorker | None = None,
) -> Solved:
    """Minimise ``f`` with ``backend`` (``available_backend``'s answer): status (``optimal``,
    ``time_limit``, ``infeasible`` or ``error``), column values, objective and proved bound.
    The solve runs through ``worker`` (a loop of solves holds one), else a ``MilpWorker`` of
    its own: a big program's solve that overruns ``time_limit_s`` (HiGHS 1.16's presolve can)
    is killed and answers ``time_limit`` with no values.
    A warm-started HiGHS answer whose values do not make its objective is solved again cold
    in the time left of ``time_limit_s``: HiGHS 1.16 can hand back the start's values with the
    optimum's objective (``tests/test_remat_cutwindow.py``: a three-candidate graph); with no
    time left, those values are the answer, ``time_limit`` with the objective they make."""
    if worker is None:
        with MilpWorker() as own:
            return solve_arrays(f, backend, time_limit_s, warm, own)
    if backend != "highs":
        return worker.solve(solve_scipy, f, time_limit_s, warm)
    clock = time.perf_counter()
    found = worker.solve(solve_highspy, f, time_limit_s, warm)
    _, x, objective, bound = found
    if warm is None or x is None or objective is None or _makes(f, x, objective):
        return found
    left = time_limit_s - (time.perf_counter() - clock)
    if left <= 0:
        return "time_limit", x, sum(map(operator.mul, f.cost, x)), bound
    return worker.solve(solve_highspy, f, left, None)


def _makes(f: MilpArrays, x: list[float], objective: float) -> bool:
    """Whether ``x`` costs ``objective`` under ``f`` (to HiGHS's tolerances, relative to large costs)."""
    return math.isclose(sum(map(operator.mul, f.cost, x)), objective, rel_tol=1e-7, abs_tol=1e-6)

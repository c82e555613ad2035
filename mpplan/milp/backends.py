"""The two MILP backends, each one solve in the calling process: HiGHS through ``highspy``,
and ``scipy.optimize.milp`` (HiGHS bundled in scipy).  ``mpplan.milp.worker`` runs them where
an overrun can be killed; ``mpplan.passes.remat.ilp.solve_arrays`` is the entry point every
caller uses.  A program's arrays may be lists (as built) or numpy arrays (as a worker gets
them): both are read through ``numpy.asarray``."""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["PARALLEL_ROWS_AND_COLUMNS", "Backend", "MilpArrays", "Solved", "in_process", "solve_highspy",
           "solve_scipy"]


class MilpArrays(Protocol):
    """A MILP as the backends take it: columns (cost, bounds, integrality) and rows in CSR."""

    cost: list[float]
    col_lo: list[float]
    col_hi: list[float]
    integer: list[bool]
    row_lo: list[float]
    row_hi: list[float]
    starts: list[int]
    index_nz: list[int]
    values_nz: list[float]


#: A solve's answer: status (``optimal``, ``time_limit``, ``infeasible`` or ``error``),
#: column values, objective and proved bound.
Solved = tuple[str, list[float] | None, float | None, float | None]

#: A backend: ``(milp, time_limit_s, warm start or None) -> Solved``.
Backend = Callable[[MilpArrays, float, list[float] | None], Solved]


def quiet_highs(highspy: Any) -> Any:
    """A ``highspy.Highs``, without the banner its C++ constructor writes to the process's
    stdout (file descriptor 1, past ``sys.stdout``) the first time: it would land in the
    middle of the CLI's output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


#: HiGHS's presolve rule 13, "parallel rows and columns" (a ``presolve_rule_off`` bit): in
#: HiGHS 1.16 it can ignore ``time_limit`` (``mpplan.milp.worker``).
PARALLEL_ROWS_AND_COLUMNS = 1 << 13


def solve_highspy(f: MilpArrays, time_limit_s: float, warm: list[float] | None, *, rules_off: int = 0) -> Solved:
    """Minimise ``f`` with ``highspy`` under HiGHS's own ``time_limit`` (which HiGHS 1.16's
    presolve rule 13 can ignore: ``mpplan.milp.worker``), started from ``warm`` if given, with
    the presolve rules whose bits ``rules_off`` sets switched off."""
    import highspy
    import numpy as np

    h = quiet_highs(highspy)
    h.setOptionValue("output_flag", False)
    if rules_off:
        h.setOptionValue("presolve_rule_off", rules_off)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 1e-9)
    lp = highspy.HighsLp()
    lp.num_col_ = len(f.cost)
    lp.num_row_ = len(f.row_lo)
    lp.col_cost_ = np.asarray(f.cost, dtype=float)
    lp.col_lower_ = np.asarray(f.col_lo, dtype=float)
    lp.col_upper_ = _highs_infinities(highspy, np.asarray(f.col_hi, dtype=float))
    lp.row_lower_ = _highs_infinities(highspy, np.asarray(f.row_lo, dtype=float))
    lp.row_upper_ = _highs_infinities(highspy, np.asarray(f.row_hi, dtype=float))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.asarray(f.starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(f.index_nz, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(f.values_nz, dtype=float)
    lp.integrality_ = [highspy.HighsVarType.kInteger if b else highspy.HighsVarType.kContinuous for b in f.integer]
    h.passModel(lp)
    if warm is not None:
        solution = highspy.HighsSolution()
        solution.col_value = list(warm)
        solution.value_valid = True
        h.setSolution(solution)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    has_solution = info.primal_solution_status == 2
    x = list(h.getSolution().col_value) if has_solution else None
    objective = info.objective_function_value if has_solution else None
    bound = info.mip_dual_bound
    names = highspy.HighsModelStatus
    if status == names.kOptimal:
        return "optimal", x, objective, objective if bound is None else bound
    if status == names.kInfeasible:
        return "infeasible", None, None, None
    if status in (names.kTimeLimit, names.kInterrupt, names.kIterationLimit, names.kSolutionLimit):
        return "time_limit", x, objective, bound
    return "error", x, objective, None


def _highs_infinities(highspy: Any, values: Any) -> Any:
    """``values`` with each infinite bound as HiGHS's infinity (``kHighsInf``), of its sign."""
    import numpy as np

    if math.isinf(highspy.kHighsInf):
        return values
    return np.where(np.isinf(values), np.copysign(highspy.kHighsInf, values), values)


def solve_scipy(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    """Minimise ``f`` with ``scipy.optimize.milp`` (which takes no starting point: ``warm`` is ignored)."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    del warm  # scipy's milp takes no starting point
    matrix = csr_matrix(
        (np.array(f.values_nz, dtype=float), np.array(f.index_nz), np.array(f.starts)),
        shape=(len(f.row_lo), len(f.cost)),
    )
    constraints = [LinearConstraint(matrix, np.array(f.row_lo), np.array(f.row_hi))] if len(f.row_lo) else []
    result = milp(
        np.array(f.cost),
        integrality=np.array(f.integer, dtype=int),
        bounds=Bounds(np.array(f.col_lo), np.array(f.col_hi)),
        constraints=constraints,
        options={"time_limit": float(time_limit_s), "mip_rel_gap": 0.0, "disp": False},
    )
    x = None if result.x is None else list(result.x)
    bound = getattr(result, "mip_dual_bound", None)
    if result.status == 0:
        return "optimal", x, result.fun, result.fun if bound is None else bound
    if result.status == 2:
        return "infeasible", None, None, None
    if result.status == 1:
        return "time_limit", x, None if x is None else result.fun, bound
    return "error", x, None, None


def in_process(backend: Backend) -> Backend:
    """``backend`` as it runs in the planner's own process, where nothing could stop a solve
    that overruns its limit: HiGHS without presolve rule 13, the one known to (it costs
    quality on big programs, which run in a worker with the rule on; scipy's ``milp`` cannot
    switch it off)."""
    if backend is solve_highspy:
        return functools.partial(solve_highspy, rules_off=PARALLEL_ROWS_AND_COLUMNS)
    return backend

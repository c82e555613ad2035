"""Large-neighbourhood search on cut points with the exact cut MILP.

The cut MILP (``mpplan.passes.remat.cutmilp``) is too large for HiGHS to close on a
graph of a few hundred ops, and the ruin-and-recreate search (``cutsearch``) changes
one or two recomputes at a time.  Between the two: keep the incumbent's decision for
every candidate outside a *neighbourhood*, and let HiGHS choose the rest exactly.  A
neighbourhood is a window of ``window`` consecutive candidates (in op order) plus every
candidate the incumbent recomputes (so recomputes can be swapped for ones in the
window); windows slide by half their width, and the passes repeat while one improves.

The MILP is built once for the budget; a neighbourhood only fixes the bounds of the
other candidates' option columns (``_fixed``).  A sub-MILP's answer is kept only when
``evaluate`` on the model re-cut for it (``cutsearch.with_cuts``) fits the budget and
costs less, so the answer is never worse than the start.  With one window covering
every candidate the first sub-MILP is the whole MILP: on tiny graphs the answer is the
brute force's optimum.

Used by ``scripts/bench_remat_moccasin.py --lns``: on RL250 at 0.8 it found no cheaper
choice than the search's (docs/benchmarks.md), so ``solver: auto`` does not run it.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from typing import TypeVar

from mpplan.milp.worker import MilpWorker
from mpplan.passes.remat.cutexact import warm_point
from mpplan.passes.remat.cutmilp import CutOption, CutProgram
from mpplan.passes.remat.cutsearch import choice_cost, with_cuts
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.model import RematModel

__all__ = ["SUB_SECONDS", "WINDOW", "cheaper_fit", "effective_choice", "fits_choice", "fixed_columns", "lns_cuts",
           "windows"]

#: A cut program or one of its extensions (``cutmilp2.DoubleProgram``).
P = TypeVar("P", bound=CutProgram)

#: Candidates (consecutive in op order) a neighbourhood frees besides the chosen ones:
#: on RL250 at 0.8 HiGHS solves such a sub-MILP to optimality in 1.5-5 s.
WINDOW = 30

#: The time limit of one sub-MILP, in seconds.
SUB_SECONDS = 5.0


def windows(num_candidates: int, window: int) -> list[range]:
    """Windows of ``window`` consecutive candidates (all of them, when fewer), each
    starting half a window after the one before, and the last ending at the last one.

    >>> windows(5, 2), windows(5, 4), windows(3, 8)
    ([range(0, 2), range(1, 3), range(2, 4), range(3, 5)], [range(0, 4), range(1, 5)], [range(0, 3)])
    """
    last = max(0, num_candidates - window)
    starts = [*range(0, last, max(1, window // 2)), last]
    return [range(s, min(s + window, num_candidates)) for s in starts]


def lns_cuts(model: RematModel, options: list[list[CutOption]], start: Mapping[int, int], limit: int,
             deadline: float, *, window: int = WINDOW, sub_seconds: float = SUB_SECONDS) -> dict[int, int]:
    """A choice (candidate -> option) that fits ``limit`` bytes and costs no more than
    ``start`` (which must fit), improved by sub-MILPs over ``windows`` until a pass over
    them finds nothing or ``deadline`` (``time.perf_counter()``) passes (module docstring)."""
    best = effective_choice(model, options, start)
    backend = available_backend()
    dyn = limit - model.static_bytes
    if backend is None or time.perf_counter() >= deadline:
        return best
    program = CutProgram(model, options, dyn)
    if program.too_large:
        return best
    improved = True
    with MilpWorker() as worker:  # a sub-MILP killed past its limit (mpplan.milp.worker) finds nothing
        while improved:
            improved = False
            for free in windows(len(options), window):
                left = deadline - time.perf_counter()
                if left <= 0:
                    return best
                arrays = fixed_columns(program, best, set(free) | set(best))
                _, x, _, _ = solve_arrays(arrays, backend, min(sub_seconds, left), warm_point(program, best), worker)
                found = None if x is None else cheaper_fit(model, options, program, x, best, limit)
                if found is not None:
                    best, improved = found, True
    return best


def fixed_columns(program: P, chosen: Mapping[int, int], free: set[int]) -> P:
    """A shallow copy of ``program`` (its rows shared, not copied) with the option columns
    of every candidate outside ``free`` fixed to ``chosen``'s decision."""
    lo, hi = list(program.col_lo), list(program.col_hi)
    for i, cols in enumerate(program.y_cols):
        if i not in free:
            for k, col in enumerate(cols):
                lo[col] = hi[col] = 1.0 if chosen.get(i) == k else 0.0
    fixed = copy.copy(program)
    fixed.col_lo, fixed.col_hi = lo, hi
    return fixed


def effective_choice(model: RematModel, options: list[list[CutOption]], chosen: Mapping[int, int]) -> dict[int, int]:
    """``chosen`` less what no late use needs: the recomputes its rewrite makes."""
    return {i: chosen[i] for i in evaluate(with_cuts(model, options, chosen), chosen).chosen}


def fits_choice(model: RematModel, options: list[list[CutOption]], chosen: Mapping[int, int], limit: int) -> bool:
    """Whether ``chosen`` (candidate -> option of ``options``) fits ``limit`` bytes (static
    included) by ``evaluation.evaluate`` of its rewritten order: the check every LNS answer
    passes before it is kept, since a program's answer is trusted only once measured."""
    return evaluate(with_cuts(model, options, chosen), chosen).peak <= limit


def cheaper_fit(model: RematModel, options: list[list[CutOption]], program: CutProgram, x: list[float],
                best: Mapping[int, int], limit: int) -> dict[int, int] | None:
    """The choice a solve ``x`` of ``program``'s columns makes, less what no late use needs,
    when it costs less than ``best`` and ``fits_choice``; else ``None``."""
    found = {i: k for i, cols in enumerate(program.y_cols) for k, col in enumerate(cols) if x[col] > 0.5}
    found = effective_choice(model, options, found)
    cheaper = choice_cost(model, found) < choice_cost(model, best) * (1 - 1e-12)
    return found if cheaper and fits_choice(model, options, found, limit) else None

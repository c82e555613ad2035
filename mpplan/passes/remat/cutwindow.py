"""Large-neighbourhood search on cut points, each sub-MILP built for its neighbourhood only.

``mpplan.passes.remat.cutlns`` builds the whole cut MILP (``cutmilp``) once and fixes the
columns of every candidate outside a neighbourhood; on RL1000 that MILP is past
``formulation.MAX_NONZEROS``, so it never starts there.  Here a neighbourhood (a window of
consecutive candidates plus every candidate the incumbent recomputes, as in ``cutlns``)
gets a program of its own in which every other candidate has no option at all: it is not
recomputed, exactly what ``cutlns`` fixes its columns to, so its storages are constants,
it gets no anchor variables, and a step whose every possibly-live byte fits the budget gets
no row.  The program's columns and rows are those of the candidates it may move.

A sub-MILP's answer is kept only when ``evaluate`` on the model re-cut for it
(``cutsearch.with_cuts``) fits the budget and costs less, so the answer is never worse
than the start; a window covering every candidate is the whole MILP (on tiny graphs the
first answer is the brute force's optimum).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from mpplan.passes.remat.cutexact import warm_point
from mpplan.passes.remat.cutlns import effective_choice, fits_choice, windows
from mpplan.passes.remat.cutmilp import CutOption, CutProgram
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.model import RematModel

__all__ = ["SUB_SECONDS", "WINDOW", "lns_local", "neighbourhood_program"]

#: Candidates (consecutive in op order) a neighbourhood frees besides the chosen ones.
WINDOW = 30

#: The time limit of one sub-MILP, in seconds.
SUB_SECONDS = 5.0


def neighbourhood_program(model: RematModel, options: list[list[CutOption]], free: Iterable[int],
                          dyn_budget: int) -> CutProgram:
    """The cut MILP in which only the candidates ``free`` may be recomputed: theirs are
    ``options``' columns (same indices), every other candidate has none."""
    keep = set(free)
    return CutProgram(model, [opts if i in keep else [] for i, opts in enumerate(options)], dyn_budget)


def lns_local(model: RematModel, options: list[list[CutOption]], start: Mapping[int, int], limit: int,
              deadline: float, *, window: int = WINDOW, sub_seconds: float = SUB_SECONDS) -> dict[int, int]:
    """A choice (candidate -> option) that fits ``limit`` bytes and costs no more than
    ``start`` (which must fit), improved by one ``neighbourhood_program`` per window until a
    pass over the windows finds nothing or ``deadline`` (``time.perf_counter()``) passes."""
    best = effective_choice(model, options, start)
    backend = available_backend()
    dyn = limit - model.static_bytes
    improved = backend is not None
    while improved:
        improved = False
        for free in windows(len(options), window):
            left = deadline - time.perf_counter()
            if left <= 0:
                return best
            program = neighbourhood_program(model, options, {*free, *best}, dyn)
            left = deadline - time.perf_counter()
            if program.too_large or left <= 0:
                continue
            _, x, _, _ = solve_arrays(program, backend, min(sub_seconds, left), warm_point(program, best))
            if x is None:
                continue
            found = {i: k for i, cols in enumerate(program.y_cols) for k, col in enumerate(cols) if x[col] > 0.5}
            found = effective_choice(model, options, found)
            if _cost(model, found) < _cost(model, best) * (1 - 1e-12) and fits_choice(model, options, found, limit):
                best, improved = found, True
    return best


def _cost(model: RematModel, chosen: Mapping[int, int]) -> float:
    return sum(model.cand_cost[i] for i in chosen)

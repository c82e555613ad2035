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

Measured on RL1000 (998 candidates, 3,582 options; 2-core EPYC, load about 2, 2026-11-28):
a window of 30 and the incumbent's 20 recomputes (0.9) builds in 0.5-1.3 s (0.1-0.2 M
nonzeros) and HiGHS solves it to optimality in 0.1-1.1 s.  From the cut search's 0.718% the
windows centred on the recomputes reach 0.705% in 18 s (drop four recomputes, add one: a move
``cutsearch`` does not make), the sliding windows alone in 31 s; windows of 60 reach the same
0.705% in 36 s, and one of 100 builds in 7 s.  From the search's 0.710% after four minutes
(not what the minute reaches) the windows find nothing in 60 s.  At 0.8: 3.111% -> 3.104%
in the 21 s ``solver: auto`` gives it, 3.090% in 44 s of sliding windows.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from mpplan.milp.worker import MilpWorker
from mpplan.passes.remat.cutexact import warm_point
from mpplan.passes.remat.cutlns import cheaper_fit, effective_choice, windows
from mpplan.passes.remat.cutmilp import CutOption, CutProgram
from mpplan.passes.remat.cuts import CutFit
from mpplan.passes.remat.cutsearch import improve_answer
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.model import RematModel

__all__ = ["SUB_SECONDS", "WINDOW", "lns_local", "neighbourhood_program", "search_local", "window_order"]

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
    pass over the windows finds nothing or ``deadline`` (``time.perf_counter()``) passes (a
    sub-MILP killed past its limit, ``mpplan.milp.worker``, finds nothing)."""
    best = effective_choice(model, options, start)
    backend = available_backend()
    dyn = limit - model.static_bytes
    improved = True
    with MilpWorker() as worker:
        while improved and backend is not None:  # a pass over the windows, from the first again after each gain
            improved = False
            for free in window_order(model, best, window):
                left = deadline - time.perf_counter()
                if left <= 0:
                    return best
                program = neighbourhood_program(model, options, {*free, *best}, dyn)
                left = deadline - time.perf_counter()
                if program.too_large or left <= 0:
                    continue
                _, x, _, _ = solve_arrays(program, backend, min(sub_seconds, left), warm_point(program, best), worker)
                found = None if x is None else cheaper_fit(model, options, program, x, best, limit)
                if found is not None:
                    best, improved = found, True
                    break
    return best


def window_order(model: RematModel, chosen: Mapping[int, int], window: int) -> list[range]:
    """The windows of one pass: first one centred on each recompute of ``chosen``, most
    expensive first (a recompute is most often traded for its neighbours, whose tensors are
    live across the same steps), then ``cutlns.windows``' sliding ones not already listed.

    >>> from types import SimpleNamespace
    >>> model = SimpleNamespace(num_candidates=10, cand_cost=[1.0] * 8 + [5.0, 1.0])
    >>> window_order(model, {1: 0, 8: 0}, 4)
    [range(6, 10), range(0, 4), range(2, 6), range(4, 8)]
    """
    n = model.num_candidates
    firsts = (max(0, min(i - window // 2, n - window)) for i in sorted(chosen, key=lambda c: (-model.cand_cost[c], c)))
    return list(dict.fromkeys([*(range(f, min(n, f + window)) for f in firsts), *windows(n, window)]))


def search_local(model: RematModel, names: Sequence[str], from_ops: Mapping[str, str], limit: int,
                 deadline: float) -> CutFit | None:
    """``lns_local`` from a one-round answer (``names`` recomputed, cut at ``from_ops`` or the
    rule's split) as a ``CutFit`` of ``model`` when it is cheaper; ``None`` when it is not, or
    the answer or the graph lies outside the cut options (``cutsearch.search_cuts``' contract)."""
    return improve_answer(model, names, from_ops, limit, deadline, lns_local)

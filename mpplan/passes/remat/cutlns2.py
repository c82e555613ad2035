"""Large-neighbourhood search on the double-drop MILP (``mpplan.passes.remat.cutmilp2``).

``cutmulti``'s search adds one double drop at a time and re-runs the one-round cut search
for the rest; ``cutmilp2``'s program decides every double drop and cut together but is
too large for HiGHS to improve on RL250 at 0.8 in minutes.  Between the two, as ``cutlns``
does for the one-drop MILP: the program is built once, every candidate outside a
*neighbourhood* (a window of consecutive candidates, plus every candidate the incumbent
recomputes) is fixed not recomputed and substituted out (``restrict.Restriction``), and
HiGHS chooses the rest exactly under a short time limit.  Windows slide by half their width
and are tried those holding the most recomputes first (where memory is tight), re-ranked as
the incumbent changes, a window the pass has mostly freed already last.  ``BATCH`` windows
are solved from one incumbent before the cheapest answer among them becomes the next (best
improvement: on RL250 at 0.8 the first window's gain is a trap the next ones stay in); the
passes repeat while one improves, until the deadline.  ``search_lns`` builds the whole
program (past ``MAX_NONZEROS``: RL250 at 0.8 needs 2.2 million, 11 CPU s) where ``eligible``
says it builds in seconds; ``solver: auto`` builds it in a thread while its first fit runs
(``programbuild.ProgramBuild``).

Measured on RL250 at 0.8 (2-core EPYC, load 2-2.4), in ``solver: auto``'s last
``phases.LNS_SHARE``, from the first fit's 6.02%: 5.02% (the LNS starting at 21-25 s, 5.02% at
38-41 s); first improvement, with the build in the LNS's share, reached 5.49-5.85%.

An answer is kept only when ``apply_recompute`` of its names on the original graph fits
the budget by ``sim`` and costs less than the incumbent, so the answer is never worse than
the start.  The start must lie in the program's family (``choice_of``): one round of cuts
and double drops whose neighbours are not recomputed; ``None`` otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from mpplan.graph import Graph
from mpplan.milp.worker import MilpWorker
from mpplan.passes.remat.cutexact import option_of, warm_point
from mpplan.passes.remat.cutlns import windows
from mpplan.passes.remat.cutmilp2 import DoubleProgram, double_names, neighbours
from mpplan.passes.remat.cutmulti import added_cost, parse_answer
from mpplan.passes.remat.cuts import CutFit
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.model import RematModel, build_model
from mpplan.passes.remat.programbuild import ProgramBuild
from mpplan.passes.remat.restrict import Restriction

__all__ = ["BATCH", "MAX_SPAN", "SECONDS_PER_SPAN", "SUB_SECONDS", "WINDOW", "build_seconds", "choice_of", "eligible",
           "lns_doubles", "search_lns"]

#: Candidates (consecutive in op order) a neighbourhood frees besides the chosen ones.
WINDOW = 30

#: Sub-MILPs solved from one incumbent before the cheapest answer among them becomes the next
#: one (best improvement over a few windows, not the first): on RL250 at 0.8 the first
#: window's gain (6.02% -> 5.74%) is a trap the next windows' optima stay in (5.49%), while the
#: third window from the start alone reaches 5.02%.
BATCH = 3

#: The time limit of one sub-MILP, in seconds: most sub-MILPs of RL250 at 0.8 stop at it
#: (their own optimum is 5-11 s away), and 8 s found more in 38 s than 3 s or 5 s did; with
#: ``restrict`` a sub-MILP that closes does in 4-8 s (from the first fit's answer).
SUB_SECONDS = 8.0

#: The most storage-steps (``eligible``) of a graph whose program ``search_lns`` builds:
#: RL250's 11,069 make 2.2 million nonzeros in 11 CPU s on a 2-core EPYC (15 before
#: ``cutmilp``'s and ``sparse``'s caches); RL1000's 186,181 would take past the minute to build.
MAX_SPAN = 15_000


#: Seconds of build per storage-step (``build_seconds``): RL250's 11,069 in 11 CPU s.
SECONDS_PER_SPAN = 1e-3


def eligible(model: RematModel) -> bool:
    """Whether ``model``'s double-drop program is small enough to build in seconds: the
    steps its stored tensors are live, summed, at most ``MAX_SPAN`` (the program's memory
    rows hold a term per such step and version)."""
    return _span(model) <= MAX_SPAN


def build_seconds(model: RematModel) -> float:
    """About how long ``model``'s double-drop program takes to build on a 2-core EPYC, from
    its storage-steps: ``remat`` starts the build only when it can end before the LNS's share."""
    return _span(model) * SECONDS_PER_SPAN


def _span(model: RematModel) -> int:
    return sum(model.last[j] - model.start[j] + 1 for j, size in enumerate(model.size) if size)


def search_lns(graph: Graph, names: Sequence[str], from_ops: Mapping[str, str], limit: int,
               deadline: float, build: ProgramBuild | None = None) -> CutFit | None:
    """``lns_doubles`` from the answer ``names`` cut at ``from_ops`` (``joint_names``' form;
    it must fit ``limit`` bytes) on ``graph``'s whole double-drop program, past
    ``formulation.MAX_NONZEROS`` when ``eligible`` (``build``'s when given: a
    ``ProgramBuild`` of ``graph``'s model at ``limit``); ``None`` when the graph is not, the
    program is not built by ``deadline`` (the build is then cancelled), the answer is outside
    the program's family, or nothing cheaper is found by ``deadline``."""
    model = build_model(graph) if build is None else build.model
    assert build is None or build.limit == limit, "a build at another limit"
    if not eligible(model):
        return None
    program = (build or ProgramBuild(model, limit)).result(deadline)
    start = None if program is None else choice_of(program, names, from_ops)
    if program is None or start is None:
        return None
    return lns_doubles(graph, program, start, limit, deadline)


def choice_of(program: DoubleProgram, names: Sequence[str], from_ops: Mapping[str, str]) -> dict[int, int] | None:
    """``double_names``' inverse: candidate -> option index of ``program`` for an answer of
    ``joint_names``' form (``names`` cut at ``from_ops``), or ``None`` when it is not one of
    the program's answers (a double drop with a recomputed neighbour, a cut it lacks)."""
    model = program.model
    graph = model.graph
    parsed = parse_answer(graph, names, from_ops)
    if parsed is None:
        return None
    chosen = option_of(model, parsed.names, parsed.from_ops)
    if chosen is None:
        return None
    index = {graph.ops[k].name: i for i, k in enumerate(model.cand_op)}
    op = graph.topology.op_index
    for drop in parsed.drops:
        i = index.get(drop.op, -1)
        if i < 0 or i in chosen:
            return None
        b1, b2 = op[drop.first], op[drop.second]
        match = [k for k, d in enumerate(program.doubles[i]) if (d.b1, d.b2) == (b1, b2)]
        if not match:
            return None
        chosen[i] = program.singles[i] + match[0]
    doubled = [i for i, k in chosen.items() if k >= program.singles[i]]
    if any(c in chosen for i in doubled for c in neighbours(model, i)):
        return None
    return chosen


def lns_doubles(graph: Graph, program: DoubleProgram, start: Mapping[int, int], limit: int, deadline: float,
                *, window: int = WINDOW, sub_seconds: float = SUB_SECONDS, batch: int = BATCH) -> CutFit | None:
    """A cheaper answer than ``start`` (candidate -> option of ``program``, built on
    ``graph``'s model; it must fit ``limit`` bytes) from sub-MILPs over ``windows`` until a
    pass finds nothing or ``deadline`` (``time.perf_counter()``) passes; ``None`` when none
    is found (module docstring)."""
    backend = available_backend()
    model = program.model
    best = dict(start)
    best_cost = _measured(graph, program, best, limit)
    if backend is None or best_cost is None:
        return None
    start_cost = best_cost
    restriction = Restriction(program)
    with MilpWorker() as worker:  # a sub-MILP killed past its limit (mpplan.milp.worker) finds nothing
        improved = True
        while improved:
            improved = False
            todo, tried = windows(len(program.options), window), set[int]()
            base, solves = best, 0
            while todo:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                todo.sort(key=lambda w: (_mostly_tried(w, tried), -sum(i in base for i in w)))  # re-ranked after gains
                free = todo.pop(0)
                tried.update(free)
                solves += 1
                found = _sub_answer(restriction, base, set(free) | set(base), backend, deadline, sub_seconds,
                                     worker)
                cost = None if found is None else _measured(graph, program, found, limit)
                if found is not None and cost is not None and cost < best_cost * (1 - 1e-12):
                    best, best_cost, improved = found, cost, True
                if solves % batch == 0:
                    base = best  # the next batch starts from the best answer yet
            if time.perf_counter() >= deadline:
                break
    if best_cost >= start_cost:
        return None
    names, from_ops = double_names(model, program, best)
    return CutFit(names, from_ops, best_cost)


def _sub_answer(restriction: Restriction, base: dict[int, int], free: set[int], backend: str, deadline: float,
                sub_seconds: float, worker: MilpWorker) -> dict[int, int] | None:
    """The sub-MILP's answer (candidate -> option) freeing ``free`` around ``base``, within
    ``sub_seconds`` and the time to ``deadline`` left once it is built, or ``None`` when it
    has none (or nothing to decide, or no time is left)."""
    program = restriction.program
    sub = restriction.sub_milp(base, free)
    if sub is None or not sub.cost:
        return None
    warm = restriction.restrict(sub, warm_point(program, base))
    left = deadline - time.perf_counter()  # the build takes time too
    if left <= 0:
        return None
    _, solved, _, _ = solve_arrays(sub, backend, min(sub_seconds, left), warm, worker)
    if solved is None:
        return None
    x = restriction.expand(sub, solved)
    return {i: k for i, cols in enumerate(program.y_cols) for k, col in enumerate(cols) if x[col] > 0.5}


def _mostly_tried(free: range, tried: set[int]) -> bool:
    """Whether a pass has already freed most of ``free``'s candidates: such a window (the
    last one overlaps the one before by more than half) waits for the others."""
    return 2 * sum(i in tried for i in free) > len(free)


def _measured(graph: Graph, program: DoubleProgram, chosen: Mapping[int, int], limit: int) -> float | None:
    """The added cost of ``chosen``'s rewrite of ``graph`` (what ``remat`` measures), or
    ``None`` when it does not fit ``limit`` by ``sim``."""
    return added_cost(graph, *double_names(program.model, program, dict(chosen)), limit)

"""The ``budget`` policy's search within its time limit: a first fit (``budget.fit_budget``),
then, on graphs without a backward pass, cheaper answers in phases that share the limit:
cut points (``cuts``), a second round (``rounds``), and with ``solver="auto"`` a local search
on the cuts (``cutsearch``) and an LNS on the cut MILP (``cutwindow``), or on graphs whose
double-drop MILP builds in seconds an LNS on that MILP (``cutlns2``), built in a thread from
the first fit on (``programbuild``).  Each phase's answer is measured by ``sim`` on the rewrite
and kept only when it fits and costs less."""

from __future__ import annotations

import time

from mpplan.passes.remat.budget import BudgetInfeasibleError, fit_budget
from mpplan.passes.remat.cutlns2 import build_seconds, eligible, search_lns
from mpplan.passes.remat.cuts import fit_cuts, fit_least_cuts
from mpplan.passes.remat.cutsearch import search_cuts
from mpplan.passes.remat.cutwindow import search_local
from mpplan.passes.remat.model import RematModel
from mpplan.passes.remat.programbuild import ProgramBuild
from mpplan.passes.remat.result import RematInfeasibleError, RematResult, measured, result_of
from mpplan.passes.remat.rewriting import repeated_op
from mpplan.passes.remat.rounds import fit_least_rounds, fit_rounds

__all__ = ["LNS_SHARE", "LOCAL_SHARE", "REFUSAL_SHARE", "SEARCH_SHARE", "fit_in_phases"]

#: The policy every result here records.
POLICY = "budget"

#: With ``solver="auto"``, the share of ``time_limit_s`` kept for the local search on cut
#: points (``cutsearch``): the second-round phase, which takes all the time it is given,
#: ends before it, so the search runs even then (RL1000 at 0.9 ended at 0.82% without it).
#: The cut phase is given no more than the time to the second-round phase's end (half the
#: time to the limit, at most that): else, once it used its half, the rounds had no time at
#: all and the search started late (docs/benchmarks.md).  Its first fit's greedy pass still
#: runs to its end, so a cut phase given less than that pass overruns its share.
SEARCH_SHARE = 0.25

#: With ``solver="auto"``, the share of ``time_limit_s`` kept after the search for the LNS
#: whose sub-MILPs are built for their neighbourhood (``cutwindow``): the search ends before
#: it, the second-round phase before both.  It took the place of the double-drop search
#: (``cutmulti``), which found nothing cheaper on either RL1000 cell in its 15 s; in its 21 s
#: this LNS took RL1000 0.9 from the search's 0.718% to 0.705% and 0.8 from 3.111% to 3.104%
#: (2026-11-28, load 2.1).  The search's share stays 0.25 (the rounds, which never run on
#: RL1000, end at 0.4 of the limit): with 0.15 a busy run left it 10 s and 0.9 ended at 0.717%.
LOCAL_SHARE = 0.35

#: With ``solver="auto"`` on a graph whose double-drop program builds in seconds
#: (``cutlns2.eligible``), the share of ``time_limit_s`` kept at the end for the LNS on that
#: program (``cutlns2``), in place of the searches' shares: the cut phase ends before it.
LNS_SHARE = 0.65

#: The share of ``time_limit_s`` kept, once the first fit finds no fit of the budget, for the
#: least peaks of two rounds and of cut points (``_least_several``): the first fit may prove
#: its least peak until the rest of the limit is left.
REFUSAL_SHARE = 0.25


def fit_in_phases(model: RematModel, limit: int, baseline: int, clock: float, solver: str, time_limit_s: float,
                  rounds: bool) -> RematResult:
    """The least added cost found that fits ``limit`` bytes, or ``RematInfeasibleError`` with
    the least peak found.

    ``rounds`` (on a graph without a backward pass) lets a tensor be recomputed more than
    once: one round at the rule's cuts (``budget.fit_budget``) gets a third of the time, or
    up to all but ``REFUSAL_SHARE`` of it when its MILP finds no fit and the MILP minimising
    the peak runs; then cut points it chooses (``cuts``) and a second round (``rounds``)
    compete in the time left (each only when that covers the fits it makes, timed as the
    first).  With ``solver="auto"`` the cuts and then the rounds stop short of the last
    ``SEARCH_SHARE`` + ``LOCAL_SHARE`` of the limit, where a local search on cuts
    (``cutsearch``) and then an LNS on the cut MILP (``cutwindow``) use whatever they left; on
    a graph whose double-drop MILP builds in seconds (``cutlns2.eligible``), the cuts stop short
    of the last ``LNS_SHARE`` instead, where the LNS on that MILP (``cutlns2``) replaces both
    searches, its MILP built in a thread from the first fit on (``programbuild.ProgramBuild``)
    when ``cutlns2.build_seconds`` says the build ends before that share.  When one round at
    the rule's cuts cannot fit, the least peaks of two rounds and of cut points
    (``_least_several``) step in, in the last ``REFUSAL_SHARE`` at least."""
    several = rounds and not model.training  # recompute a tensor more than once: cuts, then rounds
    # The LNS on the double-drop program, built meanwhile: only when the build can end before the LNS's share (a
    # build still running holds the GIL beside the fits; on RL250 at 0.8 a 3 s limit took 10 s with it, 5 s without)
    lns = (several and solver == "auto" and eligible(model)
           and build_seconds(model) <= (1 - LNS_SHARE) * time_limit_s)
    build = ProgramBuild(model, limit) if lns else None
    try:
        try:
            fit = fit_budget(model, limit, solver, time_limit_s / 3 if several else time_limit_s, clock,
                             refuse_by=clock + time_limit_s * (1 - REFUSAL_SHARE) if several else None)
            result = measured(model, POLICY, fit.chosen, baseline, clock, budget_bytes=limit, solver=fit.solver,
                              optimal=fit.optimal, bound=fit.bound, gap=fit.gap, note=fit.note)
            label = fit.solver
        except BudgetInfeasibleError as exc:
            left = max(time_limit_s * REFUSAL_SHARE, time_limit_s - (time.perf_counter() - clock))
            least = _least_several(model, limit, baseline, clock, solver, left) if several else None
            if least is None:
                best = measured(model, POLICY, exc.chosen, baseline, clock, budget_bytes=limit, solver="least-peak",
                                note="the budget is infeasible: the least peak found")
                raise RematInfeasibleError(str(exc), exc.missing_bytes, best) from None
            result, label = least, solver
        took = time.perf_counter() - clock  # a fit's first greedy pass runs to its end: a phase needs its fits' time
        search = several and solver == "auto"  # then, in their shares and the time left, local searches on cuts
        ends = ({"rounds": 1 - LNS_SHARE} if lns
                else {"rounds": 1 - SEARCH_SHARE - LOCAL_SHARE, "search": 1 - LOCAL_SHARE})
        kinds = ("cuts", "rounds", "lns") if lns else ("cuts", "rounds", "search", "local")[:4 if search else 2]
        for kind in kinds if several else ():  # cheaper answers
            end = clock + time_limit_s * ends.get(kind, 1)
            left = end - time.perf_counter()
            if left < took * {"cuts": 1, "rounds": 2}.get(kind, 0) or not result.added_cost:  # rounds fit twice
                continue
            beat = result.added_cost
            if kind in ("cuts", "rounds"):
                cap = clock + time_limit_s * ends.get("rounds", 1) - time.perf_counter()  # cuts: to the rounds' end
                found = (fit_cuts(model, limit, solver, min(left / 2, cap), beat=beat) if kind == "cuts"
                         else fit_rounds(model, limit, solver, left, beat=beat))
            else:  # the local searches start from the answer's recomputes, named by the ops they repeat
                once = [repeated_op(op) for op in result.recompute_ops]
                if kind in ("search", "local"):
                    search_kind = search_cuts if kind == "search" else search_local
                    found = search_kind(model, once, result.from_ops, limit, end)
                else:
                    found = search_lns(model.graph, once, result.from_ops, limit, end, build)
            if found is None:
                continue
            multi = result_of(model.graph, found.names, POLICY, baseline, clock, from_ops=found.from_ops,
                              budget_bytes=limit, solver=f"{label}+{kind}",
                              note=f"{kind}; the answer before costs {beat:g}")
            if multi.peak_bytes <= limit and multi.added_cost < result.added_cost:
                result = multi
        return result
    finally:  # a build the LNS did not consume (remat raised, or skipped it) stops: it holds the GIL
        if build is not None:
            build.cancel()


def _least_several(model: RematModel, limit: int, baseline: int, clock: float, solver: str,
                   time_limit_s: float) -> RematResult | None:
    """A fit of ``limit`` by two rounds or by cut points, each aimed at targets that do not
    depend on ``limit`` (so a budget is refused only under their least peaks), or ``None``."""
    for kind in ("rounds", "cuts"):
        more = fit_least_rounds(model, limit, time_limit_s) if kind == "rounds" else fit_least_cuts(model, limit)
        if more is None:
            continue
        multi = result_of(model.graph, more.names, POLICY, baseline, clock, from_ops=more.from_ops,
                          budget_bytes=limit, solver=f"{solver}+{kind}",
                          note=f"{kind}: one round at the rule's cuts does not fit")
        if multi.peak_bytes <= limit:
            return multi
    return None

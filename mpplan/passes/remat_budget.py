"""remat's ``budget`` policy: fit a byte budget with the least added op cost.

The heuristic is a greedy over *moves* (``mpplan.passes.remat_moves``): a candidate
alone, or with its chain of producers.  Rank the moves by the bytes they free at the
steps over budget per unit of cost, simulate the best few exactly, add the one that
removes the most excess per unit cost, repeat until the graph fits, then drop every
recompute the fit does not need, dearest first.  It runs from nothing (over chains,
and over single candidates) and from each of the few moves that alone free the most
bytes, keeps the cheapest fit, and improves it by local search (drop one of the
dearest recomputes, ban it, refill greedily, while that gets cheaper).

The greedy works on a ``Choice`` (``mpplan.passes.remat_incremental``): a trial
re-simulates only the steps a move touches and a ranking walks again only the chains
the last moves made stale, so a step costs about what the move touches rather than
the whole graph.

The exact solver is a MILP (``mpplan.passes.remat_ilp``) over the same memory model,
warm-started with the heuristic's answer, under a time limit; it reports its best
bound and gap.  ``solver="auto"`` is exact on graphs of up to ``EXACT_MAX_OPS`` ops
when a MILP backend (``highspy``, else scipy's HiGHS) is installed, and the heuristic
otherwise (with a logged note when the backend is missing).  A budget under the
smallest peak any choice of recomputes reaches raises ``InfeasibleError`` naming that
smallest feasible budget in bytes (proved minimal by the MILP when one is installed).

Example: eight layers whose activations (LOAD 18436 bytes) must fit in 12000 bytes.

>>> from mpplan.capture import synthetic
>>> from mpplan.passes.remat_model import build_model
>>> model = build_model(synthetic.chain(8, train=True, batch=64, width=8))
>>> fit = fit_budget(model, model.static_bytes + 12_000, "heuristic", 10.0, time.perf_counter())
>>> fit.solver, [model.candidate_names()[i] for i in fit.chosen]
('heuristic', ['layers.0', 'layers.1', 'layers.2', 'layers.4'])
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from mpplan.errors import ConfigError, InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat_incremental import Choice, ModelIndex
from mpplan.passes.remat_model import RematModel, build_model
from mpplan.passes.remat_moves import CHAIN_LEVELS

__all__ = ["EXACT_MAX_OPS", "SOLVERS", "BudgetFit", "fit_budget", "min_feasible_budget"]

_log = logging.getLogger(__name__)

SOLVERS = ("auto", "heuristic", "exact")

#: ``solver="auto"`` uses the MILP on graphs of up to this many ops.
EXACT_MAX_OPS = 1000

#: The greedy simulates its best-ranked moves this many at a time, and at most
#: ``GREEDY_MAX_TRIES`` per step.
GREEDY_TRIES = 8
GREEDY_MAX_TRIES = 64

#: The heuristic's extra greedy starts (module docstring).
HEURISTIC_SEEDS = 4

#: The heuristic's local search: rounds, and recomputes tried per round.
IMPROVE_ROUNDS = 8
IMPROVE_TRIES = 6


@dataclass(frozen=True, slots=True)
class BudgetFit:
    """What the budget search decided: the candidates to recompute (``chosen``) and how
    sure it is.

    ``solver`` names what decided (``heuristic``, ``highs`` or ``scipy-highs``);
    ``optimal`` whether the added cost is proved least; ``bound`` a
    proved lower bound on it and ``gap`` = (cost - bound) / cost (``None`` when
    nothing bounds it); ``note`` why a solver was not used or stopped early.
    """

    chosen: tuple[int, ...]
    solver: str
    optimal: bool = False
    bound: float | None = None
    gap: float | None = None
    note: str = ""


def fit_budget(model: RematModel, limit: int, solver: str, time_limit_s: float, clock: float) -> BudgetFit:
    """The least added cost with ``peak <= limit`` bytes, ``limit`` under the peak without
    recomputation, found by ``clock + time_limit_s`` (``clock``: a ``time.perf_counter``
    reading); ``InfeasibleError`` when no choice of recomputes fits."""
    backend, note = _backend(solver, model)
    deadline = clock + time_limit_s
    lower = model.lower_bound()
    if limit < lower:
        _raise_infeasible(model, limit, backend, deadline, lower)
    dyn = limit - model.static_bytes
    # The heuristic may use a third of the time when a MILP follows, all of it otherwise.
    share = time_limit_s / 3 if backend is not None else time_limit_s
    greedy = _heuristic(model, dyn, clock + share)
    if backend is None:
        if greedy.load > dyn:
            _raise_infeasible(model, limit, None, deadline, lower, best=greedy)
        return BudgetFit(greedy.chosen, "heuristic", note=note)
    from mpplan.passes import remat_ilp

    solution = remat_ilp.solve(
        model,
        dyn,
        time_limit_s=_remaining(deadline),
        warm_start=greedy.chosen if greedy.load <= dyn else None,
        backend=backend,
    )
    if solution.status == "infeasible":
        _raise_infeasible(model, limit, backend, deadline, lower, best=greedy)
    found = [greedy]
    if solution.chosen is not None:  # re-scored exactly: the MILP works to a tolerance
        found.append(_prune(Choice.build(model, solution.chosen, index=greedy.index), dyn))
    fits = [choice for choice in found if choice.load <= dyn]
    if not fits:
        _raise_infeasible(model, limit, backend, deadline, lower, best=greedy)
    best = min(fits, key=lambda choice: (choice.cost, choice.load, choice.chosen))
    optimal = solution.status == "optimal" and found[-1].load <= dyn and solution.chosen is not None
    bound = best.cost if optimal else solution.bound
    if solution.status == "too_large":
        return BudgetFit(best.chosen, "heuristic", note=solution.note)
    gap = None if bound is None else (0.0 if best.cost <= 0 else max(0.0, (best.cost - bound) / best.cost))
    return BudgetFit(best.chosen, solution.backend, optimal=optimal, bound=bound, gap=gap, note=solution.note)


def min_feasible_budget(
    graph: Graph, *, solver: str = "auto", time_limit_s: float = 60.0, model: RematModel | None = None
) -> tuple[int, bool]:
    """The smallest peak (bytes) any choice of recomputes gives, and whether it is proved.

    Exact (the MILP minimising the peak) when a backend is installed and ``solver``
    allows it; otherwise the greedy's least peak, an upper bound (proved only when it
    meets ``RematModel.lower_bound``).
    """
    if solver not in SOLVERS:
        raise ConfigError(f"remat solver: expected one of {', '.join(SOLVERS)}, got {solver!r}")
    model = build_model(graph) if model is None else model
    return _min_peak(model, _backend(solver, model)[0], time.perf_counter() + time_limit_s, model.lower_bound())


def _remaining(deadline: float) -> float:
    """Seconds left before ``deadline``; at least one, so a solver always gets a look."""
    return max(1.0, deadline - time.perf_counter())


def _backend(solver: str, model: RematModel) -> tuple[str | None, str]:
    """The MILP backend to use (``None``: the heuristic decides) and a note saying why not."""
    if solver == "heuristic":
        return None, ""
    from mpplan.passes import remat_ilp

    backend = remat_ilp.available_backend()
    if backend is None:
        note = "no MILP backend installed (pip install highspy): used the heuristic"
        _log.warning("remat: %s", note)
        return None, note
    if solver == "auto" and model.num_ops > EXACT_MAX_OPS:
        return None, f"{model.num_ops} ops > {EXACT_MAX_OPS}: used the heuristic"
    return backend, ""


def _greedy(
    choice: Choice,
    dyn_budget: int,
    *,
    prune: bool = True,
    banned: frozenset[int] = frozenset(),
    levels: int = CHAIN_LEVELS,
) -> Choice:
    """The greedy (module docstring) from ``choice``, which it changes and returns.

    Each step simulates the ranked moves in batches of ``GREEDY_TRIES`` until a batch
    holds one that lowers the excess over the budget (at most ``GREEDY_MAX_TRIES`` per
    step), never choosing ``banned``; moves grow at most ``levels`` levels (1: single
    candidates).  If the budget cannot be met, the choice with the least LOAD met
    (then the least cost) is returned.
    """
    best = (choice.load, choice.cost, dict(choice.anchor))
    while choice.load > dyn_budget:
        excess = choice.excess(dyn_budget)
        ranked = choice.ranked(dyn_budget, levels=levels, banned=banned, limit=GREEDY_MAX_TRIES)
        pick, pick_score = None, None
        for first in range(0, len(ranked), GREEDY_TRIES):
            for move in ranked[first : first + GREEDY_TRIES]:
                trial = choice.trial(dyn_budget, add=move)
                gain = excess - trial.excess
                if gain <= 0:
                    continue
                score = (gain / max(trial.cost - choice.cost, 1e-9), -trial.load)
                if pick_score is None or score > pick_score:
                    pick, pick_score = trial, score
            if pick is not None:
                break
        if pick is None:
            break
        choice.commit(pick)
        if (choice.load, choice.cost) < best[:2]:
            best = (choice.load, choice.cost, dict(choice.anchor))
    if choice.load > dyn_budget:
        choice.restore(best[2], dyn_budget)
        return choice
    return _prune(choice, dyn_budget) if prune else choice


def _heuristic(model: RematModel, dyn_budget: int, deadline: float = math.inf) -> Choice:
    """The cheapest fit of several greedy starts, improved by local search.

    Starts: nothing recomputed, greedy over chains and then over single candidates
    (chains reach lower peaks; where single recomputes suffice they tend to fit for
    less), and each of the ``HEURISTIC_SEEDS`` moves that alone free the most excess
    bytes (whatever their cost): the ratio-greedy alone takes cheap recomputes first
    and can then need a dear one where one mid-priced recompute plus a few cheap
    ones would fit.  If no start fits, the peak is lowered step by step
    (``_least_peak``), from the lowest start and from nothing, until it does.
    Past ``deadline`` only the first start runs to the end; the others and the
    local search are skipped.
    """
    empty = Choice.build(model)
    excess = empty.excess(dyn_budget)
    seeds = []
    for move in empty.ranked(dyn_budget, levels=CHAIN_LEVELS, per_cost=False, limit=2 * HEURISTIC_SEEDS):
        trial = empty.trial(dyn_budget, add=move)
        seeds.append((trial.excess - excess, move, trial))
    starts = [(empty.copy(), CHAIN_LEVELS), (empty.copy(), 1)]
    for _, _, trial in sorted(seeds, key=lambda seed: seed[:2])[:HEURISTIC_SEEDS]:
        start = empty.copy()
        start.commit(trial)
        starts.append((start, CHAIN_LEVELS))
    runs: list[Choice] = []
    for start, levels in starts:
        if runs and time.perf_counter() > deadline:
            break
        runs.append(_greedy(start, dyn_budget, levels=levels))
    fits = [choice for choice in runs if choice.load <= dyn_budget]
    if not fits:
        lowest = min(runs, key=lambda choice: (choice.load, choice.cost))
        descents = (_least_peak(start, stop_at=dyn_budget) for start in (lowest, empty))
        lowered = min(descents, key=lambda choice: (choice.load, choice.cost))
        if lowered.load > dyn_budget:
            return lowered
        fits = [_prune(lowered, dyn_budget)]
    best = min(fits, key=lambda choice: (choice.cost, choice.load, choice.chosen))
    return _improve(best, dyn_budget, deadline)


def _improve(choice: Choice, dyn_budget: int, deadline: float = math.inf) -> Choice:
    """Local search on a fit: drop one of the ``IMPROVE_TRIES`` dearest recomputes, ban
    it, refill greedily; keep the first cheaper fit and repeat (``IMPROVE_ROUNDS`` at most).

    The greedy alone can take one dear recompute where several cheap ones together
    fit (none of them alone lowers the excess); this finds many of those.
    """
    if choice.load > dyn_budget:
        return choice
    cost = choice.model.cand_cost
    for _ in range(IMPROVE_ROUNDS):
        better = None
        for i in sorted(choice.anchor, key=lambda i: (-cost[i], i))[:IMPROVE_TRIES]:
            if time.perf_counter() > deadline:
                return choice
            start = choice.copy()
            start.commit(start.trial(dyn_budget, remove=(i,)))
            trial = _greedy(start, dyn_budget, banned=frozenset({i}))
            if trial.load <= dyn_budget and trial.cost < choice.cost - 1e-9 * max(1.0, choice.cost):
                better = trial
                break
        if better is None:
            break
        choice = better
    return choice


def _least_peak(choice: Choice, *, stop_at: int = -1) -> Choice:
    """The greedy pushed down one peak at a time from ``choice`` (which it changes and
    returns): the least LOAD it reaches, or the first at or under ``stop_at``."""
    while choice.load > stop_at:
        before = (choice.load, dict(choice.anchor))
        _greedy(choice, choice.load - 1, prune=False)
        if choice.load >= before[0]:
            choice.restore(before[1], before[0])
            break
    return choice


def _prune(choice: Choice, dyn_budget: int) -> Choice:
    """Drop the recomputes a fit does not need, dearest first (changes ``choice``)."""
    if choice.load > dyn_budget:
        return choice
    cost = choice.model.cand_cost
    for i in sorted(choice.anchor, key=lambda i: (-cost[i], -i)):
        if i not in choice.anchor:
            continue
        trial = choice.trial(dyn_budget, remove=(i,))
        if trial.load <= dyn_budget:
            choice.commit(trial)
    return choice


def _min_peak(
    model: RematModel, backend: str | None, deadline: float, lower: int, best: Choice | None = None
) -> tuple[int, bool]:
    """The least peak found (bytes) and whether it is proved least.

    The greedy lowers the peak from ``best`` (or nothing) one byte at a time, and
    also from its run aimed straight at ``lower``: pushed one byte at a time it can
    take recomputes that lower the excess but leave the peak where it is, and stall.
    """
    index = ModelIndex.of(model) if best is None else best.index
    empty = Choice.build(model, index=index)
    start = empty.copy() if best is None else best.copy()
    aimed = _greedy(empty, lower - model.static_bytes, prune=False)
    found = min(_least_peak(start), _least_peak(aimed), key=lambda choice: (choice.load, choice.cost))
    if best is not None and best.load < found.load:
        found = best
    peak = found.peak
    if backend is not None and peak > lower:
        from mpplan.passes import remat_ilp

        solution = remat_ilp.solve(model, None, time_limit_s=_remaining(deadline), warm_start=found.chosen,
                                   backend=backend)
        if solution.chosen is not None:
            peak = min(peak, Choice.build(model, solution.chosen, index=index).peak)
        if solution.status == "optimal":
            return peak, True
    return peak, peak <= lower


def _raise_infeasible(
    model: RematModel, limit: int, backend: str | None, deadline: float, lower: int, best: Choice | None = None
) -> None:
    found, proved = _min_peak(model, backend, deadline, lower, best)
    what = "the smallest feasible budget is" if proved else "the smallest budget found feasible is"
    raise InfeasibleError(
        f"graph {model.graph.name!r}: remat budget {limit} bytes is infeasible: {what} {found} bytes "
        f"(static {model.static_bytes} bytes; no choice of recomputes goes under {lower} bytes); "
        "raise the budget or the device capacity",
        missing_bytes=max(0, found - limit),
    )

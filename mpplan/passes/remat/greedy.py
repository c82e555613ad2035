"""The budget heuristic: a greedy over moves, several starts, pruning and local search.

The greedy works on a ``Choice`` (``mpplan.passes.remat.choice``) over *moves*
(``mpplan.passes.remat.moves``): a candidate alone, or with its chain of producers.
Rank the moves by the bytes they free at the steps over budget per unit of cost,
simulate the best few exactly, add the one that removes the most excess per unit
cost, repeat until the graph fits, then drop every recompute the fit does not need,
dearest first.  ``heuristic`` runs it from nothing (over chains, and over single
candidates) and from each of the few moves that alone free the most bytes, keeps the
cheapest fit, and improves it by local search (drop one of the dearest recomputes,
ban it, refill greedily, while that gets cheaper).
"""

from __future__ import annotations

import math
import time

from mpplan.passes.remat.chains import CHAIN_LEVELS
from mpplan.passes.remat.choice import Choice
from mpplan.passes.remat.model import RematModel

__all__ = ["drop_unneeded", "greedy", "heuristic", "improve", "least_peak"]

#: The greedy simulates its best-ranked moves this many at a time, and at most
#: ``GREEDY_MAX_TRIES`` per step.
GREEDY_TRIES = 8
GREEDY_MAX_TRIES = 64

#: The heuristic's extra greedy starts (module docstring).
HEURISTIC_SEEDS = 4

#: The heuristic's local search: rounds, and recomputes tried per round.
IMPROVE_ROUNDS = 8
IMPROVE_TRIES = 6


def greedy(
    choice: Choice,
    dyn_budget: int,
    *,
    prune: bool = True,
    banned: frozenset[int] = frozenset(),
    levels: int = CHAIN_LEVELS,
    least_load: bool = True,
) -> Choice:
    """The greedy (module docstring) from ``choice``, which it changes and returns.

    Each step simulates the ranked moves in batches of ``GREEDY_TRIES`` until a batch
    holds one that lowers the excess over the budget (at most ``GREEDY_MAX_TRIES`` per
    step), never choosing ``banned``; moves grow at most ``levels`` levels (1: single
    candidates).  If the budget cannot be met, the choice with the least LOAD met
    (then the least cost) is returned, or with ``least_load=False`` the last one (the
    least excess over the budget: a start for a second round of recomputes).
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
        if least_load:
            choice.restore(best[2], dyn_budget)
        return choice
    return drop_unneeded(choice, dyn_budget) if prune else choice


def heuristic(model: RematModel, dyn_budget: int, deadline: float = math.inf) -> Choice:
    """The cheapest fit of several greedy starts, improved by local search.

    Starts: nothing recomputed, greedy over chains and then over single candidates
    (chains reach lower peaks; where single recomputes suffice they tend to fit for
    less), and each of the ``HEURISTIC_SEEDS`` moves that alone free the most excess
    bytes (whatever their cost): the ratio-greedy alone takes cheap recomputes first
    and can then need a dear one where one mid-priced recompute plus a few cheap
    ones would fit.  If no start fits, the peak is lowered step by step
    (``least_peak``), from the lowest start and from nothing, until it does.
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
        runs.append(greedy(start, dyn_budget, levels=levels))
    fits = [choice for choice in runs if choice.load <= dyn_budget]
    if not fits:
        lowest = min(runs, key=lambda choice: (choice.load, choice.cost))
        descents = (least_peak(start, stop_at=dyn_budget) for start in (lowest, empty))
        lowered = min(descents, key=lambda choice: (choice.load, choice.cost))
        if lowered.load > dyn_budget:
            return lowered
        fits = [drop_unneeded(lowered, dyn_budget)]
    best = min(fits, key=lambda choice: (choice.cost, choice.load, choice.chosen))
    return improve(best, dyn_budget, deadline)


def improve(choice: Choice, dyn_budget: int, deadline: float = math.inf) -> Choice:
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
            trial = greedy(start, dyn_budget, banned=frozenset({i}))
            if trial.load <= dyn_budget and trial.cost < choice.cost - 1e-9 * max(1.0, choice.cost):
                better = trial
                break
        if better is None:
            break
        choice = better
    return choice


def least_peak(choice: Choice, *, stop_at: int = -1) -> Choice:
    """The greedy pushed down one peak at a time from ``choice`` (which it changes and
    returns): the least LOAD it reaches, or the first at or under ``stop_at``."""
    while choice.load > stop_at:
        before = (choice.load, dict(choice.anchor))
        greedy(choice, choice.load - 1, prune=False)
        if choice.load >= before[0]:
            choice.restore(before[1], before[0])
            break
    return choice


def drop_unneeded(choice: Choice, dyn_budget: int) -> Choice:
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

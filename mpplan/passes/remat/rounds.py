"""Several recomputes per tensor: a second round of recomputes on the rewritten graph.

The one-round model recomputes a tensor once, before its first late use, and keeps
the recompute until its last use: one retention interval after the early one.
Moccasin keeps a tensor over several intervals, Checkmate recomputes it any number
of times.  A recompute op is a real op of the rewritten graph, so the same model
applied again, with only the recompute ops of the first round as candidates
(``build_model(..., only=...)``), splits a recompute's own uses at their largest gap
and recomputes it again there (``F@recompute@recompute``): a third interval, and
so on for later rounds.  ``apply_recompute`` rebuilds exactly this from the names.

``fit_rounds`` searches two-round answers where one round fits: round one aims at the
budget or a looser one (it recomputes less); round two reaches the real budget by
recomputing recomputes.  It returns the cheapest found when it beats the one-round
cost.  Where one round cannot fit, ``fit_least_rounds`` decides: its two-round answers
are aimed at targets that do not depend on the budget (``LADDER``), so a budget is
refused only under the least of their peaks and a larger budget is never refused where
a smaller one fits.  Only graphs without a backward pass have candidates in round two:
in a training graph recomputes run in the backward pass, where nothing is recomputed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mpplan.errors import InfeasibleError
from mpplan.passes.remat.budget import fit_budget, least_peak_choice
from mpplan.passes.remat.choice import Choice
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.greedy import drop_unneeded, greedy
from mpplan.passes.remat.model import RematModel, build_model
from mpplan.passes.remat.rewriting import rewrite

__all__ = ["LADDER", "LOOSER", "RoundsFit", "fit_least_rounds", "fit_rounds"]

#: Round one aims this far from the budget towards the no-remat peak (fractions of the gap).
LOOSER = (0.5, 0.25, 0.75)

#: Where one round cannot fit, round one aims this far from the one-round model's lower
#: bound towards its least peak found (fractions of the gap): targets of the graph alone.
LADDER = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True, slots=True)
class RoundsFit:
    """A two-round answer: ``names`` of the ops recomputed (round one's, then round
    two's recompute ops), its added ``cost`` and the ``looser`` budget round one aimed at."""

    names: tuple[str, ...]
    cost: float
    looser: int

    @property
    def from_ops(self) -> dict[str, str]:
        """No cut points: each round cuts at the rule's (``RematRecord.from_op`` absent)."""
        return {}


def fit_least_rounds(model: RematModel, limit: int, time_limit_s: float) -> RoundsFit | None:
    """The cheapest two-round fit of ``limit`` bytes among the ``LADDER``'s, or ``None``
    when none fits (one round cannot fit ``limit``).

    For each target of the ladder, round one is the greedy's least-excess choice aimed at
    it, round two the least peak found on its rewrite; the answers depend on the graph
    alone, so whether ``limit`` fits is monotone in it (while the ladder finishes within
    ``time_limit_s``; past it, the rest of the ladder is skipped).  A fit keeps only the
    round-two recomputes ``limit`` needs.
    """
    deadline = time.perf_counter() + time_limit_s
    lower, top = model.lower_bound(), least_peak_choice(model).peak
    best: RoundsFit | None = None
    for w in LADDER:
        if w and time.perf_counter() > deadline:
            break
        target = lower + int(w * (top - lower))
        first = greedy(Choice.build(model), target - model.static_bytes, least_load=False)
        ev = evaluate(model, first.chosen)
        graph, added, cost = rewrite(model, ev)
        second = build_model(graph, only=frozenset(added))
        least = least_peak_choice(second)
        if least.peak > limit:
            continue
        kept = drop_unneeded(least, limit - second.static_bytes)
        names = tuple(model.graph.ops[model.cand_op[i]].name for i in ev.chosen)
        names += tuple(second.graph.ops[second.cand_op[i]].name for i in kept.chosen)
        if best is None or cost + kept.cost < best.cost:
            best = RoundsFit(names, cost + kept.cost, target)
    return best


def fit_rounds(model: RematModel, limit: int, solver: str, time_limit_s: float, *, beat: float) -> RoundsFit | None:
    """The cheapest two-round fit of ``limit`` bytes found within ``time_limit_s`` that
    costs less than ``beat``, or ``None`` (``limit`` fits in one round)."""
    deadline = time.perf_counter() + time_limit_s
    baseline = model.static_bytes + evaluate(model, ()).load
    best: RoundsFit | None = None
    for share in LOOSER:
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        looser = limit + int((baseline - limit) * share)
        if looser >= baseline:
            continue
        try:
            chosen = fit_budget(model, looser, solver, left / 3, time.perf_counter()).chosen
        except InfeasibleError:
            continue
        ev = evaluate(model, chosen)
        graph, added, cost = rewrite(model, ev)
        bound = beat if best is None else min(beat, best.cost)
        if cost >= bound:
            continue
        names = tuple(model.graph.ops[model.cand_op[i]].name for i in ev.chosen)
        second = build_model(graph, only=frozenset(added))
        if second.static_bytes + evaluate(second, ()).load > limit:
            if not second.num_candidates:
                continue
            try:
                fit = fit_budget(second, limit, solver, max(0.5, (deadline - time.perf_counter()) / 2),
                                 time.perf_counter())
            except InfeasibleError:
                continue
            ev2 = evaluate(second, fit.chosen)
            cost += ev2.cost
            names += tuple(second.graph.ops[second.cand_op[i]].name for i in ev2.chosen)
        if cost < bound:
            best = RoundsFit(names, cost, looser)
    return best

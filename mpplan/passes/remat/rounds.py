"""Several recomputes per tensor: a second round of recomputes on the rewritten graph.

The one-round model recomputes a tensor once, before its first late use, and keeps
the recompute until its last use: one retention interval after the early one.
Moccasin keeps a tensor over several intervals, Checkmate recomputes it any number
of times.  A recompute op is a real op of the rewritten graph, so the same model
applied again, with only the recompute ops of the first round as candidates
(``build_model(..., only=...)``), splits a recompute's own uses at their largest gap
and recomputes it again there (``F@recompute@recompute``): a third interval, and
so on for later rounds.  ``apply_recompute`` rebuilds exactly this from the names.

``fit_rounds`` searches two-round answers: round one aims at the budget or a looser
one (it recomputes less), or, where one round cannot fit, takes the greedy's
least-excess choice; round two reaches the real budget by recomputing recomputes.  It
returns the cheapest found when it beats the one-round cost.  Only graphs without a
backward pass have candidates in round two: in a training graph recomputes run in
the backward pass, where nothing is recomputed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mpplan.errors import InfeasibleError
from mpplan.passes.remat.budget import fit_budget
from mpplan.passes.remat.choice import Choice
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.greedy import greedy
from mpplan.passes.remat.model import RematModel, build_model
from mpplan.passes.remat.rewriting import rewrite

__all__ = ["LOOSER", "RoundsFit", "fit_rounds"]

#: Round one aims this far from the budget towards the no-remat peak (fractions of the gap).
LOOSER = (0.5, 0.25, 0.75)


@dataclass(frozen=True, slots=True)
class RoundsFit:
    """A two-round answer: ``names`` of the ops recomputed (round one's, then round
    two's recompute ops), its added ``cost`` and the ``looser`` budget round one met."""

    names: tuple[str, ...]
    cost: float
    looser: int


def fit_rounds(model: RematModel, limit: int, solver: str, time_limit_s: float, *, beat: float) -> RoundsFit | None:
    """The cheapest two-round fit of ``limit`` bytes found within ``time_limit_s`` that
    costs less than ``beat``, or ``None``."""
    deadline = time.perf_counter() + time_limit_s
    baseline = model.static_bytes + evaluate(model, ()).load
    best: RoundsFit | None = None
    for share in (0.0, *LOOSER):
        left = deadline - time.perf_counter()
        if left <= 0:
            break
        looser = limit + int((baseline - limit) * share)
        if looser >= baseline:
            continue
        try:
            chosen = fit_budget(model, looser, solver, left / 3, time.perf_counter()).chosen
        except InfeasibleError:
            if share:
                continue
            # One round cannot fit: its least-excess choice is a start that round two may finish.
            chosen = greedy(Choice.build(model), limit - model.static_bytes, least_load=False).chosen
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

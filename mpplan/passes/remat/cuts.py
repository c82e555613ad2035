"""Cut points: where each recomputed tensor's late region starts, chosen for the budget.

The model's rule cuts a tensor of a graph without a backward pass at its longest idle
gap (``mpplan.passes.remat.model``).  The longest gap need not be where memory is
short: a tensor read across a long, light stretch and then across a short one that holds
the peak is freed where it does not help.  ``gap_cuts`` cuts each candidate's outputs
instead after the idle gap whose steps carry the most *weight*, and the budget search
then runs unchanged on the model with those cuts (``build_model(..., cuts=...)``); the
plan records each cut as its record's ``from_op``.

The weight of a step is what the no-remat order holds there over a *floor*
(``step_weights``).  ``fit_cuts`` aims at the least cost with floors just under the
budget (``BUDGET_FLOORS``: only steps near or over it matter to a fit; a floor a little
under it also frees the steps the recomputes themselves push up).  ``fit_least_cuts``
uses floors of the graph alone (``GRAPH_FLOORS``, fractions of the no-remat LOAD): the
least peaks of the models they give do not depend on the budget, so a budget refused
only under all of them keeps the budget monotone.

Later rounds (``mpplan.passes.remat.rounds``) cut a recompute again at its own longest
gap; a cut per round is what ``apply_recompute``'s ``from_ops`` allows, but no solver
chooses it yet.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mpplan.errors import InfeasibleError
from mpplan.passes.remat.budget import fit_budget, least_peak_choice
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.greedy import drop_unneeded
from mpplan.passes.remat.model import MIN_GAP, RematModel, build_model, storage_users

__all__ = ["BUDGET_FLOORS", "GRAPH_FLOORS", "CutFit", "fit_cuts", "fit_least_cuts", "gap_cuts", "step_weights"]

#: ``fit_cuts``: floors as fractions of the budget's dynamic bytes.
BUDGET_FLOORS = (0.9, 1.0, 0.8)

#: ``fit_least_cuts``: floors as fractions of the no-remat LOAD.
GRAPH_FLOORS = (0.0, 0.6, 0.7, 0.8)


@dataclass(frozen=True, slots=True)
class CutFit:
    """A fit on a model with chosen cuts: the ``names`` of the ops recomputed, ``from_ops``
    (recomputed tensor -> the op its late region starts at, for ``RematRecord.from_op``)
    and the added ``cost``."""

    names: tuple[str, ...]
    from_ops: dict[str, str]
    cost: float


def step_weights(model: RematModel, floor: int) -> list[int]:
    """Per op position: the live dynamic bytes of the no-remat order there over ``floor``."""
    ev = evaluate(model, ())
    return [max(0, ev.profile[s] - floor) for s in ev.orig_step]


def gap_cuts(model: RematModel, weight: Sequence[int]) -> dict[int, int]:
    """Tensor id -> cut position for each candidate output: the use after the idle gap
    (at least ``MIN_GAP`` steps) whose steps carry the most ``weight``, where that is not
    the rule's own cut and some gap carries weight; ties go to the later gap.

    >>> from mpplan.graph import Graph, Op, Tensor
    >>> ops = [Op("A", "f", (), ("a",)), Op("B", "f", ("a",), ("b",)), Op("P", "f", (), ("p",)),
    ...        Op("Q", "f", ("p",), ("q",)), Op("C", "f", ("a", "q"), ("c",)), Op("R", "f", (), ("r",)),
    ...        Op("S", "f", ("r",), ("s",)), Op("D", "f", ("a", "c", "s"), ("d",))]
    >>> model = build_model(Graph("g", tuple(Tensor(t, 4) for t in "abpqcrsd"), tuple(ops), ("d",)))
    >>> model.split[0], gap_cuts(model, [0] * 8), gap_cuts(model, [0, 0, 0, 0, 0, 1, 0, 0])
    (4, {}, {0: 7})
    """
    uses = storage_users(model.graph)
    prefix = [0, *itertools.accumulate(weight)]
    cuts: dict[int, int] = {}
    for outputs in model.cand_outputs:
        for j in outputs:
            s = model.storage_tensor[j]
            best, cut = 0, -1
            for a, b in itertools.pairwise(uses[s]):
                carried = prefix[b] - prefix[a + 1]
                if b - a >= MIN_GAP and carried > 0 and carried >= best:
                    best, cut = carried, b
            if cut >= 0 and cut != model.split[j]:
                cuts[s] = cut
    return cuts


def fit_cuts(model: RematModel, limit: int, solver: str, time_limit_s: float, *, beat: float) -> CutFit | None:
    """The cheapest fit of ``limit`` bytes on the models cut at ``BUDGET_FLOORS``, found
    within ``time_limit_s``, when it costs less than ``beat``; else ``None``."""
    deadline = time.perf_counter() + time_limit_s
    dyn = limit - model.static_bytes
    best: CutFit | None = None
    took = 0.0  # the last fit's seconds: a fit's first greedy pass runs to its end, whatever the limit
    for i, level in enumerate(BUDGET_FLOORS):
        start = time.perf_counter()
        left = deadline - start
        if left <= took:
            break
        cuts = gap_cuts(model, step_weights(model, int(level * dyn)))
        if not cuts:
            continue
        cut_model = build_model(model.graph, cuts=cuts)
        try:
            chosen = fit_budget(cut_model, limit, solver, left / (len(BUDGET_FLOORS) - i), start).chosen
        except InfeasibleError:
            continue
        finally:
            took = time.perf_counter() - start
        found = _cut_fit(cut_model, chosen, cuts)
        if found.cost < (beat if best is None else min(beat, best.cost)):
            best = found
    return best


def fit_least_cuts(model: RematModel, limit: int) -> CutFit | None:
    """The cheapest fit of ``limit`` bytes among the least-peak choices of the models cut
    at ``GRAPH_FLOORS`` (recomputes ``limit`` does not need dropped), or ``None`` when
    ``limit`` is under all their least peaks (which do not depend on ``limit``)."""
    load = evaluate(model, ()).load
    best: CutFit | None = None
    for level in GRAPH_FLOORS:
        cuts = gap_cuts(model, step_weights(model, int(level * load)))
        if not cuts:
            continue
        cut_model = build_model(model.graph, cuts=cuts)
        least = least_peak_choice(cut_model)
        if least.peak > limit:
            continue
        found = _cut_fit(cut_model, drop_unneeded(least, limit - cut_model.static_bytes).chosen, cuts)
        if best is None or found.cost < best.cost:
            best = found
    return best


def _cut_fit(model: RematModel, chosen: Sequence[int], cuts: dict[int, int]) -> CutFit:
    ev = evaluate(model, chosen)
    graph = model.graph
    names = tuple(graph.ops[model.cand_op[i]].name for i in ev.chosen)
    from_ops = {
        graph.tensors[model.storage_tensor[j]].name: graph.ops[cuts[model.storage_tensor[j]]].name
        for i in ev.chosen
        for j in model.cand_outputs[i]
        if model.storage_tensor[j] in cuts
    }
    return CutFit(names, from_ops, ev.cost)

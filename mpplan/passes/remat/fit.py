"""Fit a budget on the device: order first, then recomputes, judged by the planned peak.

``remat(..., "budget")`` bounds ``static + LOAD`` of one fixed order.  What a user
means by "budget: 10 GiB" is what the device holds: the arena of the planned order at
the configured alignment, plus the static bytes.  ``fit_planned`` closes that gap
with the planner in the loop (``plan_graph``: a graph in, its plan, planned peak and
executed op order out):

1. Plan the graph as it is.  If the planner's own order fits, recompute nothing.
2. Otherwise decide recomputes on the graph *in the planner's order* (and, when that
   differs, in the given order too), plan the rewritten graph (the scheduler may move
   ops around the recomputes; the given order's rewrites are planned in the given
   order when the caller can, so the own order's fit is never worse than the fixed
   order's: the two searches are the same, each with its own time), and while the planned peak is over the budget, aim
   the recomputes lower and retry (halfway back when that aim is refused).  The aim
   is a LOAD target: the planned peak exceeds ``static + LOAD`` by the arena's
   fragmentation, a ratio that stays near its last value and grows as recomputes
   crowd the arena (``next_target``).  So the first aim divides the budget by the
   ratio the graph planned at without recomputes (over ``static + LOAD`` of the
   planner's order), and each retry by the ratio its last rewrite planned at, plus
   half of what that ratio grew (all of it overshot on the random layered graphs:
   refused aims, or recomputes the budget did not need).
3. Keep the fit with the least added cost.  When nothing fits, raise
   ``RematInfeasibleError`` carrying the plan with the least peak found.

The graph the plan runs is always ``apply_recompute(graph, ops)`` of the chosen ops,
the rewrite the verifier and the executor rebuild; a decision taken in another order
is planned in that order only when it rewrites to the same graph.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from mpplan import sim
from mpplan.graph import Graph
from mpplan.errors import ConfigError
from mpplan.passes.remat.api import remat, resolve_budget
from mpplan.passes.remat.result import RematInfeasibleError, RematResult, records_of, result_of
from mpplan.passes.remat.rewriting import recomputable

__all__ = ["Fitted", "PlanGraph", "fit_planned", "in_order", "next_target"]

P = TypeVar("P")

#: Plans a graph: its plan, planned peak and executed op order.
PlanGraph = Callable[[Graph], tuple[P, int, Sequence[str]]]

#: Rounds of "aim lower by the overshoot" per decision order.
MAX_ROUNDS = 5


@dataclasses.dataclass(frozen=True, slots=True)
class Fitted(Generic[P]):
    """A remat decision and its plan: ``result`` the rewrite, ``plan`` what
    ``plan_graph`` returned for it, ``peak`` its planned peak, ``fits`` whether that is
    within the budget, ``order`` which order decided the recomputes (``none``: nothing
    recomputed, ``planner`` or ``as_given``)."""

    result: RematResult
    plan: P
    peak: int
    fits: bool
    order: str


def in_order(graph: Graph, names: Sequence[str]) -> Graph:
    """``graph`` with its ops in the order of ``names`` (a topological order of its ops;
    names of other ops, such as copies, are skipped)."""
    by_name = {op.name: op for op in graph.ops}
    ops = tuple(by_name[name] for name in dict.fromkeys(names) if name in by_name)
    if len(ops) != len(graph.ops):
        raise ValueError(f"in_order: expected an order of all {len(graph.ops)} ops, got {len(ops)}")
    if ops == graph.ops:
        return graph
    return Graph(graph.name, graph.tensors, ops, graph.outputs)


def fit_planned(
    graph: Graph,
    budget: float | str,
    plan_graph: PlanGraph[P],
    *,
    plan_given: PlanGraph[P] | None = None,
    solver: str = "auto",
    time_limit_s: float = 60.0,
) -> Fitted[P]:
    """The cheapest recomputes whose *planned* peak fits ``budget`` (module docstring).

    ``budget`` is bytes, a size string, or a fraction of ``static + LOAD`` of the given
    order (as for ``remat``).  ``plan_given``, when the planner's scheduler is not the
    given order, plans a graph in its own op order: the given order's recomputes are then
    planned in that order, so the fit is never worse than the fixed order's.  Each order
    searches for ``time_limit_s`` of its own.  Raises ``RematInfeasibleError`` (``best``:
    the rewrite with the least planned peak; ``plan``: its ``Fitted``) when nothing fits.
    """
    clock = time.perf_counter()
    baseline = sim.given_peak(graph)
    limit = resolve_budget(budget, baseline)
    plan0, peak0, order0 = plan_graph(graph)
    unchanged = result_of(graph, (), "budget", baseline, clock, budget_bytes=limit, solver="none", optimal=True)
    note = dataclasses.replace(unchanged, note="the planner's order fits without recomputation")
    tried: list[Fitted[P]] = [Fitted(note, plan0, peak0, peak0 <= limit, "none")]
    if tried[0].fits:
        return tried[0]
    present = {op.name for op in graph.ops}
    ordered = in_order(graph, [name for name in order0 if name in present])
    # (label, the order recomputes are decided in, how its rewrites are planned, its unchanged planned peak)
    searches: list[tuple[str, Graph, PlanGraph[P], int]] = [("planner", ordered, plan_graph, peak0)]
    if plan_given is not None:
        given, given_peak, _ = plan_given(graph)
        tried.append(Fitted(note, given, given_peak, given_peak <= limit, "none"))
        searches.append(("as_given", graph, plan_given, given_peak))
    elif ordered is not graph:
        searches.append(("as_given", graph, plan_graph, peak0))
    messages: list[str] = []
    for label, decide_in, planner, start_peak in searches:
        if tried[-1].fits:  # the given order fits as it is
            break
        tried += _aimed(graph, decide_in, planner, limit, baseline, clock, solver, time_limit_s,
                        max(1.0, start_peak / sim.given_peak(decide_in)), label, messages)
    fits = [f for f in tried if f.fits]
    if fits:
        return min(fits, key=lambda f: (f.result.added_cost, f.peak))
    best = min(tried, key=lambda f: (f.peak, f.result.added_cost))
    why = f"; the recompute search said: {messages[0]}" if messages else ""
    raise RematInfeasibleError(
        f"graph {graph.name!r}: remat budget {limit} bytes is infeasible: the least planned peak found is "
        f"{best.peak} bytes, {best.peak - limit} bytes over it{why}",
        best.peak - limit,
        best.result,
        plan=best,
    )


def _aimed(graph: Graph, ordered: Graph, plan_graph: PlanGraph[P], limit: int, baseline: int, clock: float,
           solver: str, time_limit_s: float, first_ratio: float, label: str, messages: list[str]) -> list[Fitted[P]]:
    """The rewrites of step 2 (module docstring) decided in ``ordered``, each planned by
    ``plan_graph``, until one fits, ``MAX_ROUNDS`` pass or ``time_limit_s`` runs out;
    ``first_ratio``: the unchanged graph's planned peak over its ``static + LOAD`` in
    ``ordered``.  The search's refusals are appended to ``messages``."""
    deadline = time.perf_counter() + time_limit_s
    # The LOAD target; targets planned over, and refused; planned peak / LOAD of the last rewrites.
    target, over, under = min(limit, max(1, int(limit / first_ratio))), limit + 1, 0
    ratios = [first_ratio]
    tried: list[Fitted[P]] = []
    for _ in range(MAX_ROUNDS):
        share = max(1.0, (deadline - time.perf_counter()) / 2)
        try:
            decided = remat(ordered, "budget", budget=target, solver=solver, time_limit_s=share)
        except RematInfeasibleError as exc:
            decided, under = exc.best, target
            messages.append(str(exc))
        fitted = _planned(graph, ordered, decided, plan_graph, baseline, limit, clock, label)
        tried.append(fitted)
        if fitted.fits or time.perf_counter() > deadline:
            break
        if under < target:  # planned over the budget: aim lower, by the ratio it planned at
            over = target
            ratios.append(fitted.peak / max(1, decided.peak_bytes))
            target = max(under + 1, min(target - 1, next_target(limit, decided.peak_bytes, ratios)))
        else:  # refused: aim between the refusal and the last target planned over
            target = (under + over) // 2
        if not under < target < over or target <= 0:
            break
    return tried


def next_target(limit: int, load: int, ratios: Sequence[float]) -> int:
    """The LOAD to aim at after a rewrite of ``load`` bytes planned over ``limit``:
    ``limit`` over the planned-peak-to-LOAD ratio expected next, the last of ``ratios``
    plus half its growth since the one before (the arena fragments more as recomputes
    are added), and under ``load``.

    >>> next_target(1000, 990, [1.0, 1.03])  # planned at 1019.7: aim at 1000 / 1.045
    956
    """
    ratio = ratios[-1] + max(0.0, ratios[-1] - ratios[-2]) / 2 if len(ratios) > 1 else ratios[-1]
    return min(int(limit / ratio), load - 1)


def _planned(
    graph: Graph,
    ordered: Graph,
    decided: RematResult,
    plan_graph: PlanGraph[P],
    baseline: int,
    limit: int,
    clock: float,
    label: str,
) -> Fitted[P]:
    """Plan the rewrite of ``graph`` by the ops ``decided`` recomputes (decided on
    ``ordered``), in ``decided``'s order when it rewrites to the same graph."""
    ops = tuple(dict.fromkeys(record["op"] for record in records_of(decided.graph)))
    fields: dict[str, Any] = dict(budget_bytes=limit, solver=decided.solver, optimal=decided.optimal,
                                  bound=decided.bound, gap=decided.gap, note=decided.note)
    try:
        result = result_of(graph, ops, "budget", baseline, clock, from_ops=decided.from_ops, **fields)
    except ConfigError:  # decided in another order: keep what is recomputable in the given one
        allowed = set(recomputable(graph))
        result = result_of(graph, [op for op in ops if op in allowed], "budget", baseline, clock, **fields)
    rewritten = result.graph
    if ordered is not graph and _same_ops(rewritten, decided.graph):
        rewritten = in_order(rewritten, [op.name for op in decided.graph.ops])
    planned, peak, _ = plan_graph(rewritten)
    result = dataclasses.replace(result, graph=rewritten)
    return Fitted(result, planned, peak, peak <= limit, label)


def _same_ops(a: Graph, b: Graph) -> bool:
    """Whether ``a`` and ``b`` hold the same ops and tensors, whatever their order."""
    return set(a.ops) == set(b.ops) and set(a.tensors) == set(b.tensors) and a.outputs == b.outputs

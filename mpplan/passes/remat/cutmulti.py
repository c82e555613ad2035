"""Several drops per tensor: a tensor freed across two of its idle gaps, recomputed after each.

The cut model (``cutmilp``, ``cutsearch``) recomputes a tensor once: it is freed across
one idle gap and the recompute is kept through its last use.  A recompute op is a real
op, so recomputing it again (``F@recompute@recompute``, with its own cut) frees the
tensor across a second, later gap: ``apply_recompute(graph, [F, F@recompute], {t: R1,
t@recompute: R2})`` drops ``t`` after its use before the reader ``R1`` and again after its
last use before ``R2``, each recompute costing ``F``'s cost.  A ``Drop`` names one such
choice.

``search_multi`` improves a fitting one-round answer with double drops: for a ``Drop``
(first of the ops the answer recomputes: "add a second drop to a chosen recompute",
"split a drop"; then of the others), it rewrites the graph with that drop (and the drops
kept so far) fixed, and runs the one-round cut search (``cutsearch.improve_cuts``) for
the rest of the answer on that rewrite, where freeing the second gap may make other
recomputes unneeded.  The drops are tried cheapest first by a quick score: the rest
pruned on that rewrite (``_screened``); a screened answer fits as it stands, so it is
kept when the cut search from its drop finds nothing cheaper (or the screening used up the
time).  An answer is kept only when ``apply_recompute`` of its names on the original graph
fits the budget by ``sim`` and costs less; then the moves start again from it, until
``deadline``.  On RL250 at 0.8 this finds 5.64% from the one-recompute search's 5.95%
(docs/benchmarks.md).  ``cutmilp2`` is the exact cut MILP with double-drop options; ``cutlns2`` searches it by
neighbourhoods, in place of this search where its program builds in seconds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from mpplan import sim
from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.passes.remat.cutexact import choice_names, option_of
from mpplan.passes.remat.cutmilp import cut_options
from mpplan.passes.remat.cuts import CutFit
from mpplan.passes.remat.cutsearch import improve_cuts, with_cuts
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.model import MIN_GAP, SUFFIX, build_model, storage_users
from mpplan.passes.remat.rewriting import apply_recompute

__all__ = ["TRIAL_SECONDS", "Answer", "added_cost", "Drop", "drops_of", "joint_names", "parse_answer", "search_multi"]

#: Seconds of cut search per double drop tried (on RL250 the search's gains come in the
#: first second or two; more trials beat longer ones).
TRIAL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Drop:
    """Op ``op``'s output ``tensor`` freed across two idle gaps: recomputed before the
    reader ``first`` and again before the later reader ``second``."""

    op: str
    tensor: str
    first: str
    second: str


def drops_of(graph: Graph, uses: Mapping[int, Sequence[int]], ops: Sequence[str]) -> Iterator[Drop]:
    """Every double drop of the single-output ops named in ``ops``, in that order: each
    pair of the output's idle gaps (at least ``MIN_GAP`` steps between two of its users
    ``uses``, from ``storage_users(graph)``), earlier gaps first."""
    topo = graph.topology
    for name in ops:
        outputs = graph.ops[topo.op_index[name]].outputs
        if len(outputs) != 1:
            continue
        u = uses[topo.storage_of[topo.tensor_index[outputs[0]]]]
        gaps = [b for a, b in itertools.pairwise(u) if b - a >= MIN_GAP]
        for b1, b2 in itertools.combinations(gaps, 2):
            yield Drop(name, outputs[0], graph.ops[b1].name, graph.ops[b2].name)


def joint_names(drops: Sequence[Drop], names: Sequence[str],
                from_ops: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``apply_recompute``'s names and cuts for ``drops`` with one-round recomputes
    ``names`` cut at ``from_ops``: round one holds every op, round two the recomputes
    of the dropped ones."""
    all_names = (*(d.op for d in drops), *names, *(d.op + SUFFIX for d in drops))
    cuts = dict(from_ops)
    for d in drops:
        cuts[d.tensor], cuts[d.tensor + SUFFIX] = d.first, d.second
    return all_names, cuts


def search_multi(graph: Graph, names: Sequence[str], from_ops: Mapping[str, str], limit: int,
                 deadline: float) -> CutFit | None:
    """A cheaper answer than ``names`` (cut at ``from_ops``; it must fit ``limit`` bytes)
    with double drops, found by ``deadline`` (``time.perf_counter()``); ``None`` when none
    is found, when ``names`` are neither one round's recomputes nor of ``joint_names``' form,
    or when the graph is outside the cut model (module docstring).  The library no longer
    calls it (``cutlns2``'s LNS took its place in ``remat``): it is kept as the benchmark's
    baseline (``scripts/bench_remat_moccasin.py --multi``, ``scripts/probe_remat_doubles.py``)."""
    start = parse_answer(graph, names, from_ops)
    if start is None:
        return None
    best = start
    if start.drops:  # the cut search for the rest with the start's drops, before new ones
        again = _trial(graph, start, None, limit, min(deadline, time.perf_counter() + TRIAL_SECONDS))
        best = again if again is not None and again.cost < start.cost else start
    present = {op.name: op.cost for op in graph.ops}
    candidates = build_model(graph).candidate_names()
    uses = storage_users(graph)
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        dropped = {d.op for d in best.drops}
        once = sorted((n for n in best.names if n not in dropped), key=lambda n: -present[n])
        others = sorted((n for n in candidates if n not in dropped and n not in best.names), key=lambda n: -present[n])
        for tier in (once, others):  # "add a second drop" or "split a drop" first, then a new double drop
            for pruned in _screened(graph, uses, best, tier, limit, deadline):
                found = None if time.perf_counter() > deadline else _trial(
                    graph, best, pruned.drops[-1], limit, min(deadline, time.perf_counter() + TRIAL_SECONDS))
                better = found if found is not None and found.cost < pruned.cost else pruned
                if better.cost < best.cost:  # the screened answer fits too: kept when the trial is no cheaper
                    best, improved = better, True
                    break
                if time.perf_counter() > deadline:
                    break
            if improved:
                break
    if best.cost >= start.cost:
        return None
    return CutFit(*joint_names(best.drops, best.names, best.from_ops), best.cost)


@dataclass(frozen=True, slots=True)
class Answer:
    """Double ``drops`` and one-round recomputes ``names`` cut at ``from_ops``; ``cost`` in all."""

    drops: tuple[Drop, ...]
    names: tuple[str, ...]
    from_ops: dict[str, str]
    cost: float


def parse_answer(graph: Graph, names: Sequence[str], from_ops: Mapping[str, str]) -> Answer | None:
    """``names`` (ops of ``graph``, and ``F@recompute`` for an op ``F`` dropped twice, as
    ``joint_names`` makes them) as an answer, or ``None`` when they are not of that form."""
    topo, cost = graph.topology, {op.name: op.cost for op in graph.ops}
    drops = []
    for name in names:
        op = name.removesuffix(SUFFIX)
        if name == op or op not in cost:
            continue
        outputs = graph.ops[topo.op_index[op]].outputs
        if len(outputs) != 1 or outputs[0] not in from_ops or outputs[0] + SUFFIX not in from_ops:
            return None
        t = outputs[0]
        drops.append(Drop(op, t, from_ops[t], from_ops[t + SUFFIX]))
    dropped = {d.op for d in drops} | {d.op + SUFFIX for d in drops}
    rest = tuple(n for n in names if n not in dropped)
    if any(n not in cost for n in rest):
        return None
    twice = {d.tensor for d in drops}
    cuts = {t: o for t, o in from_ops.items() if t not in twice and SUFFIX not in t}
    return Answer(tuple(drops), rest, cuts, sum(cost[n] for n in rest) + sum(2 * cost[d.op] for d in drops))


def _screened(graph: Graph, uses: Mapping[int, Sequence[int]], best: Answer, ops: Sequence[str], limit: int,
              deadline: float) -> list[Answer]:
    """``best`` with each double drop of ``ops`` (``uses``: ``storage_users(graph)``) with which
    the rest of ``best`` still fits, the rest pruned of what the drop makes unneeded: fitting
    answers, cheapest first (a cheap score: the cut search proper runs on their drops in this order)."""
    scored: list[tuple[float, int, Answer]] = []
    for k, drop in enumerate(drops_of(graph, uses, ops)):
        if time.perf_counter() > deadline:
            break
        pruned = _trial(graph, best, drop, limit, 0.0)
        if pruned is not None:
            scored.append((pruned.cost, k, pruned))
    return [pruned for *_, pruned in sorted(scored, key=lambda s: s[:2])]


def _trial(graph: Graph, best: Answer, drop: Drop | None, limit: int, deadline: float) -> Answer | None:
    """``best`` with ``drop`` added (if any): the one-round cut search (until ``deadline``; pruning
    alone when it has passed) for the rest of ``best`` on the graph with the drops fixed,
    rebuilt on ``graph`` and measured; ``None`` when the rest does not fit there to start
    with, lies outside the cut model or the rebuilt answer does not fit."""
    drops = best.drops if drop is None else (*best.drops, drop)
    dropped = {d.op for d in drops}
    try:
        fixed = apply_recompute(graph, *joint_names(drops, (), {}))
    except ConfigError:
        return None  # a gap no late use follows in its round: not a drop the rewrite makes
    model = build_model(fixed)
    options = cut_options(model)
    rest = [n for n in best.names if n not in dropped]
    twice = {d.tensor for d in drops}
    kept = {t: o for t, o in best.from_ops.items() if t not in twice}
    start = None if options is None else option_of(model, rest, kept)
    if options is None or start is None or evaluate(with_cuts(model, options, start), start).peak > limit:
        return None
    found = improve_cuts(model, options, start, limit, deadline)
    names, from_ops = choice_names(model, found)
    if dropped & set(names):
        return None  # a third drop of the same op: not representable by ``joint_names``
    cost = added_cost(graph, *joint_names(drops, names, from_ops), limit)
    return None if cost is None else Answer(drops, names, from_ops, cost)


def added_cost(graph: Graph, names: Sequence[str], from_ops: Mapping[str, str], limit: int) -> float | None:
    """The added cost of ``apply_recompute(graph, names, from_ops)`` (what ``remat`` will measure), or
    ``None`` when that rewrite is refused or does not fit ``limit`` by ``sim``."""
    try:
        rewritten = apply_recompute(graph, names, from_ops)
    except ConfigError:
        return None
    if sim.given_peak(rewritten) > limit:
        return None
    return sum(op.cost for op in rewritten.ops if op.recompute_of is not None) - sum(
        op.cost for op in graph.ops if op.recompute_of is not None)

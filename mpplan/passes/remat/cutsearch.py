"""Local search on cut points: cheaper answers around a fitting one, scored exactly.

The cut MILP (``mpplan.passes.remat.cutmilp``) is exact but slow to build and weak in its
bound; the cut heuristic (``mpplan.passes.remat.cuts``) fixes every cut by a rule before
it chooses.  This search starts from a fitting answer of the same model (candidate ->
option of ``cut_options``: which recomputes, each cut at which gap) and tries, most
expensive first, to *ruin and recreate*: drop one recompute (then two), then
repair the steps over the budget greedily with moves worth less than ``OVERSPEND`` times
what it dropped — re-cut a chosen recompute at another gap (free) or add another
recompute under another cut — and prune what the repair made unneeded.  A move is
scored by ``evaluate`` on the model re-cut for the choice (``with_cuts``), exactly as
``sim`` measures the rewritten graph, and a repair is kept only when it fits and costs
less, so the answer is never worse than the start.  This covers the moves "re-cut a
tensor at another gap", "swap one recompute for another" and "drop one, add two".

To keep each repair step cheap, only the ``TOP_MOVES`` moves whose freed intervals cover
the most over-budget bytes per cost (an estimate) are scored exactly; at a local optimum
the search scores four times more and passes again, until ``deadline``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from mpplan.passes.remat.cutexact import choice_names, option_of
from mpplan.passes.remat.cutmilp import CutOption, cut_options
from mpplan.passes.remat.cuts import CutFit
from mpplan.passes.remat.evaluation import Evaluation, evaluate
from mpplan.passes.remat.model import NEVER, RematModel, storage_index

__all__ = ["OVERSPEND", "TOP_MOVES", "Improve", "choice_cost", "improve_answer", "improve_cuts", "search_cuts",
           "with_cuts"]

#: Per repair step: how many moves (by estimated gain per cost) are scored exactly, at
#: first; four times more each time a pass over every ruin finds nothing.
TOP_MOVES = 16

#: A repair may add recomputes worth this many times the one it dropped: the pruning
#: after it (``_Search.prune``) often takes back more than the excess.
OVERSPEND = 2.0

#: A choice: candidate -> index of its option in ``cut_options``.
Chosen = dict[int, int]

#: A search on cut options: (model, options, fitting start, limit, deadline) -> a choice costing no more.
Improve = Callable[[RematModel, list[list[CutOption]], Mapping[int, int], int, float], Chosen]


def with_cuts(model: RematModel, options: list[list[CutOption]], chosen: Mapping[int, int],
              index: Mapping[int, int] | None = None) -> RematModel:
    """``model`` with each chosen candidate's outputs cut at its option's gaps: what
    ``build_model(graph, cuts=...)`` gives for those cuts on the graphs ``cut_options``
    covers (the candidates stay the same; only their outputs' splits move).  ``index``:
    ``storage_index(model)``, when the caller keeps it."""
    index = storage_index(model) if index is None else index
    split, early, late_first = list(model.split), list(model.early_last), list(model.late_first)
    late_last, first_late = list(model.late_last), list(model.cand_first_late)
    for i, k in chosen.items():
        option = options[i][k]
        for j, e in option.early_last:
            early[j] = e
        for t, cut in option.cuts:
            split[index[t]] = late_first[index[t]] = cut
            if cut == NEVER:  # a chain link: no use is late
                late_last[index[t]] = -1
        first_late[i] = option.first_late
    return dataclasses.replace(model, split=tuple(split), early_last=tuple(early), late_first=tuple(late_first),
                               late_last=tuple(late_last), cand_first_late=tuple(first_late))


def improve_cuts(model: RematModel, options: list[list[CutOption]], start: Mapping[int, int], limit: int,
                 deadline: float) -> Chosen:
    """A choice costing no more than ``start`` (which must fit ``limit`` bytes) that fits,
    found by ruin-and-recreate until no recompute can be replaced or ``deadline``
    (``time.perf_counter()``) passes (module docstring)."""
    search = _Search(model, options, limit - model.static_bytes, deadline)
    effective = search.score(dict(start))[0].chosen  # what no late use needs is no recompute
    best = search.prune({i: start[i] for i in effective})
    failed: set[tuple[int, ...]] = set()  # ruins not retried after an improvement elsewhere
    top = TOP_MOVES
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for ruined in _ruins(model, best):
            if time.perf_counter() > deadline:
                break
            if ruined in failed:
                continue
            trial = {c: k for c, k in best.items() if c not in ruined}
            found = search.repair(trial, OVERSPEND * choice_cost(model, ruined), ruined, top)
            if found is not None and choice_cost(model, found) < choice_cost(model, best):
                best, improved = found, True
                break
            failed.add(ruined)
        if not improved and top < sum(map(len, options)):  # a local optimum: score more moves per step
            top *= 4
            failed.clear()
            improved = True
    return best


def _ruins(model: RematModel, chosen: Mapping[int, int]) -> Iterator[tuple[int, ...]]:
    """The recomputes to drop: one, then two at a time, most expensive first."""
    order = sorted(chosen, key=lambda c: (-model.cand_cost[c], c))
    for size in (1, 2):
        yield from sorted(itertools.combinations(order, size), key=lambda p: -choice_cost(model, p))


def choice_cost(model: RematModel, candidates: Iterable[int]) -> float:
    """The added cost of recomputing ``candidates`` (a choice's keys): the one sum every
    comparison of choices uses (here, ``cutlns`` and ``cutwindow``)."""
    return sum(model.cand_cost[i] for i in candidates)


class _Search:
    """The scoring shared by one search's repairs: the model, options and freed intervals
    (set once, never changed)."""

    def __init__(self, model: RematModel, options: list[list[CutOption]], dyn: int, deadline: float) -> None:
        self.model, self.options, self.dyn, self.deadline = model, options, dyn, deadline
        self.index = storage_index(model)
        #: per candidate and option: (last early use, first late use, bytes) of each output.
        self.freed = [
            [tuple((e, dict(o.cuts).get(model.storage_tensor[j], model.late_first[j]), model.size[j])
                   for j, e in o.early_last) for o in opts]
            for opts in options
        ]

    def score(self, chosen: Chosen) -> tuple[Evaluation, int]:
        """The evaluation of ``chosen`` and its excess: bytes over the budget summed over steps."""
        ev = evaluate(with_cuts(self.model, self.options, chosen, self.index), chosen)
        return ev, sum(v - self.dyn for v in ev.profile if v > self.dyn)

    def repair(self, chosen: Chosen, allowance: float, ruined: tuple[int, ...], top: int) -> Chosen | None:
        """``chosen`` made to fit by moves costing less than ``allowance`` in all, none of
        them adding back a ``ruined`` recompute, then pruned; or ``None``.  Each step scores
        the ``top`` most promising moves and takes the cheapest that fits, else the one that
        removes most excess per cost."""
        ev, excess = self.score(chosen)
        spent = 0.0
        while excess > 0:
            if time.perf_counter() > self.deadline:
                return None
            over = self._over(ev)
            moves = self._moves(chosen, over, allowance - spent, ruined)[:top]
            best: tuple[float, Chosen, Evaluation, int, float] | None = None
            for i, k in moves:
                trial = {**chosen, i: k}
                tev, texcess = self.score(trial)
                if texcess >= excess:
                    continue
                paid = 0.0 if i in chosen else self.model.cand_cost[i]
                rate = math.inf if texcess == 0 else (excess - texcess) / (paid + 1e-9)
                if best is None or (rate, -paid) > (best[0], -best[4]):
                    best = (rate, trial, tev, texcess, paid)
            if best is None:
                return None
            _, chosen, ev, excess, paid = best
            spent += paid
        return self.prune({i: chosen[i] for i in ev.chosen})

    def prune(self, chosen: Chosen) -> Chosen:
        """``chosen`` (which fits) less every recompute it fits without, most expensive first,
        and less any that the drops left no late use for: the choice its scoring makes, so
        the cost compared is the cost paid."""
        for i in sorted(chosen, key=lambda c: (-self.model.cand_cost[c], c)):
            trial = {c: k for c, k in chosen.items() if c != i}
            if self.score(trial)[1] == 0:
                chosen = trial
        return {i: chosen[i] for i in self.score(chosen)[0].chosen}

    def _over(self, ev: Evaluation) -> dict[float, int]:
        """Position -> bytes over the budget: op ``p`` at ``p``, a recompute run before op
        ``p`` at ``p - 0.5``."""
        at = {s: float(p) for p, s in enumerate(ev.orig_step)}
        over: dict[float, int] = {}
        nxt = len(ev.orig_step)
        for s in reversed(range(len(ev.profile))):
            if s in at:
                nxt = int(at[s])
            if ev.profile[s] > self.dyn:
                pos = at.get(s, nxt - 0.5)
                over[pos] = max(over.get(pos, 0), ev.profile[s] - self.dyn)
        return over

    def _moves(self, chosen: Chosen, over: dict[float, int], allowance: float,
               ruined: tuple[int, ...]) -> list[tuple[int, int]]:
        """(Candidate, option) moves, most promising first: re-cuts of chosen
        candidates and additions cheaper than ``allowance`` (not of ``ruined``), by the
        over-budget bytes their freed intervals cover per cost."""
        ranked: list[tuple[float, int, int]] = []
        cost = self.model.cand_cost
        for i, opts in enumerate(self.freed):
            paid = 0.0 if i in chosen else cost[i]
            if paid >= allowance or i in ruined:
                continue
            for k, intervals in enumerate(opts):
                if chosen.get(i) == k:
                    continue
                gain = sum(min(o, sum(size for e, b, size in intervals if e < pos < b)) for pos, o in over.items())
                if gain > 0:
                    ranked.append((gain / (paid + 1e-9), i, k))
        ranked.sort(key=lambda r: -r[0])
        return [(i, k) for _, i, k in ranked]


def search_cuts(model: RematModel, names: Sequence[str], from_ops: Mapping[str, str], limit: int,
                deadline: float) -> CutFit | None:
    """``improve_cuts`` from a one-round answer (``names`` recomputed, cut at ``from_ops``
    or the rule's split) as a ``CutFit`` of ``model`` when it is cheaper; ``None`` when it
    is not, or the answer or the graph lies outside the cut options."""
    return improve_answer(model, names, from_ops, limit, deadline, improve_cuts)


def improve_answer(model: RematModel, names: Sequence[str], from_ops: Mapping[str, str], limit: int,
                   deadline: float, improve: Improve) -> CutFit | None:
    """``improve`` (``improve_cuts`` or another search on cut options with its signature)
    from a one-round answer as ``search_cuts`` describes."""
    options = cut_options(model)
    start = None if options is None else option_of(model, names, from_ops)
    if options is None or start is None:
        return None
    found = improve(model, options, start, limit, deadline)
    cost = choice_cost(model, found)
    if cost >= choice_cost(model, start):
        return None
    found_names, found_from = choice_names(model, found)
    return CutFit(found_names, found_from, cost)

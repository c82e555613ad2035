"""Score a choice of recomputes on a ``RematModel``: where each recompute runs and the
LOAD of the rewritten as-given order, without building the graph."""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mpplan.passes.remat.model import NEVER, RematModel

__all__ = ["Evaluation", "anchors", "evaluate", "reanchor"]


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The recomputes a choice really makes, where they run, and the peak they give.

    ``chosen``: the effective candidates (those some late use needs), ascending;
    ``anchor``: candidate -> the original op its recompute runs before; ``load``:
    LOAD of the rewritten as-given order; ``profile``: live dynamic bytes per step
    of that order, not counting recreated views (they change no step's load);
    ``orig_step``: the step of each original op in it.
    """

    chosen: tuple[int, ...]
    anchor: dict[int, int]
    load: int
    peak: int
    profile: tuple[int, ...]
    orig_step: tuple[int, ...]
    cost: float


def anchors(model: RematModel, chosen: Iterable[int]) -> dict[int, int]:
    """Candidate -> the original op its recompute runs before, for the candidates of
    ``chosen`` that some late use needs (the others are left out).

    A recompute runs before the first late use of its outputs or before the earliest
    chosen recompute that reads them, whichever comes first; consumers come later in
    forward order, so one pass from the last candidate back settles every anchor.
    """
    anchor: dict[int, int] = {}
    first_late, consumers = model.cand_first_late, model.cand_consumers
    for i in sorted(set(chosen), reverse=True):
        a = first_late[i]
        for c in consumers[i]:
            if c in anchor and anchor[c] < a:
                a = anchor[c]
        if a < NEVER:
            anchor[i] = a
    return anchor


def reanchor(
    model: RematModel,
    producers: Sequence[Sequence[int]],
    anchor: dict[int, int],
    add: Iterable[int],
    remove: Iterable[int],
) -> dict[int, int]:
    """The candidates whose anchor changes when ``add`` join and ``remove`` leave the
    choice whose anchors are ``anchor`` (``anchors``' answer), and their new anchor
    (``NEVER``: not run); ``producers[c]``: the candidates whose outputs ``c`` reads.

    ``anchors``' recurrence redone only where an input changed: a candidate's anchor
    depends on its chosen consumers', which come later in forward order, so the
    changed ones are settled last candidate first.
    """
    removed = {c for c in remove if c in anchor}
    added = {c for c in add if c not in anchor}

    def chosen(c: int) -> bool:
        return c in added or (c in anchor and c not in removed)

    moved = dict.fromkeys(removed, NEVER)
    heap = [-c for c in added] + [-p for c in removed for p in producers[c] if chosen(p)]
    heapq.heapify(heap)
    done: set[int] = set()
    while heap:
        c = -heapq.heappop(heap)
        if c in done:
            continue
        done.add(c)
        a = model.cand_first_late[c]
        for x in model.cand_consumers[c]:
            ax = moved.get(x, anchor.get(x, NEVER))
            if ax < a:
                a = ax
        if a != anchor.get(c, NEVER):
            moved[c] = a
            for p in producers[c]:
                if chosen(p) and p not in done:
                    heapq.heappush(heap, -p)
    return moved


def evaluate(model: RematModel, chosen: Iterable[int]) -> Evaluation:
    """Where the recomputes of candidates ``chosen`` run and the LOAD they give.

    A candidate no late use needs (directly or through chosen consumers) is dropped.
    This is the fast twin of ``sim.order_load`` on ``apply_recompute``'s graph (the
    tests hold them equal); the searches score with it, results come from ``sim``.
    """
    anchor = anchors(model, chosen)
    effective = tuple(sorted(anchor))
    n = model.num_ops
    count = [0] * n
    for i in effective:
        count[anchor[i]] += 1
    orig_step = list(map(operator.add, range(n), itertools.accumulate(count)))
    step_of: dict[int, int] = {}
    seen = [0] * n
    for i in effective:  # ascending = forward order within an anchor
        p = anchor[i]
        step_of[i] = orig_step[p] - count[p] + seen[p]
        seen[p] += 1
    steps = n + len(effective)
    delta = [0] * (steps + 1)
    size, start, last, producer = model.size, model.start, model.last, model.producer
    for j, nbytes in enumerate(size):
        if not nbytes:
            continue
        p = producer[j]
        if p >= 0 and p in anchor:
            delta[orig_step[start[j]]] += nbytes
            delta[orig_step[model.early_last[j]] + 1] -= nbytes
            first = step_of[p]
            end = orig_step[model.late_last[j]] if model.late_last[j] >= 0 else first
            for h in model.readers[j]:
                if h in step_of and step_of[h] > end:
                    end = step_of[h]
            delta[first] += nbytes
            delta[max(end, first) + 1] -= nbytes
        else:
            end = orig_step[last[j]]
            for h in model.readers[j]:
                if h in step_of and step_of[h] > end:
                    end = step_of[h]
            delta[orig_step[start[j]]] += nbytes
            delta[end + 1] -= nbytes
    delta.pop()
    profile = list(itertools.accumulate(delta))
    load = max(profile, default=0)
    cost = sum(model.cand_cost[i] for i in effective)
    return Evaluation(effective, anchor, load, model.static_bytes + load, tuple(profile), tuple(orig_step), cost)

"""Exact / improving offset search for ``assign``: branch and bound over canonical packings.

Why this search space is complete.  Fix any total order ``rank`` on the records.
Take a valid placement and re-place its records in increasing (offset, rank)
order, each on its *skyline*: the highest end among already placed records it
conflicts with (0 if none).  By induction no record moves up, so the arena does
not grow; repeating reaches a fixed point that the re-placement reproduces.  So
some optimal packing is built by placing records one at a time on their skylines
with non-decreasing (offset, rank), and the search enumerates exactly such
sequences.  (Dropping records into the lowest *gap*, as greedy heuristics do, is
not complete.)

Pruning, for a target arena ``W`` and current level ``L`` (the last offset):

* each unplaced record lands at or above ``max(skyline, L)``;
* the unplaced records live at one step are stacked above the lowest of their
  floors (and above what is placed there): ``floor(t) + U(t) <= W``, with ``U``
  the unplaced bytes at step ``t`` - at the LOAD peak this leaves no slack at all;
* a record waiting below the level can only be lifted by a conflicting record
  placed later; if none is left, the branch is dead.

Rounds are limited-discrepancy searches (child ``i`` of a node spends ``i``
discrepancies) over a few priority orders, so a bounded budget goes to the
decisions near the root instead of thrashing at the bottom; a round that never cut
a child was exhaustive.  The budget counts placements, so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

#: A search level: a generator that yields, per child, the generator of the level below.
_Expansion: TypeAlias = Iterator["_Expansion"]


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Best packing found: ``offsets`` (0 for records of size 0), its ``arena``, whether no
    packing below ``arena`` exists (``proven``), and the placements spent (``nodes``)."""

    offsets: tuple[int, ...]
    arena: int
    proven: bool
    nodes: int


class _OutOfBudget(Exception):
    """Raised inside a round when the node budget is spent."""


#: First-child priorities tried in turn: (size, lifetime), (lifetime, size), area.
_PRIORITIES = ("size", "length", "area")
#: Up to this many records, skip limited discrepancy and run one complete branch and bound.
_PLAIN_DFS = 12


def search_offsets(
    sizes: Sequence[int],
    first: Sequence[int],
    last: Sequence[int],
    conflicts: Sequence[Sequence[int]],
    *,
    lower_bound: int,
    incumbent: Sequence[int],
    incumbent_arena: int,
    max_nodes: int,
) -> SearchResult:
    """Lower the arena of a valid ``incumbent`` packing, down to ``lower_bound`` if possible.

    ``conflicts[j]`` lists the records that must not overlap ``j`` in memory and must
    include every record whose inclusive range ``first..last`` overlaps ``j``'s.
    Records of size 0 are ignored.  Phase one asks for ``lower_bound`` directly (its
    tight bounds prune best) with half the budget; phase two, if that fails, lowers
    the incumbent with the rest, each packing found tightening the target.
    Stops when nothing better can exist or after ``max_nodes`` placements.
    """
    keep = [j for j, s in enumerate(sizes) if s > 0]
    best = list(incumbent)
    if not keep or incumbent_arena <= lower_bound:
        return SearchResult(tuple(best), incumbent_arena, True, 0)
    if incumbent_arena * len(keep) >= 1 << 62:
        # child keys pack (skyline, rank) into one int64; such sizes need a coarser unit first
        return SearchResult(tuple(best), incumbent_arena, False, 0)
    local = {j: i for i, j in enumerate(keep)}
    problem = _Problem(
        [sizes[j] for j in keep],
        [first[j] for j in keep],
        [last[j] for j in keep],
        [[local[k] for k in conflicts[j] if k in local and k != j] for j in keep],
    )
    best_arena = incumbent_arena
    spent = 0
    floor = lower_bound  # no packing has a smaller arena
    # small instances: one plain depth-first branch and bound settles them
    start = problem.n * problem.n if problem.n <= _PLAIN_DFS else 0
    phases = [lower_bound] if lower_bound < incumbent_arena - 1 else []
    # phase one aims straight at the bound (its tight bounds prune best) with half the
    # budget; phase two improves on the incumbent, tightening the target with every
    # packing it finds, with what is left (whatever phase one spent).  On pieces the
    # heuristics leave far above the bound, phase one rarely gets there and the
    # descending dives of phase two are what pays off.
    for aim in phases + [None]:
        limit = max_nodes // 2 if aim is not None else max_nodes
        discrepancies = start
        try:
            while best_arena > floor:
                target = aim if aim is not None else best_arena - 1
                found, exhaustive = None, False
                for priority in _PRIORITIES:
                    round_ = _Round(problem, priority, target, floor, discrepancies, limit - spent)
                    try:
                        round_.run()
                    finally:  # also when the budget runs out: keep what the round found
                        spent += round_.nodes
                        found = round_.best
                        if found is not None:
                            best_arena = max(o + s for o, s in zip(found, problem.sizes))
                            for i, j in enumerate(keep):
                                best[j] = found[i]
                    if not round_.cut:
                        exhaustive = True  # nothing at or below the round's final target exists
                        break
                    if found is not None:
                        break
                if exhaustive:
                    floor = max(floor, round_.target + 1)
                if aim is not None and (found is not None or exhaustive):
                    break  # LOAD reached, or proven out of reach: on to phase two
                if found is None:
                    discrepancies += 1
        except _OutOfBudget:
            pass  # this phase's share is spent (a round cut short keeps what it found)
    return SearchResult(tuple(best), best_arena, best_arena <= floor, spent)


class _Problem:
    """Static data of one instance, as numpy arrays over compressed time steps."""

    def __init__(self, sizes: list[int], first: list[int], last: list[int], conflicts: list[list[int]]) -> None:
        n = len(sizes)
        self.n = n
        self.sizes = sizes
        self.size = np.asarray(sizes, dtype=np.int64)
        coords = sorted(set(first) | set(last))
        where = {c: i for i, c in enumerate(coords)}
        self.steps = len(coords)
        self.lo = np.asarray([where[f] for f in first], dtype=np.int64)
        self.hi = np.asarray([where[x] + 1 for x in last], dtype=np.int64)
        self.adj = [np.asarray(sorted(set(c)), dtype=np.int64) for c in conflicts]
        self.degree = np.asarray([len(a) for a in self.adj], dtype=np.int64)
        span = self.hi - self.lo
        # per record, two blocks of a power-of-two length that cover its window
        self.level = np.asarray([int(x).bit_length() - 1 for x in span], dtype=np.int64)
        self.start2 = self.hi - (np.int64(1) << self.level)
        self.levels = int(self.level.max()) + 1
        unplaced = np.zeros(self.steps + 1, dtype=np.int64)
        np.add.at(unplaced, self.lo, self.size)
        np.subtract.at(unplaced, self.hi, self.size)
        self.unplaced0 = np.cumsum(unplaced)[: self.steps]
        self.span = span

    def rank(self, priority: str) -> np.ndarray:
        """A total order on the records (lower first): the first-child preference."""
        size, span, idx = self.size, self.span, np.arange(self.n)
        if priority == "size":
            keys = (idx, -span, -size)
        elif priority == "length":
            keys = (idx, -size, -span)
        else:
            keys = (idx, -size, -(size * span))
        order = np.lexsort(keys)
        rank = np.empty(self.n, dtype=np.int64)
        rank[order] = np.arange(self.n)
        return rank


_INF = np.iinfo(np.int64).max


class _Round:
    """One limited-discrepancy round towards arena ``<= target``; all state is undone on backtrack."""

    def __init__(
        self, problem: _Problem, priority: str, target: int, floor: int, discrepancies: int, budget: int
    ) -> None:
        self.p = problem
        self.rank = problem.rank(priority)
        self.target = target
        self.floor = floor
        self.discrepancies = discrepancies
        self.budget = budget
        self.nodes = 0
        self.cut = False
        self.best: list[int] | None = None
        n, steps = problem.n, problem.steps
        self.sky = np.zeros(n, dtype=np.int64)
        self.placed = np.zeros(n, dtype=bool)
        self.offset = np.zeros(n, dtype=np.int64)
        self.top = np.zeros(steps, dtype=np.int64)
        self.unplaced = problem.unplaced0.copy()
        self.open_neighbours = problem.degree.copy()
        self.table = np.empty((problem.levels, steps), dtype=np.int64)

    def run(self) -> list[int] | None:
        """The best packing within the target, or None; sets ``cut`` if a child was skipped.

        Each packing found lowers the target below its arena, so the rest of the
        round only looks for better ones; it stops early at ``floor``.  The best so
        far is also kept in ``best``, where it survives ``_OutOfBudget``.
        """
        if int(self.p.size.max()) > self.target or int(self.p.unplaced0.max()) > self.target:
            return None
        stack = [self._expand(level=0, previous=-1, spare=self.discrepancies)]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
            elif len(stack) == self.p.n:
                self.best = [int(x) for x in self.offset]
                arena = int((self.offset + self.p.size).max())
                if arena <= self.floor:
                    return self.best
                self.target = arena - 1
            else:
                stack.append(child)
        return self.best

    def _expand(self, level: int, previous: int, spare: int) -> _Expansion:
        """Yield, per feasible child, the expansion of that child with the child applied;
        undo it on resume (the stack of these generators is the search path)."""
        p = self.p
        sky = self.sky
        # order children by (skyline, rank) through one integer key: rank < n
        key = sky * p.n + self.rank
        key[self.placed] = _INF
        key[key <= level * p.n + previous] = _INF  # canonical order: only after the last placed
        count = len(key) - int(np.count_nonzero(key == _INF))
        if count > spare + 1:
            self.cut = True
        take = min(count, spare + 1)
        if take == 1:
            children = np.array([np.argmin(key)])
        elif take < count:
            part = np.argpartition(key, take - 1)[:take]
            children = part[np.argsort(key[part], kind="stable")]
        else:
            children = np.argsort(key, kind="stable")[:take]
        for i, j in enumerate(children.tolist()):
            self.nodes += 1
            if self.nodes > self.budget:
                raise _OutOfBudget
            offset = int(sky[j])
            end = offset + int(p.size[j])
            nb = p.adj[j]
            saved_sky = sky[nb]
            lo, hi = int(p.lo[j]), int(p.hi[j])
            saved_top = self.top[lo:hi].copy()
            sky[nb] = np.maximum(saved_sky, end)
            self.top[lo:hi] = end
            self.unplaced[lo:hi] -= p.size[j]
            self.open_neighbours[nb] -= 1
            self.placed[j] = True
            self.offset[j] = offset
            rank = int(self.rank[j])
            if end <= self.target and self._feasible(offset, rank):
                yield self._expand(offset, rank, spare - i)
            self.placed[j] = False
            self.open_neighbours[nb] += 1
            self.unplaced[lo:hi] += p.size[j]
            self.top[lo:hi] = saved_top
            sky[nb] = saved_sky

    def _feasible(self, level: int, previous: int) -> bool:
        p, sky = self.p, self.sky
        cand = np.flatnonzero(~self.placed)
        if len(cand) == 0:
            return True
        sky_c = sky[cand]
        waiting = (sky_c < level) | ((sky_c == level) & (self.rank[cand] < previous))
        if (waiting & (self.open_neighbours[cand] == 0)).any():
            return False
        floor_of = np.maximum(sky_c, level)
        if int((floor_of + p.size[cand]).max()) > self.target:
            return False
        floor = self._min_cover(cand, floor_of)
        return int((np.maximum(floor, self.top) + self.unplaced).max()) <= self.target

    def _min_cover(self, cand: np.ndarray, value: np.ndarray) -> np.ndarray:
        """Per step, the least ``value`` over the records of ``cand`` live there (0 where none).

        A sparse table read backwards: each window's two covering blocks take the
        value at their level, then minima flow down one level at a time.
        """
        p, table = self.p, self.table
        table.fill(_INF)
        levels = p.level[cand]
        np.minimum.at(table, (levels, p.lo[cand]), value)
        np.minimum.at(table, (levels, p.start2[cand]), value)
        for k in range(p.levels - 1, 0, -1):
            half = 1 << (k - 1)
            np.minimum(table[k - 1], table[k], out=table[k - 1])
            np.minimum(table[k - 1, half:], table[k, :-half], out=table[k - 1, half:])
        floor: np.ndarray = table[0]
        floor[floor == _INF] = 0
        return floor

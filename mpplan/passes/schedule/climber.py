"""One order under local search: the step profile in a max segment tree, and moves scored without re-simulating.

The work constants make ``auto``'s result independent of machine speed: the search
stops after a number of work units (roughly microseconds of this package's Python),
not seconds.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mpplan.passes.schedule.frontiers import SearchLimitError, min_peak_order
from mpplan.passes.schedule.memory import Memory

#: ``auto``'s local search stops after this many units of work, so its result does not
#: depend on machine speed.  Units are roughly microseconds of this module's Python:
#: building the search state costs ``BUILD_WORK`` per op, scoring a single-op move
#: ``MOVE_WORK`` plus 2 per step it spans, and an exact reordering of ``SEGMENT_OPS``
#: consecutive steps ``STATE_WORK`` per frontier it generates (at most ``SEGMENT_STATES``).
#: Segments are tried at up to ``SEGMENT_TRIES`` peak steps once single moves fail.
IMPROVE_WORK = 1_000_000
BUILD_WORK = 3
MOVE_WORK = 30
STATE_WORK = 15
SEGMENT_OPS = 12
SEGMENT_STATES = 5_000
SEGMENT_TRIES = 4

#: How far (in steps) the local search looks around a peak step and moves an op.
IMPROVE_RADIUS = 64

#: The iterated local search kicks the order with this many random moves and gives up
#: after this many kicks in a row bring nothing better.
KICK_MOVES = 3
KICK_PATIENCE = 40


class MaxTree:
    """A segment tree over the step profile: range maximum and point updates in O(log n)."""

    def __init__(self, values: Sequence[int]) -> None:
        size = 1
        while size < max(1, len(values)):
            size *= 2
        tree = [-1] * (2 * size)
        tree[size : size + len(values)] = values
        width = size  # level by level: the parents of tree[2w:4w] are tree[w:2w], pairwise maxima
        while width > 1:
            tree[width // 2 : width] = map(max, tree[width : 2 * width : 2], tree[width + 1 : 2 * width : 2])
            width //= 2
        self.size, self.tree = size, tree

    @property
    def top(self) -> int:
        return self.tree[1]

    def set(self, i: int, value: int) -> None:
        tree = self.tree
        i += self.size
        tree[i] = value
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2

    def max(self, lo: int, hi: int) -> int:
        """Largest value in ``[lo, hi)``; -1 when empty."""
        tree = self.tree
        best = -1
        lo += self.size
        hi += self.size
        while lo < hi:
            if lo & 1:
                best = max(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = max(best, tree[hi])
            lo //= 2
            hi //= 2
        return best

    def first_at_least(self, start: int, value: int) -> int:
        """The first index ``>= start`` holding at least ``value``; -1 when none."""
        tree, size = self.tree, self.size
        i = start + size
        while True:
            if tree[i] >= value:
                while i < size:
                    i = 2 * i if tree[2 * i] >= value else 2 * i + 1
                return i - size
            while i & 1:
                i //= 2
            if not i:
                return -1
            i += 1


@dataclass(frozen=True, slots=True)
class Move:
    """A new order of the steps from ``lo`` on (``ops``), their profile (``window``), the
    storages whose first or last toucher may change, and the score it gives (see ``Climber``)."""

    lo: int
    ops: tuple[int, ...]
    window: list[int]
    storages: tuple[int, ...]
    score: tuple[int, int, int]


class Climber:
    """One order under local search, with what makes a move cheap to score.

    The profile (bytes live per step) sits in a max segment tree and a histogram,
    and each storage remembers its first and last toucher.  Moving op ``k`` from
    position ``i`` to ``j`` changes the profile only between them, so a move is
    scored in O(|i - j| + touchers of ``k``'s storages + log n) without simulating
    the order again.  A move's score is (LOAD, steps at LOAD, change of the summed
    profile), lexicographically: lowering the peak is the goal, fewer peak steps and
    fewer byte-steps are progress towards it, and a strictly falling score cannot cycle.
    """

    def __init__(self, mem: Memory, order: Sequence[int], profile: list[int] | None = None) -> None:
        """``profile``: ``mem.profile(order)`` when the caller has it (the climber takes it over)."""
        self.mem = mem
        self.order = list(order)
        self.pos = [0] * mem.num_ops
        for x, k in enumerate(self.order):
            self.pos[k] = x
        self.first = [-1] * len(mem.nbytes)
        self.last = [-1] * len(mem.nbytes)
        for k in self.order:
            for s in mem.storages[k]:
                if self.first[s] < 0:
                    self.first[s] = k
                self.last[s] = k
        self.profile = mem.profile(self.order) if profile is None else profile
        self.tree = MaxTree(self.profile)
        self.histogram = Counter(self.profile)
        self.optimal_pieces: set[tuple[tuple[int, ...], tuple[bool, ...], tuple[bool, ...]]] = set()

    @property
    def score(self) -> tuple[int, int, int]:
        """The score of the current order; moves are compared with it."""
        peak = self.tree.top
        return peak, self.histogram[peak], 0

    def peak_steps(self, start: int) -> Iterator[int]:
        """Each step at the current LOAD once, from the first at or after ``start`` on, cyclically."""
        peak, at_peak, _ = self.score
        p = start
        for _ in range(at_peak):
            p = self.tree.first_at_least(p, peak)
            if p < 0:
                p = self.tree.first_at_least(0, peak)
            yield p
            p += 1
            if p == len(self.order):
                p = 0

    def window(self, k: int) -> tuple[int, int]:
        """Positions ``k`` may move to: after its last predecessor, before its first successor."""
        pos = self.pos
        lo = max((pos[p] for p in self.mem.preds[k]), default=-1) + 1
        hi = min((pos[s] for s in self.mem.succs[k]), default=len(pos)) - 1
        return lo, hi

    def candidates(self, p: int, radius: int) -> list[tuple[int, int]]:
        """Moves that may lower step ``p``: ops starting a storage that outlives ``p`` moved after
        it, ops ending one that was born before ``p`` moved before it, and ``p``'s own op."""
        mem, order, pos, first, last = self.mem, self.order, self.pos, self.first, self.last
        n = len(order)
        moves: list[tuple[int, int]] = []
        for x in range(max(0, p - radius), p):
            y = order[x]
            if any(first[s] == y and (mem.to_end[s] or pos[last[s]] > p) for s in mem.storages[y]):
                hi = self.window(y)[1]
                if hi >= p:
                    moves.append((y, p))
                    if min(hi, p + radius) > p:
                        moves.append((y, min(hi, p + radius)))
        for x in range(p + 1, min(n, p + radius + 1)):
            y = order[x]
            if any(last[s] == y and not mem.to_end[s] and pos[first[s]] < p for s in mem.storages[y]):
                lo = self.window(y)[0]
                if lo <= p:
                    moves.append((y, p))
                    if max(lo, p - radius) < p:
                        moves.append((y, max(lo, p - radius)))
        y = order[p]
        lo, hi = self.window(y)
        for to in (max(lo, p - radius), min(hi, p + radius)):
            if to != p:
                moves.append((y, to))
        return moves

    def evaluate(self, k: int, j: int) -> Move:
        """Score moving op ``k`` to position ``j`` (inside its window) without making the move."""
        mem, order, pos, profile, first, last = self.mem, self.order, self.pos, self.profile, self.first, self.last
        n = len(order)
        i = pos[k]
        lo, hi = min(i, j), max(i, j)

        def moved(p: int) -> int:
            if i < j:
                return p - 1 if i < p <= j else p
            return p + 1 if j <= p < i else p

        # Each of k's storages: bytes, old live steps [of, ol], new live steps [nf, nl].
        ranges = []
        for s in mem.storages[k]:
            f, l_ = first[s], last[s]
            of, ol = pos[f], pos[l_]
            if f != k:
                nf = min(moved(of), j)
            else:
                nf = min([moved(pos[t]) for t in mem.touchers[s] if t != k] + [j])
            if l_ != k:
                nl = max(moved(ol), j)
            else:
                nl = max([moved(pos[t]) for t in mem.touchers[s] if t != k] + [j])
            if mem.to_end[s]:
                ol = nl = n - 1
            ranges.append((mem.nbytes[s], of, ol, nf, nl))
        own = sum(r[0] for r in ranges)
        # k's step: what outlives its new neighbour on the near side, plus its own storages.
        neighbour = order[j]
        gap = profile[j] - sum(b for b, of, ol, _, _ in ranges if of <= j <= ol)
        mine = mem.storages[k]
        if i < j:  # k runs right after ``neighbour``: drop what dies there
            gap -= sum(
                mem.nbytes[s]
                for s in mem.storages[neighbour]
                if s not in mine and not mem.to_end[s] and last[s] == neighbour
            )
        else:  # k runs right before ``neighbour``: drop what is born there
            gap -= sum(mem.nbytes[s] for s in mem.storages[neighbour] if s not in mine and first[s] == neighbour)
        window = []
        shift = 1 if i < j else -1
        for x in range(lo, hi + 1):
            if x == j:
                window.append(gap + own)
                continue
            old = x + shift
            v = profile[old]
            for b, of, ol, nf, nl in ranges:
                if of <= old <= ol:
                    v -= b
                if nf <= x <= nl:
                    v += b
            window.append(v)
        ops = order[lo : hi + 1]
        if i < j:
            ops = ops[1:] + [k]
        else:
            ops = [k] + ops[:-1]
        return self._move(lo, ops, window, mem.storages[k])

    def reorder(self, lo: int, hi: int, budget: Budget) -> Move | None:
        """The best reordering of steps ``lo..hi`` if it lowers their largest step, found by
        the exact search on that piece (``frontiers.min_peak_order``), else None.
        Pieces known to be optimal already are skipped for free."""
        mem, pos, first, last = self.mem, self.pos, self.first, self.last
        ops = self.order[lo : hi + 1]
        local = {k: i for i, k in enumerate(ops)}
        storages = list(dict.fromkeys(s for k in ops for s in mem.storages[k]))
        index = {s: i for i, s in enumerate(storages)}
        before = [pos[first[s]] < lo for s in storages]
        after = [mem.to_end[s] or pos[last[s]] > hi for s in storages]
        # The piece is the whole subproblem: same ops, order and boundary, same answer.
        key = (tuple(ops), tuple(before), tuple(after))
        if key in self.optimal_pieces:
            return None
        # The piece's own bytes at each step; the rest lives across it and is the same for every order.
        own = self._piece_profile(ops, storages, before, after)
        base = self.profile[lo] - own[0]
        limit = min(SEGMENT_STATES, budget.units // STATE_WORK + 1)
        try:
            better, generated = min_peak_order(
                [[local[q] for q in mem.preds[k] if q in local] for k in ops],
                [[index[s] for s in mem.storages[k]] for k in ops],
                [mem.nbytes[s] for s in storages],
                before=before,
                after=after,
                bound=max(own),
                state_limit=limit,
            )
        except SearchLimitError:
            budget.units -= STATE_WORK * limit
            return None
        budget.units -= STATE_WORK * generated
        if better is None:
            self.optimal_pieces.add(key)
            return None
        new_ops = [ops[i] for i in better]
        window = [base + v for v in self._piece_profile(new_ops, storages, before, after)]
        return self._move(lo, new_ops, window, tuple(storages))

    def _piece_profile(
        self, ops: Sequence[int], storages: Sequence[int], before: Sequence[bool], after: Sequence[bool]
    ) -> list[int]:
        """Bytes of ``storages`` live at each step of ``ops`` run in that order (see ``reorder``)."""
        mem = self.mem
        index = {s: i for i, s in enumerate(storages)}
        remaining = [0] * len(storages)
        for k in ops:
            for s in mem.storages[k]:
                remaining[index[s]] += 1
        started = list(before)
        live = sum(mem.nbytes[s] for s, b in zip(storages, before) if b)
        steps = []
        for k in ops:
            for s in mem.storages[k]:
                i = index[s]
                if not started[i]:
                    started[i] = True
                    live += mem.nbytes[s]
            steps.append(live)
            for s in mem.storages[k]:
                i = index[s]
                remaining[i] -= 1
                if not remaining[i] and not after[i]:
                    live -= mem.nbytes[s]
        return steps

    def _move(self, lo: int, ops: Sequence[int], window: list[int], storages: Sequence[int]) -> Move:
        hi = lo + len(ops) - 1
        before = self.profile[lo : hi + 1]
        peak = max(self.tree.max(0, lo), self.tree.max(hi + 1, len(self.order)), max(window))
        at_peak = self.histogram[peak] - before.count(peak) + window.count(peak)
        return Move(lo, tuple(ops), window, tuple(storages), (peak, at_peak, sum(window) - sum(before)))

    def apply(self, move: Move) -> Move:
        """Make ``move``; returns the move that undoes it."""
        mem, order, pos = self.mem, self.order, self.pos
        lo, hi = move.lo, move.lo + len(move.ops)
        undo = Move(lo, tuple(order[lo:hi]), self.profile[lo:hi], move.storages, self.score)
        order[lo:hi] = move.ops
        for x, (k, value) in enumerate(zip(move.ops, move.window), start=lo):
            pos[k] = x
            old = self.profile[x]
            self.histogram[old] -= 1
            if not self.histogram[old]:
                del self.histogram[old]
            self.histogram[value] += 1
            self.profile[x] = value
            self.tree.set(x, value)
        for s in move.storages:
            self.first[s] = min(mem.touchers[s], key=pos.__getitem__)
            self.last[s] = max(mem.touchers[s], key=pos.__getitem__)
        return undo


@dataclass(slots=True)
class Budget:
    """What the local search may still spend: work units (roughly microseconds of this
    module's Python, counted so results do not depend on machine speed) and a deadline."""

    units: int
    deadline: float

    @property
    def exhausted(self) -> bool:
        return self.units <= 0 or time.monotonic() >= self.deadline

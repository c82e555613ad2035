"""A segment tree over a memory profile: the bytes over a budget, summed over the steps,
and the peak, after adding bytes over runs of steps, in O(log n) per run.

The budget search (``mpplan.passes.remat.choice``) scores a change of its choice
(one recompute more or less) many times per step; the change adds or removes a
tensor's bytes over long runs of steps (a forward activation no longer held until its
backward use), so valuing every step of the run made each score O(ops).  Here the
steps are grouped in *leaves* (the search's leaf is an original op and the recomputes
running before it); a node keeps, for the steps under it, the peak, how many are over
the budget, their bytes over it, the least value over it and the largest at or under
it.  Adding ``d`` to every step under a node moves no step across the budget when
``d`` stays under the gap to that least (or largest) value; the node's sums then
follow without visiting the steps (``sum`` grows by ``d`` per step over budget).
Only nodes holding a step that crosses are opened, down to its leaf: a change costs
O(log n) per run it adds over, and O(log n) per step it moves across the budget.

Additions are lazy (a node's pending add is its children's); ``score`` reads a
change without making it, ``update`` makes it.  A change is a step function of the
step's *key* (``Steps``), leaf ``i`` holding keys ``i * span`` to ``i * span + span -
1`` (``Leaves``); leaves whose steps do not all change by the same amount (or that
gain or lose a step) are valued from ``values(lo, hi)``, the values of the steps of
leaves ``lo:hi`` after it; ``score`` values a node of up to ``DIRECT`` leaves so
at once (vectorised) rather than open it, where a step under it crosses the budget.

>>> tree = ProfileTree.build([[5, 1], [7], [2, 9]], budget=6)
>>> tree.excess, tree.peak
(4, 9)
>>> less_two = Steps.of([(0, 99, -2)])  # every step loses two bytes
>>> leaves = Leaves(span=2, wide=range(3))
>>> after = lambda lo, hi: np.array([3, -1, 5, 0, 7][2 * lo - (lo > 1): 2 * hi - (hi > 1)])
>>> tree.score(less_two, leaves, after), tree.excess  # scored, not made
((-3, 7), 4)
>>> tree.update(less_two, leaves, after)
>>> tree.excess, tree.peak
(1, 7)
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Leaves", "ProfileTree", "Steps", "Values"]

#: Stands for "no such value" in the least-over / largest-under fields: farther from
#: any budget than bytes can be, so no add of bytes brings it across.
_FAR = 1 << 62

Values = Callable[[int, int], np.ndarray]
"""``values(lo, hi)``: the values of the steps of leaves ``lo:hi`` after the change."""

#: ``score`` values a node of at most this many leaves in one vectorised pass, rather
#: than open it, when a step under it crosses the budget.
DIRECT = 32


@dataclass(frozen=True, slots=True)
class Steps:
    """A change of a profile as a step function of the step's key: every key from
    ``bounds[i]`` up to ``bounds[i + 1]`` (excluded; the last run is unbounded) gains
    ``adds[i]`` bytes (``bounds[0]`` is below every key); ``None`` marks keys valued one by one (a step that goes or comes).

    >>> steps = Steps.of([(2, 5, 10), (4, 8, -3)], marks=[7])
    >>> [steps.at(k) for k in range(10)]
    [0, 0, 10, 10, 7, 7, -3, None, -3, 0]
    """

    bounds: tuple[int, ...]
    adds: tuple[int | None, ...]

    @classmethod
    def of(cls, runs: Iterable[tuple[int, int, int]], marks: Iterable[int] = ()) -> Steps:
        """The change adding ``add`` bytes over keys ``first..last`` for each run
        ``(first, last, add)`` (inclusive), with the keys ``marks`` marked."""
        events: dict[int, int] = {}
        for first, last, add in runs:
            events[first] = events.get(first, 0) + add
            events[last + 1] = events.get(last + 1, 0) - add
        marked = set(marks)
        cuts = sorted({*events, *marked, *(m + 1 for m in marked)})
        bounds: list[int] = [-_FAR]  # every key is at or after the first bound
        adds: list[int | None] = [0]
        running = 0
        for key in cuts:
            running += events.get(key, 0)
            gain = None if key in marked else running
            if gain != adds[-1]:
                bounds.append(key)
                adds.append(gain)
        return cls(tuple(bounds), tuple(adds))

    def at(self, key: int) -> int | None:
        """The bytes key ``key`` gains (``None``: marked)."""
        return self.adds[bisect.bisect_right(self.bounds, key) - 1]

    def gain(self, key: int) -> int:
        """The bytes key ``key`` gains, 0 for a marked one."""
        return self.at(key) or 0

    def gains(self, keys: np.ndarray) -> np.ndarray:
        """``gain`` of every key of ``keys``, at once."""
        adds = np.array([add or 0 for add in self.adds], np.int64)
        return adds[np.searchsorted(np.array(self.bounds, np.int64), keys, "right") - 1]


@dataclass(frozen=True, slots=True)
class Leaves:
    """The keys of each leaf: leaf ``i`` holds keys ``i * span`` up to ``i * span + span
    - 1``; one in neither ``wide`` nor ``fresh`` holds only its last key, so a change
    starting there leaves it whole."""

    span: int
    wide: Container[int]
    fresh: Container[int] = frozenset()


class ProfileTree:
    """The segment tree of the module docstring over ``width`` leaves (a power of two;
    node 1 is the root, node ``k``'s children are ``2k`` and ``2k + 1``, leaf ``i`` is
    node ``width + i``).

    Per node, for the values under it (its ancestors' pending adds not counted):
    ``peak``; ``over``, how many exceed ``budget``; ``excess``, their sum less
    ``budget`` each; ``low``, the least of them; ``high``, the largest of the others;
    ``pending``, the add its children have yet to see.  Invariant: ``over``, ``low`` and
    ``high`` split the real values (ancestors' adds counted) at ``budget``: an add is
    left pending only on a node none of whose values it moves across.
    """

    __slots__ = ("budget", "width", "peak_", "over", "excess_", "low", "high", "pending")

    def __init__(self, budget: int, width: int) -> None:
        self.budget, self.width = budget, width
        self.peak_: list[int] = []
        self.over: list[int] = []
        self.excess_: list[int] = []
        self.low: list[int] = []
        self.high: list[int] = []
        self.pending = [0] * width

    @classmethod
    def build(cls, leaves: Sequence[Sequence[int]], budget: int) -> ProfileTree:
        """The tree of ``leaves`` (each a non-empty list of step values) at ``budget``."""
        values = np.array([v for leaf in leaves for v in leaf], np.int64)
        lengths = np.array([len(leaf) for leaf in leaves], np.int64)
        return cls.of_profile(values, np.repeat(np.arange(len(leaves)), lengths), budget)

    @classmethod
    def of_profile(cls, profile: np.ndarray, leaf: np.ndarray, budget: int) -> ProfileTree:
        """The tree of ``profile`` whose step ``k`` belongs to leaf ``leaf[k]``
        (ascending, every leaf from 0 to the last holding a step), in one vectorised pass."""
        count = int(leaf[-1]) + 1 if len(leaf) else 0
        width = 1
        while width < max(count, 1):
            width *= 2
        firsts = np.searchsorted(leaf, np.arange(count))
        over = profile > budget

        def per_leaf(ufunc: np.ufunc, column: np.ndarray, empty: int) -> np.ndarray:
            row = np.full(2 * width, empty, np.int64)
            if count:
                row[width : width + count] = ufunc.reduceat(column, firsts)
            return row

        peak = per_leaf(np.maximum, profile, -_FAR)
        n_over = per_leaf(np.add, over.astype(np.int64), 0)
        excess = per_leaf(np.add, np.where(over, profile - budget, 0), 0)
        low = per_leaf(np.minimum, np.where(over, profile, _FAR), _FAR)
        high = per_leaf(np.maximum, np.where(over, -_FAR, profile), -_FAR)
        size = width
        while size > 1:  # nodes size/2 .. size-1 from their children size .. 2*size-1
            half = size // 2
            for row, ufunc in ((peak, np.maximum), (n_over, np.add), (excess, np.add), (low, np.minimum),
                               (high, np.maximum)):
                row[half:size] = ufunc(row[size : 2 * size : 2], row[size + 1 : 2 * size : 2])
            size = half
        tree = cls(budget, width)
        tree.peak_, tree.over, tree.excess_ = peak.tolist(), n_over.tolist(), excess.tolist()
        tree.low, tree.high = low.tolist(), high.tolist()
        return tree

    def copy(self) -> ProfileTree:
        twin = ProfileTree(self.budget, self.width)
        twin.peak_, twin.over, twin.excess_ = self.peak_.copy(), self.over.copy(), self.excess_.copy()
        twin.low, twin.high, twin.pending = self.low.copy(), self.high.copy(), self.pending.copy()
        return twin

    @property
    def excess(self) -> int:
        """Bytes over the budget summed over every step."""
        return self.excess_[1]

    @property
    def peak(self) -> int:
        return self.peak_[1]

    def _uniform(self, steps: Steps, leaves: Leaves, lo: int, hi: int) -> int | None:
        """The bytes every step of leaves ``lo:hi`` gains, or ``None`` (they differ, or one is marked)."""
        span, bounds = leaves.span, steps.bounds
        first = lo * span if lo in leaves.wide or lo in leaves.fresh else lo * span + span - 1
        i = bisect.bisect_right(bounds, first) - 1
        return None if i + 1 < len(bounds) and bounds[i + 1] < hi * span else steps.adds[i]

    def score(self, steps: Steps, leaves: Leaves, values: Values) -> tuple[int, int]:
        """``(change of excess, peak)`` after the change, which is not made."""
        high, low, over, peak, pending = self.high, self.low, self.over, self.peak_, self.pending
        budget, width = self.budget, self.width
        span, wide, fresh, bounds, adds = leaves.span, leaves.wide, leaves.fresh, steps.bounds, steps.adds
        count = len(bounds)
        gain, top = 0, -_FAR
        todo = [(1, 0, width, 0)]  # (node, its leaves lo:hi, its ancestors' pending adds)
        while todo:  # depth first, ``_uniform`` inlined: this loop is the search's hottest
            node, lo, hi, above = todo.pop()
            first = lo * span if lo in wide or lo in fresh else lo * span + span - 1
            i = bisect.bisect_right(bounds, first) - 1
            add = None if i + 1 < count and bounds[i + 1] < hi * span else adds[i]
            if add is not None:
                shift = above + add
                if (high[node] + shift <= budget) if shift >= 0 else (low[node] + shift > budget):
                    gain += add * over[node]
                    top = max(top, peak[node] + shift)
                    continue
            if hi - lo <= DIRECT:  # its values after the change, against its excess before
                after = values(lo, hi)
                if len(after):
                    gain += int(np.maximum(after - budget, 0).sum()) - self.excess_[node] - above * over[node]
                    top = max(top, int(after.max()))
                continue
            above += pending[node]
            mid = (lo + hi) // 2
            todo += ((2 * node + 1, mid, hi, above), (2 * node, lo, mid, above))
        return gain, top

    def update(self, steps: Steps, leaves: Leaves, values: Values) -> None:
        """Make the change (``values`` gives the leaves' values once made)."""
        self._update(1, 0, self.width, steps, leaves, values)

    def _update(self, node: int, lo: int, hi: int, steps: Steps, leaves: Leaves, values: Values) -> None:
        add = self._uniform(steps, leaves, lo, hi)
        if add == 0:
            return
        if add is not None and ((self.high[node] + add <= self.budget) if add >= 0
                                else (self.low[node] + add > self.budget)):
            self._add(node, add)
            return
        if node >= self.width:
            self._set(node, values(lo, hi).tolist())
            return
        self._push(node)
        mid = (lo + hi) // 2
        self._update(2 * node, lo, mid, steps, leaves, values)
        self._update(2 * node + 1, mid, hi, steps, leaves, values)
        self._pull(node)

    def _add(self, node: int, add: int) -> None:
        self.peak_[node] += add
        self.excess_[node] += add * self.over[node]
        self.low[node] += add
        self.high[node] += add
        if node < self.width:
            self.pending[node] += add

    def _push(self, node: int) -> None:
        add = self.pending[node]
        if add:
            self._add(2 * node, add)
            self._add(2 * node + 1, add)
            self.pending[node] = 0

    def _pull(self, node: int) -> None:
        a, b = 2 * node, 2 * node + 1
        self.peak_[node] = max(self.peak_[a], self.peak_[b])
        self.over[node] = self.over[a] + self.over[b]
        self.excess_[node] = self.excess_[a] + self.excess_[b]
        self.low[node] = min(self.low[a], self.low[b])
        self.high[node] = max(self.high[a], self.high[b])

    def _set(self, node: int, values: Sequence[int]) -> None:
        budget = self.budget
        over = [v for v in values if v > budget]
        self.peak_[node] = max(values, default=-_FAR)
        self.over[node] = len(over)
        self.excess_[node] = sum(over) - budget * len(over)
        self.low[node] = min(over, default=_FAR)
        self.high[node] = max((v for v in values if v <= budget), default=-_FAR)

"""The budget search's evaluator: one choice of recomputes, its exact memory profile,
and changes to it scored by re-simulating only the steps they touch.

``evaluate`` (``mpplan.passes.remat.model``) simulates every storage of the graph for
one choice.  The greedy of ``mpplan.passes.remat.budget`` asks that dozens of times
per step for choices one move apart, which made it quadratic in the graph.  A
``Choice`` keeps the profile of the rewritten as-given order and scores a change
(``trial``) from the steps between the first and the last one it touches:

* the candidates whose anchor changes (or that start or stop running): the ones
  added and removed and, transitively, the chosen producers of those whose anchor
  moved (a recompute runs before its earliest chosen consumer);
* the storages those candidates write or read: only their live intervals move;
* every other storage keeps its interval in *step keys* (``op * span + span - 1``
  for original op ``op``, ``op * span + i`` for the recompute of candidate ``i``
  running before it, ``span`` = candidates + 1: the rewritten order sorts by key).
  So the profile outside the touched steps does not change, and a new recompute
  step holds what the step after it holds less what starts there.

Excess and load of the whole order then follow from the touched segment and the
prefix and suffix maxima of the rest; ``commit`` splices the segment in.  Costs
are exact integers (each op cost times one power of two), so a total does not
depend on the order moves were made in.  The tests hold every committed ``Choice``
equal to a fresh ``evaluate`` of its candidates.

>>> from mpplan.capture import synthetic
>>> from mpplan.passes.remat.evaluation import evaluate
>>> from mpplan.passes.remat.model import build_model
>>> model = build_model(synthetic.chain(3, train=True))
>>> choice = Choice.build(model)
>>> trial = choice.trial(0, add=[0])
>>> trial.load == evaluate(model, [0]).load, choice.load == evaluate(model, []).load
(True, True)
>>> choice.commit(trial)
>>> choice.chosen, choice.load == evaluate(model, [0]).load
((0,), True)
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mpplan.passes.remat.evaluation import Evaluation, anchors, reanchor
from mpplan.passes.remat.index import Intervals, ModelIndex, draw, spans
from mpplan.passes.remat.model import NEVER, RematModel
from mpplan.passes.remat.moves import MoveCache

__all__ = ["Choice", "ModelIndex", "Trial"]



@dataclass(frozen=True, slots=True, eq=False)
class Trial:
    """A change to a ``Choice``, scored exactly, and what ``Choice.commit`` needs to make it.

    ``load``, ``excess`` (live bytes over ``budget`` summed over the steps) and
    ``cost`` are those of the changed choice, ``units`` its cost in the index's
    units.  ``moved``: candidate -> its new anchor (``NEVER``: it stops running);
    ``intervals``: the storages whose intervals change, and the new ones; steps
    ``lo:hi`` of the choice are the ones that change: ``value`` holds their new live
    bytes (those of steps that go are meaningless) and ``held`` those of the new
    recompute steps, in key order.
    """

    version: int
    budget: int
    load: int
    excess: int
    cost: float
    units: int
    moved: dict[int, int]
    intervals: dict[int, Intervals]
    lo: int
    hi: int
    value: np.ndarray
    held: list[int]


class Choice:
    """One choice of recomputes with its exact profile; ``commit`` changes it in place.

    Invariant: ``anchor`` holds the effective candidates (those some late use needs)
    and where they run, as ``anchors`` gives them; ``keys`` are the steps of the
    rewritten as-given order (ascending step keys), ``profile`` their live dynamic
    bytes and ``starts`` the bytes of the storages whose life starts there;
    ``intervals[j]`` are storage ``j``'s live intervals (empty for a storage of no
    bytes); ``units`` is the cost in ``index.unit`` parts.  ``moves`` ranks the moves
    from this choice; ``copy`` branches a search.
    """

    __slots__ = ("index", "anchor", "keys", "profile", "starts", "intervals", "units", "load", "version",
                 "moves", "_maxima", "_over", "_prefix")

    def __init__(
        self,
        index: ModelIndex,
        anchor: dict[int, int],
        keys: np.ndarray,
        profile: np.ndarray,
        starts: np.ndarray,
        intervals: list[Intervals],
        moves: MoveCache,
    ) -> None:
        self.index = index
        self.anchor = anchor
        self.keys = keys
        self.profile = profile
        self.starts = starts
        self.intervals = intervals
        self.units = sum(index.cand_units[i] for i in anchor)
        self.load = int(profile.max()) if len(profile) else 0
        self.version = 0
        self.moves = moves
        self._maxima: tuple[np.ndarray, np.ndarray] | None = None
        self._over: tuple[int, np.ndarray, np.ndarray] | None = None
        self._prefix: tuple[int, np.ndarray] | None = None

    @classmethod
    def build(cls, model: RematModel, chosen: Iterable[int] = (), *, index: ModelIndex | None = None) -> Choice:
        """The choice of candidates ``chosen``, simulated in full."""
        index = ModelIndex.of(model) if index is None else index
        span = index.span
        anchor = anchors(model, chosen)

        intervals = [index.intervals(j, anchor, {}) if size else () for j, size in enumerate(model.size)]
        slots = np.array(sorted(a * span + i for i, a in anchor.items()), dtype=np.int64)
        keys = np.sort(np.concatenate((index.op_keys, slots)))
        profile, starts = draw(keys, intervals, model.size)
        return cls(index, anchor, keys, profile, starts, intervals, MoveCache(model, index.producers))

    def copy(self) -> Choice:
        """An independent choice equal to this one (a trial of either, made before
        either changes, may be committed to the other)."""
        twin = Choice.__new__(Choice)
        twin.index, twin.keys, twin.profile, twin.starts = self.index, self.keys, self.profile, self.starts
        twin.anchor, twin.intervals = dict(self.anchor), list(self.intervals)
        twin.units, twin.load, twin.version = self.units, self.load, self.version
        twin.moves = self.moves.copy()
        twin._maxima, twin._over, twin._prefix = self._maxima, self._over, self._prefix
        return twin

    @property
    def model(self) -> RematModel:
        return self.index.model

    @property
    def chosen(self) -> tuple[int, ...]:
        return tuple(sorted(self.anchor))

    @property
    def cost(self) -> float:
        """The added op cost, correctly rounded."""
        return self.units / self.index.unit

    @property
    def peak(self) -> int:
        return self.model.static_bytes + self.load

    def evaluation(self) -> Evaluation:
        """This choice as ``evaluate`` reports it."""
        span = self.index.span
        orig = np.nonzero(self.keys % span == span - 1)[0]
        return Evaluation(self.chosen, dict(self.anchor), self.load, self.peak, tuple(self.profile.tolist()),
                          tuple(orig.tolist()), self.cost)

    def excess(self, budget: int) -> int:
        """Live bytes over ``budget``, summed over the steps."""
        return self._excess_between(budget, 0, len(self.profile))

    def over_counts(self, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """``(through, own)`` by original op ``p``: the steps over ``budget`` up to and
        including ``p`` (recomputes before it included), and whether ``p``'s own step is
        over.  The steps over strictly between ops ``x < y`` are then
        ``through[y] - through[x] - own[y]``."""
        if self._over is None or self._over[0] != budget:
            # Op p's step: p plus the recomputes that run before ops up to p (no key
            # arithmetic: a division per step cost as much as the rest together).
            anchored = np.fromiter(self.anchor.values(), np.int64, len(self.anchor))
            step = np.cumsum(np.bincount(anchored, minlength=self.model.num_ops)) + np.arange(self.model.num_ops)
            over = self.profile > budget
            through = np.cumsum(over)[step]
            own = over[step].astype(np.int64)
            self._over = budget, through, own
        return self._over[1], self._over[2]

    def ranked(
        self, budget: int, *, levels: int, per_cost: bool = True, banned: frozenset[int] = frozenset(), limit: int
    ) -> list[tuple[int, ...]]:
        """The best ``limit`` moves from this choice (``MoveCache.ranked``)."""
        return self.moves.ranked(
            self.anchor, self.over_counts(budget), levels=levels, per_cost=per_cost, banned=banned, limit=limit
        )

    def trial(self, budget: int, *, add: Iterable[int] = (), remove: Iterable[int] = ()) -> Trial:
        """This choice with candidates ``add`` added and ``remove`` removed, scored at
        ``budget`` (module docstring); ``self`` is left as it is.

        Only the score is computed here, over the old steps of the touched segment (a
        step that goes is skipped, a new one valued on its own); ``commit`` draws the
        new steps, for the one trial of many that is kept.
        """
        index, model = self.index, self.model
        span, anchor = index.span, self.anchor
        moved = reanchor(model, index.producers, anchor, add, remove)
        units = self.units
        for c, a in moved.items():
            if (a < NEVER) != (c in anchor):  # starts or stops running; a moved anchor costs nothing
                units += index.cand_units[c] if a < NEVER else -index.cand_units[c]
        if not moved:
            return Trial(self.version, budget, self.load, self.excess(budget), units / index.unit, units, moved, {},
                         0, 0, self.profile[:0], [])

        touched = sorted({j for c in moved for j in (*model.cand_outputs[c], *index.reads[c]) if model.size[j]})
        intervals = {j: index.intervals(j, anchor, moved) for j in touched}
        gone = [anchor[c] * span + c for c in moved if c in anchor]
        new = sorted(a * span + c for c, a in moved.items() if a < NEVER)
        old_firsts, old_lasts, old_sizes = spans(self.intervals, touched, model.size)
        new_firsts, new_lasts, new_sizes = spans(intervals, touched, model.size)
        firsts, lasts = old_firsts + new_firsts, old_lasts + new_lasts
        ends = [a * span + span - 1 for a in moved.values() if a < NEVER]
        keys = self.keys
        lo = int(keys.searchsorted(min(firsts + gone + new)))
        hi = int(keys.searchsorted(max(lasts + gone + ends), "right"))

        # The old steps of the segment, valued with the moved storages' new intervals.
        seg = keys[lo:hi]
        sizes = np.array([-size for size in old_sizes] + new_sizes, np.int64)
        delta = np.zeros(hi - lo + 1, np.int64)
        np.add.at(delta, seg.searchsorted(firsts), sizes)
        np.add.at(delta, seg.searchsorted(lasts, "right"), -sizes)
        value = self.profile[lo:hi] + delta[:-1].cumsum()
        if gone:
            value[seg.searchsorted(gone)] = min(0, budget)  # over no budget, under every load
        # A new step holds what the old step after it holds, less what starts there, with
        # the moved storages' old intervals taken away and their new ones added.
        after = (seg.searchsorted(new) + lo).tolist()
        thens = keys[after].tolist()
        change = [0] * (len(new) + 1)
        for first, last, size in zip(old_firsts, old_lasts, old_sizes):  # live at the step after, not from it
            change[bisect.bisect_right(thens, first)] -= size
            change[bisect.bisect_right(thens, last)] += size
        for first, last, size in zip(new_firsts, new_lasts, new_sizes):  # live at the new step
            change[bisect.bisect_left(new, first)] += size
            change[bisect.bisect_right(new, last)] -= size
        profile, starts = self.profile, self.starts
        held = [int(profile[k]) - int(starts[k]) + c for k, c in zip(after, itertools.accumulate(change))]

        excess = self.excess(budget) - self._excess_between(budget, lo, hi)
        excess += int(np.maximum(value - budget, 0).sum()) + sum(max(0, v - budget) for v in held)
        load = max(int(value.max()), self._max_outside(lo, hi), *held)
        return Trial(self.version, budget, load, excess, units / index.unit, units, moved, intervals, lo, hi, value,
                     held)

    def commit(self, trial: Trial) -> None:
        """Make ``trial`` (of this choice as it is now) the choice."""
        assert trial.version == self.version, f"a trial of version {trial.version} committed to {self.version}"
        self.version += 1
        if not trial.moved:
            return
        self._splice(trial)
        toggled = [c for c, a in trial.moved.items() if (a < NEVER) != (c in self.anchor)]
        for j, intervals in trial.intervals.items():
            self.intervals[j] = intervals
        for c, a in trial.moved.items():
            if a < NEVER:
                self.anchor[c] = a
            else:
                del self.anchor[c]
        self.units, self.load = trial.units, trial.load
        self._maxima = self._over = self._prefix = None
        self.moves.note_moved(trial.moved, toggled)

    def _splice(self, trial: Trial) -> None:
        """Replace steps ``trial.lo:trial.hi`` by the trial's: the old steps that stay,
        valued as the trial valued them, and the new recompute steps."""
        model, span, lo, hi = self.model, self.index.span, trial.lo, trial.hi
        seg = self.keys[lo:hi]
        keep = np.ones(len(seg), bool)
        keep[seg.searchsorted([self.anchor[c] * span + c for c in trial.moved if c in self.anchor])] = False
        added = np.array(sorted(a * span + c for c, a in trial.moved.items() if a < NEVER), np.int64)
        kept = seg[keep]
        # The new steps' places in the new segment, and the kept steps' (np.insert's
        # answer, without its per-call overhead three times over).
        at = kept.searchsorted(added) + np.arange(len(added))
        stay = np.ones(len(kept) + len(added), bool)
        stay[at] = False
        keys = _merged(stay, kept, at, added)
        profile = _merged(stay, trial.value[keep], at, np.array(trial.held, np.int64))
        starts = self.starts[lo:hi].copy()
        firsts, _, sizes = spans(self.intervals, trial.intervals, model.size)
        np.add.at(starts, seg.searchsorted(firsts), -np.array(sizes, np.int64))
        starts = _merged(stay, starts[keep], at, np.zeros(len(added), np.int64))
        firsts, _, sizes = spans(trial.intervals, trial.intervals, model.size)
        np.add.at(starts, keys.searchsorted(firsts), np.array(sizes, np.int64))
        self.keys = np.concatenate((self.keys[:lo], keys, self.keys[hi:]))
        self.profile = np.concatenate((self.profile[:lo], profile, self.profile[hi:]))
        self.starts = np.concatenate((self.starts[:lo], starts, self.starts[hi:]))

    def restore(self, anchor: dict[int, int], budget: int) -> None:
        """Make the choice whose effective candidates are ``anchor``'s (a snapshot)."""
        self.commit(self.trial(budget, add=anchor.keys() - self.anchor.keys(),
                               remove=self.anchor.keys() - anchor.keys()))

    def _excess_between(self, budget: int, lo: int, hi: int) -> int:
        """Live bytes over ``budget`` summed over steps ``lo:hi``."""
        if self._prefix is None or self._prefix[0] != budget:
            over = np.maximum(self.profile - budget, 0)
            self._prefix = budget, np.concatenate(([0], np.cumsum(over)))
        prefix = self._prefix[1]
        return int(prefix[hi] - prefix[lo])

    def _max_outside(self, lo: int, hi: int) -> int:
        """The largest profile value outside steps ``lo:hi`` (0 when there is none)."""
        if self._maxima is None:
            self._maxima = np.maximum.accumulate(self.profile), np.maximum.accumulate(self.profile[::-1])[::-1]
        before, after = self._maxima
        best = int(before[lo - 1]) if lo > 0 else 0
        return max(best, int(after[hi])) if hi < len(self.profile) else best


def _merged(stay: np.ndarray, kept: np.ndarray, at: np.ndarray, added: np.ndarray) -> np.ndarray:
    """``kept`` at the places ``stay`` marks and ``added`` at places ``at`` (the others)."""
    out = np.empty(len(stay), np.int64)
    out[stay] = kept
    out[at] = added
    return out

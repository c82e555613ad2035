"""Bisection for ``max_batch``: the largest index of an ascending list of batch sizes that fits.

Fit is assumed monotone: if a batch does not fit, no larger one does.  The state is
a pair ``lo < hi``: index ``lo`` is known to fit (``-1``: none known), index ``hi``
is known not to (``len(values)``: none known).  Each round probes indices strictly
between them and narrows the pair, until ``hi == lo + 1`` and ``lo`` is the answer.
Probing ``width`` indices per round (one per free actor) needs about
``log(n) / log(width + 1)`` rounds; ``width = 1`` is plain bisection, about
``log2(n)`` probes against a linear scan's ``n``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


def probe_indices(lo: int, hi: int, width: int) -> tuple[int, ...]:
    """Up to ``width`` distinct indices evenly spaced strictly between ``lo`` and ``hi``.

    >>> probe_indices(-1, 8, 1), probe_indices(-1, 8, 2), probe_indices(3, 4, 2)
    ((3,), (2, 5), ())
    """
    span = hi - lo
    count = min(width, span - 1)
    return tuple(lo + span * j // (count + 1) for j in range(1, count + 1))


def narrow(lo: int, hi: int, outcomes: Mapping[int, bool]) -> tuple[int, int]:
    """The pair after probing: ``hi`` drops to the smallest misfit, ``lo`` rises to the largest fit below it.

    >>> narrow(-1, 8, {2: True, 5: False})
    (2, 5)
    """
    hi = min([hi, *(i for i, fits in outcomes.items() if not fits)])
    lo = max([lo, *(i for i, fits in outcomes.items() if fits and i < hi)])
    return lo, hi


def largest_fitting(count: int, fits: Callable[[int], bool], *, lo: int = -1, hi: int | None = None) -> int:
    """Sequential bisection: the largest index in ``[0, count)`` for which ``fits`` holds, ``-1`` if none.

    >>> largest_fitting(100, lambda i: i <= 41)
    41
    """
    hi = count if hi is None else hi
    while hi - lo > 1:
        (mid,) = probe_indices(lo, hi, 1)
        lo, hi = narrow(lo, hi, {mid: fits(mid)})
    return lo


@dataclass
class BatchChain:
    """The measured bisection of one settings combination, probed ``width`` indices per round.

    Mutable on purpose: the driver feeds it outcomes as actors finish.  ``combo`` is
    the combination's index in the driver's list; ``outcomes`` every probe answered.
    """

    combo: int
    lo: int
    hi: int
    width: int
    waiting: frozenset[int] = field(default=frozenset(), init=False)
    outcomes: dict[int, bool] = field(default_factory=dict, init=False)
    _round: dict[int, bool] = field(default_factory=dict, init=False, repr=False)

    @property
    def done(self) -> bool:
        return self.hi - self.lo <= 1 and not self.waiting

    def next_round(self) -> tuple[int, ...]:
        """The indices to probe next (empty when done); call once the previous round is answered."""
        assert not self.waiting, "the previous round is still being measured"
        probes = probe_indices(self.lo, self.hi, self.width)
        self.waiting = frozenset(probes)
        self._round = {}
        return probes

    def answer(self, index: int, fits: bool) -> bool:
        """Record one probe's outcome; True when this completes the round (the pair is narrowed)."""
        assert index in self.waiting, f"index {index} was not probed"
        self.outcomes[index] = fits
        self._round[index] = fits
        self.waiting = self.waiting - {index}
        if self.waiting:
            return False
        self.lo, self.hi = narrow(self.lo, self.hi, self._round)
        return True

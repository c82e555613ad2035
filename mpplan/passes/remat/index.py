"""What the budget search's evaluator (``mpplan.passes.remat.choice``) needs of a
``RematModel`` beyond the model, computed once per search: integer costs, step keys,
and each storage's live intervals for a placement of the recomputes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mpplan.errors import GraphError
from mpplan.passes.remat.model import NEVER, RematModel

__all__ = ["Intervals", "ModelIndex", "draw", "spans"]

Intervals = tuple[int, ...]
"""A storage's live intervals as inclusive step-key pairs ``(first, last, ...)``."""


@dataclass(frozen=True, slots=True, eq=False)
class ModelIndex:
    """What the evaluator needs of a ``RematModel`` beyond the model: computed once per
    search and shared by every ``Choice`` of it.

    ``span``: the step-key stride (module docstring); ``unit``: the common
    denominator (a power of two) that makes every candidate cost an integer
    ``cand_units[i]``; ``producers[i]``: candidates whose outputs candidate ``i``
    reads (the inverse of ``cand_consumers``); ``reads[i]``: storages whose
    ``readers`` include ``i``; ``op_keys``: the step key of every original op.
    """

    model: RematModel
    span: int
    unit: int
    cand_units: tuple[int, ...]
    producers: tuple[tuple[int, ...], ...]
    reads: tuple[tuple[int, ...], ...]
    op_keys: np.ndarray

    @classmethod
    def of(cls, model: RematModel) -> ModelIndex:
        """The index of ``model``; ``GraphError`` for a candidate cost that is not finite."""
        ratios = []
        for i, cost in enumerate(model.cand_cost):
            try:
                ratios.append(cost.as_integer_ratio())
            except (OverflowError, ValueError):
                name = model.graph.ops[model.cand_op[i]].name
                raise GraphError(f"op {name!r}: expected a finite cost, got {cost}; fix the graph") from None
        unit = max((den for _, den in ratios), default=1)
        producers: list[list[int]] = [[] for _ in model.cand_op]
        for p, consumers in enumerate(model.cand_consumers):
            for c in consumers:
                producers[c].append(p)
        reads: list[list[int]] = [[] for _ in model.cand_op]
        for j, readers in enumerate(model.readers):
            for h in readers:
                reads[h].append(j)
        span = model.num_candidates + 1
        return cls(
            model=model,
            span=span,
            unit=unit,
            cand_units=tuple(num * (unit // den) for num, den in ratios),
            producers=tuple(map(tuple, producers)),
            reads=tuple(map(tuple, reads)),
            op_keys=np.arange(model.num_ops, dtype=np.int64) * span + (span - 1),
        )

    def intervals(self, j: int, anchor: dict[int, int], moved: dict[int, int]) -> Intervals:
        """Storage ``j``'s live intervals when the recomputes run where ``anchor`` says,
        updated by ``moved`` (``NEVER``: not run); the rule of ``evaluate``."""
        m, span = self.model, self.span
        first = -1
        p = m.producer[j]
        if p >= 0:
            a = moved[p] if p in moved else anchor.get(p, NEVER)
            if a < NEVER:
                first = a * span + p
        if first >= 0:
            late_last = m.late_last[j]
            end = late_last * span + span - 1 if late_last >= 0 else first
        else:
            end = m.last[j] * span + span - 1
        for h in m.readers[j]:
            a = moved[h] if h in moved else anchor.get(h, NEVER)
            if a < NEVER and a * span + h > end:
                end = a * span + h
        start = m.start[j] * span + span - 1
        if first >= 0:
            return start, m.early_last[j] * span + span - 1, first, max(end, first)
        return start, end


def spans(
    intervals: list[Intervals] | dict[int, Intervals], storages: Iterable[int], size: tuple[int, ...]
) -> tuple[list[int], list[int], list[int]]:
    """``storages``' live intervals: their first keys, last keys and bytes."""
    firsts: list[int] = []
    lasts: list[int] = []
    sizes: list[int] = []
    for j in storages:
        spans = intervals[j]
        firsts += spans[::2]
        lasts += spans[1::2]
        sizes += [size[j]] * (len(spans) // 2)
    return firsts, lasts, sizes


def draw(keys: np.ndarray, intervals: list[Intervals], size: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The profile over ``keys`` of storages live over ``intervals``, and the bytes of
    those whose life starts at each step."""
    firsts, lasts, sizes = spans(intervals, range(len(intervals)), size)
    amount = np.array(sizes, np.int64)
    first = keys.searchsorted(firsts)
    delta = np.zeros(len(keys) + 1, np.int64)
    np.add.at(delta, first, amount)
    np.add.at(delta, keys.searchsorted(lasts) + 1, -amount)
    starts = np.zeros(len(keys), np.int64)
    np.add.at(starts, first, amount)
    return np.cumsum(delta[:-1]), starts

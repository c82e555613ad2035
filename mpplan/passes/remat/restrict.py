"""A cut program's sub-MILP with the fixed candidates substituted out, for the LNS
(``mpplan.passes.remat.cutlns2``).

``cutlns.fixed_columns`` fixes the option columns of the candidates outside a neighbourhood
by their bounds and hands HiGHS the whole program: on RL250 at 0.8 (2.2 million nonzeros)
converting it took 0.5 s and HiGHS's presolve 1.4-1.7 s of each 8 s sub-MILP, to reduce it
to a few thousand rows.  ``Restriction`` keeps the program's matrix once and, per
neighbourhood, substitutes the fixed columns' values into the rows, which HiGHS then
presolves in milliseconds.  A column is fixed when

* it is an option column ``y`` of a candidate outside the neighbourhood (1 for its chosen
  option, 0 for the others);
* it is a ``Z`` column of a candidate outside it and not recomputed (``Z <= r = 0``);
* it is an auxiliary whose lower bounds (``aux_bounds``) read fixed columns only: it takes
  the least value they allow, ``max(0, bounds)`` (at most 1), as ``cutexact.warm_point``
  sets it; a larger one is never needed, as auxiliaries only count bytes in memory rows.

Rows left with no free column are constants: they hold when the fixed point does (the
incumbent's), and the sub-MILP is infeasible otherwise.  The others keep their free terms,
their bounds shifted by the fixed terms.  ``expand`` maps the sub-MILP's columns back to the
program's, so an answer is the same point ``fixed_columns``' sub-MILP would give: the tests
hold both sub-MILPs' optima equal, and every expanded answer within the program's rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

import numpy as np

from mpplan.passes.remat.cutmilp import CutProgram

__all__ = ["Restriction", "SubMilp"]

#: Slack, in the rows' scaled units, within which a constant row counts as holding.
TOLERANCE = 1e-6


@dataclass(slots=True)
class SubMilp:
    """A restricted sub-MILP in ``ilp.MilpArrays``' form (mutable, as that protocol's fields
    are; nothing changes it); ``columns``: the program's
    column of each of its columns; ``values``: the program's point with the fixed columns
    set (the free ones 0), which ``Restriction.expand`` fills in."""

    cost: list[float]
    col_lo: list[float]
    col_hi: list[float]
    integer: list[bool]
    row_lo: list[float]
    row_hi: list[float]
    starts: list[int]
    index_nz: list[int]
    values_nz: list[float]
    columns: np.ndarray
    values: np.ndarray


class Restriction:
    """``program``'s matrix (its nonzeros, each with its row) and bounds as numpy arrays, made
    once; ``sub_milp`` per neighbourhood."""

    def __init__(self, program: CutProgram) -> None:
        self.program = program
        self.index = np.asarray(program.index_nz, dtype=np.int64)
        self.value = np.asarray(program.values_nz, dtype=float)
        self.row_of = np.repeat(np.arange(len(program.row_lo)), np.diff(np.asarray(program.starts)))  # per nonzero
        self.row_lo = np.asarray(program.row_lo, dtype=float)
        self.row_hi = np.asarray(program.row_hi, dtype=float)
        self.cost = np.asarray(program.cost, dtype=float)
        self.col_lo = np.asarray(program.col_lo, dtype=float)
        self.col_hi = np.asarray(program.col_hi, dtype=float)
        self.integer = np.asarray(program.integer, dtype=bool)

    def activity(self, point: np.ndarray) -> np.ndarray:
        """Every row's value at ``point`` (one value per column)."""
        return np.bincount(self.row_of, weights=self.value * point[self.index], minlength=len(self.row_lo))

    def sub_milp(self, chosen: Mapping[int, int], free: Set[int]) -> SubMilp | None:
        """The sub-MILP deciding the candidates in ``free`` with every other one held at
        ``chosen``'s decision (candidate -> option; the ``Z`` columns of one it recomputes stay
        free), or ``None`` when a constant row breaks (the fixed point is infeasible)."""
        program = self.program
        fixed = np.zeros(len(program.cost), dtype=bool)
        values = np.zeros(len(program.cost))
        for i, cols in enumerate(program.y_cols):
            if i in free:
                continue
            fixed[cols] = True
            if i in chosen:
                values[cols[chosen[i]]] = 1.0
            else:
                fixed[program.z_cols[i]] = True
        for aux, bounds in program.aux_bounds:
            if all(fixed[col] for expr, _ in bounds for col in expr):
                least = max([0.0, *(c0 + sum(v * values[col] for col, v in expr.items()) for expr, c0 in bounds)])
                fixed[aux], values[aux] = True, min(1.0, least)
        activity = self.activity(values)
        kept_cols = np.flatnonzero(~fixed)
        renumbered = np.cumsum(~fixed) - 1  # the sub-MILP's column of each free column
        kept = ~fixed[self.index]  # nonzeros on free columns, still in row order
        counts = np.bincount(self.row_of[kept], minlength=len(self.row_lo))
        alive = counts > 0
        lo, hi = self.row_lo - activity, self.row_hi - activity
        if np.any(lo[~alive] > TOLERANCE) or np.any(hi[~alive] < -TOLERANCE):
            return None
        starts = np.concatenate(([0], np.cumsum(counts[alive])))
        return SubMilp(
            cost=self.cost[kept_cols].tolist(), col_lo=self.col_lo[kept_cols].tolist(),
            col_hi=self.col_hi[kept_cols].tolist(), integer=self.integer[kept_cols].tolist(),
            row_lo=lo[alive].tolist(), row_hi=hi[alive].tolist(), starts=starts.tolist(),
            index_nz=renumbered[self.index[kept]].tolist(), values_nz=self.value[kept].tolist(), columns=kept_cols,
            values=values,
        )

    @staticmethod
    def restrict(sub: SubMilp, point: list[float]) -> list[float]:
        """The sub-MILP's columns of a program ``point`` (a warm start)."""
        return np.asarray(point, dtype=float)[sub.columns].tolist()

    @staticmethod
    def expand(sub: SubMilp, x: list[float]) -> list[float]:
        """The program's point for the sub-MILP's answer ``x``."""
        full = sub.values.copy()
        full[sub.columns] = x
        return full.tolist()

"""A MILP under construction: columns and rows in CSR, the form the HiGHS backends take.

Both remat MILPs (``formulation``: one cut per tensor; ``cutmilp``: cut points chosen)
build their columns, rows and auxiliary maxima the same way; only their variables and
memory rows differ.
"""

from __future__ import annotations

import math

__all__ = ["INF", "Expr", "SparseMilp", "add_into", "add_scaled"]

INF = math.inf

#: A linear expression: column index -> coefficient.
Expr = dict[int, float]


def add_scaled(a: Expr, b: Expr, scale: float = 1.0) -> Expr:
    """``a + scale * b``, a new expression."""
    out = dict(a)
    for col, coef in b.items():
        out[col] = out.get(col, 0.0) + scale * coef
    return out


def add_into(a: Expr, b: Expr, scale: float = 1.0) -> None:
    """``a += scale * b`` in place: a memory row sums one term per live storage, and copying
    it for each (``add_scaled``) made building RL250's double-drop program quadratic in a row's length."""
    for col, coef in b.items():
        a[col] = a.get(col, 0.0) + scale * coef


class SparseMilp:
    """Columns (cost, bounds, integrality) and rows in CSR, appended to while a subclass's
    ``__init__`` builds its MILP; ``aux_bounds`` lists every auxiliary maximum made."""

    def __init__(self) -> None:
        self.cost: list[float] = []
        self.col_lo: list[float] = []
        self.col_hi: list[float] = []
        self.integer: list[bool] = []
        self.row_lo: list[float] = []
        self.row_hi: list[float] = []
        self.starts: list[int] = [0]
        self.index_nz: list[int] = []
        self.values_nz: list[float] = []
        self.aux_bounds: list[tuple[int, list[tuple[Expr, float]]]] = []
        self._aux_cache: dict[tuple[tuple[tuple[tuple[int, float], ...], float], ...], int] = {}
        self._aux_seen: dict[tuple[tuple[tuple[tuple[int, float], ...], float], ...], int] = {}

    def built(self) -> None:
        """Drops ``aux``'s caches once the subclass's ``__init__`` has built the MILP: only the
        build reads them (``aux_bounds`` keeps what the restriction reads).  With ``cutmilp``'s
        caches dropped too, RL250 at 0.8's double-drop program holds 120 MiB once built, against
        214 MiB with them kept (``tracemalloc``)."""
        self._aux_cache.clear()
        self._aux_seen.clear()

    def column(self, cost: float, lo: float, hi: float, integer: bool = False) -> int:
        """A new column's index."""
        self.cost.append(cost)
        self.col_lo.append(lo)
        self.col_hi.append(hi)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, terms: Expr, lo: float, hi: float) -> None:
        """The row ``lo <= terms <= hi`` (zero coefficients dropped)."""
        for col, value in terms.items():
            if value:
                self.index_nz.append(col)
                self.values_nz.append(value)
        self.starts.append(len(self.index_nz))
        self.row_lo.append(lo)
        self.row_hi.append(hi)

    def aux(self, bounds: list[tuple[Expr, float]]) -> int:
        """A column in [0, 1] at least every ``expr + c0`` of ``bounds``; one per distinct set.

        Between two anchor points a storage's bounds repeat step after step (the anchor
        variables only change there), so sharing them keeps the MILP small.

        Most calls repeat a set built the same way, in the same order: ``_aux_seen`` finds those
        by their terms as given, before sorting them into the order-free key (RL250's double-drop
        program makes half a million calls; sorting each took a quarter of its build).
        """
        seen = tuple((tuple(expr.items()), c0) for expr, c0 in bounds)
        aux = self._aux_seen.get(seen)
        if aux is not None:
            return aux
        key = tuple(sorted((tuple(sorted(expr.items())), c0) for expr, c0 in bounds))
        aux = self._aux_cache.get(key)
        if aux is None:
            aux = self._aux_cache[key] = self.column(0.0, 0.0, 1.0)
            self.aux_bounds.append((aux, bounds))
            for expr, c0 in bounds:
                self.row(add_scaled({aux: 1.0}, expr, scale=-1.0), c0, INF)
        self._aux_seen[seen] = aux
        return aux

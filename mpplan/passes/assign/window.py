"""Exact re-packing of some records under a cap, every other record held where it is.

Why.  After recomputes the arena misses LOAD by a few percent on the random layered
graphs (RL1000's rewrite at the own order's aim: 1.035 of LOAD, where a plan at 0.8
needs 1.025), and the improving stages of ``offsets`` do not close it.  Re-packing all
records exactly is out of reach; re-packing a few of them, the others fixed, is a small
MILP that either finds offsets under the cap or *proves* that this neighbourhood has
none.  That tells which neighbourhoods are worth a search (``probe_remat_arena.py``
measures the records of a time window, and the records of the arena's top band).

The MILP (HiGHS, through the remat package's backend), in units of the gcd of the
sizes and offsets involved: one integer offset per free record, between the lowest
free offset (``base``: a free record does not sink below its neighbourhood) and
``cap`` minus its size, and within one of the gaps the held records leave it over its
lifetime (one binary per gap, an exact description of its domain: no big-M against held
records); per pair of free records that overlap in time one binary saying which lies
below the other.  No objective: any point is a packing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.sparse import INF, SparseMilp

__all__ = ["Repack", "repack_under"]


@dataclass(frozen=True, slots=True)
class Repack:
    """The outcome of ``repack_under``: ``offsets`` (every record, same order as the input;
    ``None`` unless ``status`` is ``packed``) and ``status``: ``packed``, ``infeasible``
    (proved: no offsets of the free records in ``[base, cap)`` miss the held ones),
    ``time_limit`` (undecided), ``error`` (the solver failed) or ``no_backend`` (no MILP
    solver installed)."""

    offsets: tuple[int, ...] | None
    status: str


def _overlap(first: Sequence[int], last: Sequence[int], i: int, j: int) -> bool:
    return first[i] <= last[j] and first[j] <= last[i]


def _domain(size: Sequence[int], first: Sequence[int], last: Sequence[int], offset: Sequence[int],
            held: Sequence[int], j: int, base: int, cap: int) -> list[tuple[int, int]]:
    """The offsets ``free`` record ``j`` may take among the held records: disjoint closed
    intervals within ``[base, cap - size[j]]``, lowest first (empty: no room at all)."""
    blocked = sorted((offset[k] - size[j] + 1, offset[k] + size[k] - 1) for k in held
                     if _overlap(first, last, j, k) and offset[k] + size[k] > base and offset[k] < cap)
    out: list[tuple[int, int]] = []
    low, high = base, cap - size[j]
    for a, b in blocked:
        if a > low:
            out.append((low, min(a - 1, high)))
        low = max(low, b + 1)
        if low > high:
            break
    if low <= high:
        out.append((low, high))
    return [(a, b) for a, b in out if a <= b]


class _RepackMilp(SparseMilp):
    """The MILP of the module docstring; ``columns[i]``: the offset of ``free[i]``;
    ``empty``: some free record has no room among the held ones (no MILP needed)."""

    def __init__(self, size: Sequence[int], first: Sequence[int], last: Sequence[int], offset: Sequence[int],
                 free: Sequence[int], held: Sequence[int], cap: int) -> None:
        super().__init__()
        base = min(offset[j] for j in free)
        m = cap - base  # the least big-M that both sides of every disjunction allow: a tighter relaxation
        domains = [_domain(size, first, last, offset, held, j, base, cap) for j in free]
        self.empty = not all(domains)
        self.columns = [self.column(0.0, d[0][0], d[-1][1], integer=True) for d in domains if d]
        if self.empty:
            return
        for x, domain in zip(self.columns, domains):
            if len(domain) > 1:  # one binary per gap among the held records: x lies in the chosen one
                picks = [self.column(0.0, 0.0, 1.0, integer=True) for _ in domain]
                self.row(dict.fromkeys(picks, 1.0), 1.0, 1.0)
                self.row({x: 1.0} | {u: -float(a) for u, (a, _) in zip(picks, domain)}, 0.0, INF)
                self.row({x: 1.0} | {u: -float(b) for u, (_, b) in zip(picks, domain)}, -INF, 0.0)
        for a, (x, i) in enumerate(zip(self.columns, free)):
            for y, j in zip(self.columns[a + 1:], free[a + 1:]):
                if _overlap(first, last, i, j):
                    below = self.column(0.0, 0.0, 1.0, integer=True)  # 1: i below j
                    self.row({x: 1.0, y: -1.0, below: m}, -INF, m - size[i])
                    self.row({y: 1.0, x: -1.0, below: -m}, -INF, -size[j])


def repack_under(
    sizes: Sequence[int],
    first: Sequence[int],
    last: Sequence[int],
    offsets: Sequence[int],
    free: Sequence[int],
    cap: int,
    time_limit_s: float,
) -> Repack:
    """New offsets for the records ``free`` (indices), each ending at or under ``cap`` and
    starting at or above the lowest of their current offsets, such that no two records
    overlapping in time (inclusive ranges ``first..last``) overlap in memory; every other
    record keeps its offset in ``offsets``.  Records of size 0 are ignored.

    >>> sizes, first, last, offsets = [4, 4, 4], [0, 2, 1], [1, 3, 2], [0, 4, 8]  # arena 12, LOAD 8
    >>> repack_under(sizes, first, last, offsets, [1, 2], 8, 5.0).status  # both above 4 at step 2
    'infeasible'
    >>> repack_under(sizes, first, last, offsets, [0, 1, 2], 8, 5.0).status
    'packed'
    """
    backend = available_backend()
    if backend is None:
        return Repack(None, "no_backend")
    free = [j for j in dict.fromkeys(free) if sizes[j]]  # a record named twice is one record
    if not free:
        return Repack(tuple(offsets), "packed")
    if min(offsets[j] for j in free) + max(sizes[j] for j in free) > cap:
        return Repack(None, "infeasible")
    chosen = set(free)
    held = [k for k in range(len(sizes)) if sizes[k] and k not in chosen]
    unit = math.gcd(*(sizes[j] for j in free + held), *(offsets[j] for j in free + held), cap)
    scaled = [s // unit for s in sizes], [o // unit for o in offsets]
    milp = _RepackMilp(scaled[0], first, last, scaled[1], free, held, cap // unit)
    if milp.empty:
        return Repack(None, "infeasible")
    status, x, _, _ = solve_arrays(milp, backend, time_limit_s)
    if status == "infeasible":
        return Repack(None, "infeasible")
    if x is None or status not in ("optimal", "time_limit"):
        return Repack(None, "time_limit" if status == "time_limit" else "error")
    out = list(offsets)
    for j, col in zip(free, milp.columns):
        out[j] = round(x[col]) * unit
    base = min(offsets[j] for j in free)
    if not _fits(sizes, first, last, out, free, base, cap):  # a point within the solver's tolerances only
        return Repack(None, "error")
    return Repack(tuple(out), "packed")


def _fits(sizes: Sequence[int], first: Sequence[int], last: Sequence[int], offsets: Sequence[int],
          free: Sequence[int], base: int, cap: int) -> bool:
    """Whether the ``free`` records lie in ``[base, cap)`` and miss every record live with them."""
    for j in free:
        if offsets[j] < base or offsets[j] + sizes[j] > cap:
            return False
        for k in range(len(sizes)):
            if k != j and sizes[k] and _overlap(first, last, j, k) \
                    and offsets[j] < offsets[k] + sizes[k] and offsets[k] < offsets[j] + sizes[j]:
                return False
    return True

"""The exact solver of remat's ``budget`` policy: a MILP over ``RematModel``'s memory model.

The MILP decides which candidates to recompute; everything else follows from the
rewrite rule of ``mpplan.passes.remat.model`` (a recompute runs right before the first
late reader of its outputs, recomputes before the same op in forward order), and
the constraints follow the peak of the rewritten as-given order exactly, so on
small graphs it agrees with brute force over every subset (the tests check it).

Variables (candidate ``i`` at position ``pos_i``; ``A_i``: the ops its recompute
may run before, i.e. its outputs' first late use and, below it, those of its
candidate consumers, recursively):

* ``r_i`` (binary): recompute ``i``.  Objective: minimise ``sum cost_i r_i``.
* ``z_{i,a}`` for ``a`` in ``A_i`` (continuous, integral at every vertex that
  matters): ``i`` is recomputed and runs before op ``a`` or earlier.  With
  ``z_{i,p} := z_{i,max{a in A_i: a <= p}}`` (0 when there is none) and
  ``z_{i,first_late_i} = r_i``, the anchor rule "before the first late reader,
  chosen consumers' recomputes included" is, for ``a < first_late_i``::

      z_{i,a} <= r_i,   z_{i,a} <= sum_c z_{c,a},   z_{i,a} >= z_{c,a} + r_i - 1   (c: consumers)

  ``e_i = z_{i,max A_i}`` says the recompute really happens (something late needs it).
* Liveness.  A step is a key ``(p, q)``: original op ``p`` is ``(p, inf)``; the
  recompute of ``i`` anchored at ``p`` is ``(p, pos_i)``.  The recompute of ``h``
  runs at or after key ``(p, q)`` exactly when ``e_h - z_{h,p}`` (``q = inf`` or
  ``pos_h < q``) or ``e_h - z_{h,p-1}`` (``pos_h >= q``) is 1.  Storage ``j`` made by
  candidate ``P`` (``P`` absent: a constant 0 for ``r_P``) is live at ``(p, q)``:

  - original: always from its producer through its last early use; until its last
    use only if kept (``1 - r_P``); after that only if kept and a chosen reader's
    recompute comes at or after the key (an auxiliary ``x >= ind_h - r_P``);
  - recomputed: from its recompute (``z_{P,p}``, or ``z_{P,p-1}`` when the key comes
    before ``P``'s own rank) through its last late use, and after that while a
    chosen reader's recompute is to come (``x >= start + ind_h - 1``), or at its
    own step (``x >= z_{P,p} - z_{P,p-1}``).

  Auxiliaries appear with positive sizes in ``<=`` rows, so lower bounds suffice.
* Rows: ``sum_j size_j live_j(key) <= budget - static`` at every original op and at
  every key ``(p, pos_h)`` where a storage ``h`` touches could die inside the run
  of recomputes before ``p``.  Any other recompute step holds no more than the
  next such key or op (a storage not dying in between stays live), and a key no
  recompute occupies holds no more than the step before it, so these rows are
  exactly "every step of the rewritten graph fits".  Rows that cannot exceed the
  budget even with every term at 1 are left out.

Sizes are scaled to keep coefficients small (the feasibility tolerance stays far
below a byte); every solution is re-scored by the exact integer model before use.
With ``budget=None`` the MILP minimises the peak instead (the smallest feasible
budget).  Backends: ``highspy`` (warm-started with the heuristic's answer), else
scipy's HiGHS (``scipy.optimize.milp``); ``available_backend`` says which.
"""

from __future__ import annotations

import bisect
import time

from mpplan.passes.remat.model import NEVER, RematModel
from mpplan.passes.remat.sparse import INF, SparseMilp

__all__ = ["INF", "MAX_NONZEROS", "MAX_Z_VARIABLES", "Formulation"]

#: Models needing more anchor variables or nonzeros than these are not built (the
#: heuristic decides): HiGHS's root node alone can then outlast any time limit.  The
#: Checkmate training graphs and 12-layer transformers fit; 30-layer ones and random
#: layered DAGs of 500+ ops (tensors reread long after their last use) do not.
MAX_Z_VARIABLES = 400_000
MAX_NONZEROS = 2_000_000

#: Sizes are divided by a unit of at most ``_MAX_UNIT`` bytes so the largest becomes about
#: ``_SIZE_SCALE``: small coefficients, yet HiGHS's feasibility tolerance (1e-6 scaled)
#: stays under half a byte, so a row that passes holds in integer bytes.
_SIZE_SCALE = 4096.0
_MAX_UNIT = float(1 << 18)


class Formulation(SparseMilp):
    """The MILP of one solve: columns, rows (CSR) and the maps back to candidates.

    Mutable while ``__init__`` builds it, private to one ``solve`` call.
    """

    def __init__(self, model: RematModel, dyn_budget: int | None, deadline: float | None = None) -> None:
        super().__init__()
        self.model = model
        #: Over ``MAX_*``, or (``out_of_time``) not built by ``deadline`` (a ``time.perf_counter``
        #: reading): the solve would have no time left, and a build can outlast the limit.
        self.too_large = self.out_of_time = False
        self.deadline = deadline
        m = model.num_candidates
        self.unit = min(_MAX_UNIT, max(1.0, max(model.size, default=1) / _SIZE_SCALE))
        costs = model.cand_cost
        self.objective_scale = max((c for c in costs), default=1.0) or 1.0
        self.lower_dyn = max(0, model.lower_bound() - model.static_bytes)
        self.anchors = _anchor_sets(model)
        if sum(len(a) for a in self.anchors) > MAX_Z_VARIABLES:
            self.too_large = True
            return
        minimise_peak = dyn_budget is None
        self.r_col = [self.column(0.0 if minimise_peak else costs[i] / self.objective_scale, 0, 1, True)
                      for i in range(m)]
        self.z_cols: list[list[int]] = []
        for i in range(m):
            first_late = model.cand_first_late[i]
            self.z_cols.append([self.r_col[i] if a == first_late else self.column(0.0, 0, 1) for a in self.anchors[i]])
        self.m_col = self.column(1.0, self.lower_dyn / self.unit, INF) if minimise_peak else -1
        self.limit = INF if dyn_budget is None else (dyn_budget + 0.5) / self.unit
        self._anchor_rows()
        self._memory_rows()
        self.built()

    # -- building blocks

    def z(self, i: int, p: int) -> int | None:
        """The column of ``z_{i,p}``, or ``None`` when it is 0."""
        k = bisect.bisect_right(self.anchors[i], p) - 1
        return None if k < 0 else self.z_cols[i][k]

    def effective(self, i: int) -> int:
        return self.z_cols[i][-1]

    def after(self, h: int, p: int, q: int | None) -> dict[int, float] | None:
        """``ind``: the recompute of ``h`` runs at or after key ``(p, q)``; ``None`` if never."""
        at = p - 1 if q is not None and self.model.cand_op[h] >= q else p
        if self.anchors[h][-1] <= at:
            return None
        expr = {self.effective(h): 1.0}
        col = self.z(h, at)
        if col is not None:
            expr[col] = expr.get(col, 0.0) - 1.0
        return expr

    # -- the rows

    def _anchor_rows(self) -> None:
        model = self.model
        for i in range(model.num_candidates):
            first_late = model.cand_first_late[i]
            r = self.r_col[i]
            for a, zc in zip(self.anchors[i], self.z_cols[i]):
                if a == first_late:
                    continue
                below = [c for c in (self.z(j, a) for j in model.cand_consumers[i]) if c is not None]
                self.row({zc: 1.0, r: -1.0}, -INF, 0.0)
                terms = {zc: 1.0}
                for c in below:
                    terms[c] = terms.get(c, 0.0) - 1.0
                self.row(terms, -INF, 0.0)
                for c in below:
                    self.row({zc: 1.0, c: -1.0, r: -1.0}, -1.0, INF)

    def _memory_rows(self) -> None:
        model = self.model
        n = model.num_ops
        anchors = self.anchors
        live_at: list[list[int]] = [[] for _ in range(n)]
        for j, size in enumerate(model.size):
            if not size:
                continue
            end = model.last[j]
            for h in model.readers[j]:
                end = max(end, anchors[h][-1])
            p = model.producer[j]
            if p >= 0:
                end = max(end, anchors[p][-1])
            for step in range(model.start[j], min(end, n - 1) + 1):
                live_at[step].append(j)
        keys: list[tuple[int, int | None]] = [(p, None) for p in range(n)]
        for h in range(model.num_candidates):
            touched = list(model.cand_inputs[h]) + list(model.cand_outputs[h])
            for a in anchors[h]:
                if any(model.last[j] < a or (model.producer[j] >= 0 and model.late_last[j] < a) for j in touched):
                    keys.append((a, model.cand_op[h]))
        for p, q in keys:
            self._memory_row(p, q, live_at[p])
            if len(self.values_nz) > MAX_NONZEROS:
                self.too_large = True
                return
            if self.deadline is not None and time.perf_counter() > self.deadline:
                self.too_large = self.out_of_time = True
                return

    def _memory_row(self, p: int, q: int | None, storages: list[int]) -> None:
        model = self.model
        unit = self.unit
        const = 0.0
        terms: dict[int, float] = {}
        pending: list[tuple[float, list[tuple[dict[int, float], float]]]] = []
        upper = 0.0
        for j in storages:
            size = model.size[j] / unit
            born_later = model.start[j] > p or (model.start[j] == p and q is not None)
            versions = (None if born_later else self._original(j, p, q),
                        None if model.producer[j] < 0 else self._recomputed(j, p, q))
            for contribution in versions:
                if contribution is None:
                    continue
                tag, body = contribution
                upper += size
                if tag == "const":
                    const += size
                elif tag == "literal":
                    expr, c0 = body
                    const += size * c0
                    for col, coef in expr.items():
                        terms[col] = terms.get(col, 0.0) + size * coef
                else:
                    pending.append((size, body))
        if upper <= self.limit and self.m_col < 0:
            return
        if self.m_col >= 0 and upper <= self.lower_dyn / unit:
            return
        for size, bounds in pending:
            aux = self.aux(bounds)
            terms[aux] = terms.get(aux, 0.0) + size
        if self.m_col >= 0:
            terms[self.m_col] = terms.get(self.m_col, 0.0) - 1.0
            self.row(terms, -INF, -const)
        else:
            self.row(terms, -INF, self.limit - const)

    def _original(self, j: int, p: int, q: int | None):
        """Liveness of storage ``j``'s original at ``(p, q)``: ``None`` (0), a constant,
        an affine literal ``(expr, const)``, or lower bounds for an auxiliary."""
        model = self.model
        producer = model.producer[j]
        early_end = model.early_last[j] if producer >= 0 else model.last[j]
        if p <= early_end:
            return ("const", None)
        r = self.r_col[producer] if producer >= 0 else None
        if p <= model.last[j]:
            return ("literal", ({r: -1.0}, 1.0)) if r is not None else ("const", None)
        bounds = []
        for h in model.readers[j]:
            ind = self.after(h, p, q)
            if ind is None:
                continue
            expr = dict(ind)
            if r is not None:
                expr[r] = expr.get(r, 0.0) - 1.0
            bounds.append((expr, 0.0))
        return ("aux", bounds) if bounds else None

    def _recomputed(self, j: int, p: int, q: int | None):
        """Liveness of storage ``j``'s recompute at ``(p, q)`` (see ``_original``)."""
        model = self.model
        producer = model.producer[j]
        own = model.cand_op[producer]
        start = self.z(producer, p if q is None or own <= q else p - 1)
        if start is None:
            return None
        if p <= model.late_last[j]:
            return ("literal", ({start: 1.0}, 0.0))
        bounds = []
        for h in model.readers[j]:
            ind = self.after(h, p, q)
            if ind is None:
                continue
            expr = dict(ind)
            expr[start] = expr.get(start, 0.0) + 1.0
            bounds.append((expr, -1.0))
        if q == own:
            expr = {self.z(producer, p): 1.0}  # type: ignore[dict-item]
            previous = self.z(producer, p - 1)
            if previous is not None:
                expr[previous] = expr.get(previous, 0.0) - 1.0
            bounds.append((expr, 0.0))
        return ("aux", bounds) if bounds else None


def _anchor_sets(model: RematModel) -> list[list[int]]:
    """``A_i`` for every candidate, last candidate first (consumers come later)."""
    m = model.num_candidates
    anchors: list[list[int]] = [[] for _ in range(m)]
    total = 0
    for i in reversed(range(m)):
        first_late = model.cand_first_late[i]
        found = {first_late} if first_late < NEVER else set()
        for c in model.cand_consumers[i]:
            found.update(a for a in anchors[c] if a < first_late)
        anchors[i] = sorted(found)
        total += len(found)
        if total > MAX_Z_VARIABLES:
            break
    return anchors

"""The exact reference for cut points: a MILP that chooses the recomputes *and* where each
recomputed tensor's late region starts (``RematRecord.from_op``).

``mpplan.passes.remat.formulation`` decides which candidates to recompute with every cut
fixed; ``mpplan.passes.remat.cuts`` picks cuts by a rule and then runs that search.  Here
the cut is a decision: for candidate ``i`` an *option* ``o`` fixes, for each output,
the reader after an idle gap of at least ``MIN_GAP`` steps at which its late region
starts (outputs without such a gap keep the rule's split), or, for the few candidates
``link_candidates`` names, no reader at all: a *chain link* whose recompute only later
recomputes read (``from_op`` ``RECOMPUTES_ONLY``), so the original is not held until them.
These are the choices of ``apply_recompute(graph, ops, from_ops)`` in one round (chain
links for those candidates only).  The model covers graphs
without a backward pass, in-place writes or views (the random layered graphs); others
get ``None`` from ``cut_options`` and are left to the other solvers.

Variables:

* ``y_{i,o}`` (binary): recompute ``i`` cut at option ``o``; ``r_i = sum_o y_{i,o} <= 1``;
  objective ``sum cost_i r_i``.
* ``Z_{i,a}`` for ``a`` in ``A_i`` (the first late uses of ``i``'s options and the anchors
  of its candidate consumers below them, all of them when ``i`` may be a chain link):
  ``i``'s recompute has run by op ``a``
  (``Z_{i,p}`` := ``Z`` at the largest anchor ``<= p``, 0 below the first).  It runs
  before the first late use of its option or the first chosen consumer recompute,
  whichever comes first::

      Z_{i,a} >= sum_{o: late_o <= a} y_{i,o},   Z_{i,a} >= Z_{c,a} + r_i - 1,
      Z_{i,a} <= sum_{o: late_o <= a} y_{i,o} + sum_c Z_{c,a},   Z_{i,a} <= r_i

* Liveness at a step *key*: op ``p`` is ``(p, None)``; the recompute of ``q`` run before
  op ``p`` is ``(p, q)`` (recomputes before one op run in forward order).  A recompute
  ``h`` runs at or after the key when ``r_h - Z_{h,p}`` is 1 (``Z_{h,p-1}`` when ``h``
  does not run before ``q``).  Storage ``j`` of candidate ``i``: its original lives
  from its producer through ``1 - sum_{o: early_last_{j,o} < p} y_{i,o}`` while
  ``p <= last_j``, and after that while ``i`` is kept and a reading recompute is to
  come; its recompute from ``i``'s step through its last use (not for a chain link) and
  any later reading recompute (an output nobody reads late, its op's other output, lives
  for ``i``'s step alone, as ``apply_recompute`` re-makes it).  Auxiliaries take the "or" of those
  lower bounds.
* Rows: ``sum size_j live_j <= budget`` at every op and, relaxed by ``M (1 - x)`` when the
  recompute ``q`` does not run before ``p`` (``x = Z_{q,p} - Z_{q,p-1}``), at every
  ``(p, q)`` with ``p`` in ``A_q``: every step of the rewritten order fits.

``mpplan.passes.remat.cutexact`` solves it; the tests hold it equal to brute force over
every subset and every cut on tiny graphs, and the heuristic (``cuts``) never below it.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from dataclasses import dataclass

from mpplan.graph import Graph
from mpplan.passes.remat.formulation import MAX_NONZEROS, MAX_Z_VARIABLES
from mpplan.passes.remat.model import MIN_GAP, NEVER, RematModel, storage_users
from mpplan.passes.remat.sparse import INF, Expr, SparseMilp, add_into, add_scaled

__all__ = ["MAX_LINKS", "MAX_OPTIONS", "CutOption", "CutProgram", "Expr", "cut_options", "link_candidates"]

#: A candidate with more options than this (a product over many outputs) is not modelled.
MAX_OPTIONS = 64

#: Chain links are offered to this many candidates, those freeing the most bytes per unit of
#: cost: a link's anchors are all of its consumers', so links on every candidate grew RL250's
#: double-drop program tenfold (21 million nonzeros, built in 107 s instead of 6 s).
MAX_LINKS = 16


@dataclass(frozen=True, slots=True)
class CutOption:
    """One way to recompute a candidate: ``cuts`` (tensor id -> first late position),
    ``early_last`` (per output storage index: its last early use) and ``first_late`` (the
    first late use of any output; ``NEVER`` when none, a recompute only chains need)."""

    cuts: tuple[tuple[int, int], ...]
    early_last: tuple[tuple[int, int], ...]
    first_late: int

    @property
    def is_link(self) -> bool:
        """Whether it is a chain link: its outputs' late regions start past every op."""
        return any(cut == NEVER for _, cut in self.cuts)


def cut_options(model: RematModel) -> list[list[CutOption]] | None:
    """Every candidate's options, or ``None`` when the graph is outside the model (a
    backward pass, in-place writes, views, or too many options for one candidate)."""
    graph: Graph = model.graph
    if model.training or any(op.in_place for op in graph.ops) or any(t.alias_of for t in graph.tensors):
        return None
    uses = storage_users(graph)
    links = link_candidates(model)
    found: list[list[CutOption]] = []
    for i, outputs in enumerate(model.cand_outputs):
        per_output: list[list[tuple[int, int, int, int]]] = []
        for j in outputs:
            u = uses[model.storage_tensor[j]]
            gaps = [(j, b, a, b) for a, b in itertools.pairwise(u) if b - a >= MIN_GAP]
            per_output.append(gaps or [(j, -1, model.early_last[j], NEVER)])
        combos = list(itertools.islice(itertools.product(*per_output), MAX_OPTIONS + 1))
        if len(combos) > MAX_OPTIONS:
            return None
        if i in links:
            # a chain link: every use reads the original, only recomputes read the recompute
            combos.append(tuple((j, NEVER, model.last[j], NEVER) if late < NEVER else (j, cut, early, late)
                                for j, cut, early, late in combos[0]))
        found.append([
            CutOption(
                tuple((model.storage_tensor[j], cut) for j, cut, _, _ in combo if cut >= 0),
                tuple((j, early) for j, _, early, _ in combo),
                min((late for *_, late in combo), default=NEVER),
            )
            for combo in combos
        ])
    return found


def link_candidates(model: RematModel) -> set[int]:
    """The candidates offered a chain link: of those other candidates read and with an output
    read late, the ``MAX_LINKS`` whose outputs hold the most bytes per unit of cost (a free
    recompute first)."""
    read = [i for i in range(model.num_candidates)
            if model.cand_consumers[i] and any(model.split[j] < NEVER for j in model.cand_outputs[i])]
    freed = {i: sum(model.size[j] for j in model.cand_outputs[i]) for i in read}
    return set(sorted(read, key=lambda i: (-freed[i] / max(model.cand_cost[i], 1e-9), i))[:MAX_LINKS])


class CutProgram(SparseMilp):
    """The MILP's columns and rows (CSR), built once for one budget; mutable only while
    ``__init__`` builds it.  ``too_large`` when it would outgrow ``max_nonzeros``, or when
    ``stop`` is set while it builds (a build in a thread that is cancelled, ``programbuild``)."""

    def __init__(self, model: RematModel, options: list[list[CutOption]], dyn_budget: int,
                 max_nonzeros: int = MAX_NONZEROS, stop: threading.Event | None = None) -> None:
        super().__init__()
        self.max_nonzeros = max_nonzeros
        self.model, self.options = model, options
        self.unit = max(1.0, max(model.size, default=1) / 4096.0)
        self.limit = (dyn_budget + 0.5) / self.unit
        self.too_large = False
        scale = max(model.cand_cost, default=1.0) or 1.0
        self.y_cols = [[self._column(model.cand_cost[i] / scale, True) for _ in opts] for i, opts in enumerate(options)]
        self.r = [{c: 1.0 for c in cols} for cols in self.y_cols]
        for r in self.r:
            self.row(r, -INF, 1.0)
        self._later_cache: dict[tuple[int, int, int, int], Expr] = {}
        # per candidate and output storage, each option's last early use (``_original`` reads them per step)
        self._early_last = [{j: [dict(o.early_last)[j] for o in opts] for j in model.cand_outputs[i]}
                            for i, opts in enumerate(options)]
        # per candidate, minus its chain-link options' columns (a link cuts every output read late)
        self._links = [{self.y_cols[i][k]: -1.0 for k, o in enumerate(opts) if o.is_link}
                       for i, opts in enumerate(options)]
        self.anchors = self._anchor_sets()
        if sum(map(len, self.anchors)) > MAX_Z_VARIABLES:
            self.too_large = True
            return
        self.z_cols = [[self._column(0.0) for _ in a] for a in self.anchors]
        self._anchor_rows()
        self._memory_rows(stop)
        self.built()

    def built(self) -> None:
        """``SparseMilp.built``, and the build's own caches: ``_later``'s, the options' early uses
        and chain links."""
        super().built()
        self._later_cache.clear()
        self._early_last.clear()
        self._links.clear()

    def _column(self, cost: float, integer: bool = False) -> int:
        return self.column(cost, 0.0, 1.0, integer)

    def _anchor_sets(self) -> list[list[int]]:
        model = self.model
        anchors: list[list[int]] = [[] for _ in self.options]
        for i in reversed(range(len(self.options))):
            if not self.options[i]:
                continue  # never recomputed (a neighbourhood's fixed candidate): no anchor variables
            own = {o.first_late for o in self.options[i] if o.first_late < NEVER}
            latest = NEVER if any(o.first_late == NEVER for o in self.options[i]) else max(own, default=-1)
            below = {a for c in model.cand_consumers[i] for a in anchors[c] if a < latest}
            anchors[i] = sorted(own | below)
        return anchors

    def z(self, i: int, p: int) -> Expr:
        """``Z_{i,p}`` as an expression (empty: 0)."""
        k = bisect.bisect_right(self.anchors[i], p) - 1
        return {} if k < 0 else {self.z_cols[i][k]: 1.0}

    def _anchor_rows(self) -> None:
        for i, anchors in enumerate(self.anchors):
            previous: Expr = {}
            for a, col in zip(anchors, self.z_cols[i]):
                own = {self.y_cols[i][k]: 1.0 for k, o in enumerate(self.options[i]) if o.first_late <= a}
                below = [self.z(c, a) for c in self.model.cand_consumers[i]]
                self.row(add_scaled({col: 1.0}, own, scale=-1.0), 0.0, INF)
                self.row(add_scaled({col: 1.0}, self.r[i], scale=-1.0), -INF, 0.0)
                self.row(add_scaled({col: 1.0}, previous, scale=-1.0), 0.0, INF)
                upper = add_scaled({col: 1.0}, own, scale=-1.0)
                for zc in below:
                    upper = add_scaled(upper, zc, scale=-1.0)
                    if zc:
                        self.row(add_scaled(add_scaled({col: 1.0}, zc, scale=-1.0), self.r[i], scale=-1.0), -1.0, INF)
                self.row(upper, -INF, 0.0)
                previous = {col: 1.0}

    def _later(self, h: int, p: int, before: bool, kept: int = -1, started: int = -1) -> Expr:
        """1 when recompute ``h`` runs at or after the key; ``before``: ``h`` runs before the
        key's own recompute at ``p`` (so ``Z_{h,p}`` counts it as done); less ``r_kept`` and
        plus column ``started`` when given (``_original``'s and ``_recomputed``'s bounds).
        Between two anchors of ``h`` it repeats step after step: it is made once and shared,
        never mutated (RL250's double-drop program asks for it a million times)."""
        k = bisect.bisect_right(self.anchors[h], p if before else p - 1) - 1
        key = (h, k, kept, started)
        expr = self._later_cache.get(key)
        if expr is None:
            expr = add_scaled(self.r[h], {} if k < 0 else {self.z_cols[h][k]: 1.0}, scale=-1.0)
            if kept >= 0:
                expr = add_scaled(expr, self.r[kept], scale=-1.0)
            if started >= 0:
                expr = add_scaled(expr, {started: 1.0})
            self._later_cache[key] = expr
        return expr

    def _end(self, j: int) -> int:
        """The last op position at which storage ``j`` (any version) can be live.  A recompute
        re-makes every output of its op, one nobody reads late too: that one lives for the
        recompute's own step, so the span covers its producer's keys."""
        model = self.model
        makers = (*model.readers[j], *((model.producer[j],) if model.producer[j] >= 0 else ()))
        ends: list[int] = [model.last[j], *(self.anchors[h][-1] for h in makers if self.anchors[h])]
        return max(ends)

    def _steps(self) -> list[tuple[int, int | None, Expr]]:
        """Every step of the rewritten order as ``(p, q, runs)``: op ``p`` (``q`` None) or the
        recompute of ``q`` before it, which runs when the expression ``runs`` is 1."""
        steps: list[tuple[int, int | None, Expr]] = [(p, None, {}) for p in range(self.model.num_ops)]
        steps += [(a, q, add_scaled(self.z(q, a), self.z(q, a - 1), scale=-1.0))
                  for q, anchors in enumerate(self.anchors) for a in anchors]
        return steps

    def _versions(self, j: int, p: int, q: int | None) -> list[float | list[tuple[Expr, float]] | None]:
        """Storage ``j``'s copies at step ``(p, q)``: each 1.0, a list of lower bounds whose
        "or" says it is live, or ``None`` (never live there)."""
        return [self._original(j, p, q), self._recomputed(j, p, q)]

    def _fixed(self, j: int) -> bool:
        """Whether storage ``j`` is live from its first use through its last whatever is chosen:
        no candidate that makes or reads it has an option (a neighbourhood's fixed candidates,
        ``cutwindow``), so it is a constant of every row it spans."""
        model, options = self.model, self.options
        i = model.producer[j]
        return (i < 0 or not options[i]) and not any(options[h] for h in model.readers[j])

    def _memory_rows(self, stop: threading.Event | None) -> None:
        """One row a step where what it may hold can pass the budget; stops (``too_large``)
        past ``max_nonzeros`` or once ``stop`` is set."""
        model = self.model
        fixed, born = [0] * (model.num_ops + 1), [0] * model.num_ops  # fixed bytes per op; those first used there
        live: list[list[int]] = [[] for _ in range(model.num_ops)]  # per op, the other storages its steps may hold
        for j, nbytes in enumerate(model.size):
            if nbytes and self._fixed(j):
                fixed[model.start[j]] += nbytes
                fixed[model.last[j] + 1] -= nbytes
                born[model.start[j]] += nbytes
            elif nbytes:
                for p in range(model.start[j], min(self._end(j), model.num_ops - 1) + 1):
                    live[p].append(j)
        held = list(itertools.accumulate(fixed))
        for p, q, runs in self._steps():
            terms: Expr = {}
            const = upper = (held[p] - (born[p] if q is not None else 0)) / self.unit
            for j in live[p]:
                if q is not None and model.start[j] == p:
                    continue
                size = model.size[j] / self.unit
                for version in self._versions(j, p, q):
                    if version is None:
                        continue
                    upper += size
                    if isinstance(version, float):
                        const += size * version
                    elif len(version) == 1 and version[0][1] == 0.0 and all(v > 0 for v in version[0][0].values()):
                        add_into(terms, version[0][0], scale=size)  # a sum of columns: no auxiliary
                    elif len(version) == 1 and version[0][1] == 1.0 and all(v < 0 for v in version[0][0].values()):
                        const += size  # 1 - a sum of columns at most 1: no auxiliary
                        add_into(terms, version[0][0], scale=size)
                    else:
                        add_into(terms, {self.aux(version): size})
            if upper <= self.limit:
                continue
            big = 0.0
            if q is not None:  # binds only where the step runs: + big * runs <= big
                big = upper - self.limit
                terms = add_scaled(terms, runs, scale=big)
            self.row(terms, -INF, self.limit + big - const)
            if len(self.values_nz) > self.max_nonzeros or (stop is not None and stop.is_set()):
                self.too_large = True
                return

    def _original(self, j: int, p: int, q: int | None) -> float | list[tuple[Expr, float]] | None:
        model = self.model
        i = model.producer[j]
        if p <= model.last[j]:
            if i < 0:
                return 1.0
            gone = {self.y_cols[i][k]: -1.0 for k, early in enumerate(self._early_last[i][j]) if early < p}
            return [(gone, 1.0)] if gone else 1.0
        bounds = [(self._later(h, p, q is None or h < q, kept=i), 0.0) for h in model.readers[j] if self.anchors[h]]
        return bounds or None

    def _recomputed(self, j: int, p: int, q: int | None) -> float | list[tuple[Expr, float]] | None:
        model = self.model
        i = model.producer[j]
        if i < 0:
            return None
        started = self.z(i, p if q is None or i <= q else p - 1)
        if not started:
            return None
        links = self._links[i]
        if p <= model.late_last[j] and not links:
            return [(started, 0.0)]
        (column,) = started
        bounds = [(self._later(h, p, q is None or h < q, started=column), -1.0) for h in model.readers[j]
                  if self.anchors[h]]
        if p <= model.late_last[j]:  # live to a late use unless the option chosen is a chain link
            bounds.append((add_scaled(started, links), 0.0))
        if q == i:  # its own step, read by nothing late (only chained recomputes read it)
            bounds.append((add_scaled(self.z(i, p), self.z(i, p - 1), scale=-1.0), 0.0))
        return bounds or None


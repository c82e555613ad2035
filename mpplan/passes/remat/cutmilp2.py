"""The cut MILP (``mpplan.passes.remat.cutmilp``) with double drops: a tensor freed across two
of its idle gaps, recomputed after each (``cutmulti.Drop``), as a decision of the MILP.

A double drop of candidate ``i`` (one output ``j``, uses ``u``) is the pair of gaps
``(a1, b1)``, ``(a2, b2)`` of ``u`` (``b1 <= a2``, each of at least ``MIN_GAP`` steps):
``apply_recompute`` of ``F`` cut at ``b1`` and then ``F@recompute`` cut at ``b2`` keeps the
original through ``a1``, a first copy from its recompute ``R1`` before ``b1`` through ``a2``
and a second copy from ``R2`` right before ``b2`` (after every first-round recompute placed
there; second-round recomputes before one op run in the order of their ``R1``, that is of
``(b1, i)``) through ``u[-1]``; ``R2`` reads ``i``'s inputs again, so they live until it
has run.  Each recompute costs ``F``'s cost.

The model is ``CutProgram``'s with, for such an ``i``, an option per pair: its ``y`` column
costs twice, it shares its one-drop option's cut at ``b1`` (so ``Z``, the anchors and the
original's early death are ``cutmilp``'s), and

* the first copy's lower bounds lose ``sum_{o: a2_o < p} y_{i,o}`` (it dies after ``a2``);
* the second copy is live at a step when an option whose ``R2`` has run by then is chosen
  (a sum of ``y`` columns);
* an input storage of ``i`` whose last use has passed stays live while an option whose
  ``R2`` is still to come is chosen (its span, ``CutProgram._end``, reaches ``b2``: the
  first late use of ``i``'s one-drop option cut there, so one of ``i``'s anchors);
* a step ``(b2, R2 of (i, b1))`` has its memory row, relaxed unless that option is chosen.

*Scope.*  A double drop whose recomputes would read or feed other recomputes (``R2`` reading
a recomputed input, a recomputed consumer reading either copy) is not modelled: a double
option excludes recomputing ``i``'s candidate consumers and the candidates producing its
inputs (``y_{i,o} + r_c <= 1``).  So the optimum is over one-drop answers (all of them) and
double drops of tensors whose neighbours are not recomputed; its proved bound is a bound
for that family, not for double drops in chains.  The tests hold the optimum equal to a
brute force over the same family on tiny graphs; ``cutexact.solve_program`` solves it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from mpplan.passes.remat.cutmilp import CutOption, CutProgram, cut_options
from mpplan.passes.remat.cutmulti import Drop, joint_names
from mpplan.passes.remat.formulation import MAX_NONZEROS
from mpplan.passes.remat.model import MIN_GAP, RematModel, storage_users
from mpplan.passes.remat.rewriting import cut_name
from mpplan.passes.remat.sparse import Expr, add_scaled

__all__ = ["Double", "DoubleProgram", "double_names", "double_program", "doubles_of", "neighbours"]


@dataclass(frozen=True, slots=True)
class Double:
    """A double-drop option: one-drop option ``first`` (cut at ``b1``) and the second cut
    ``b2`` after the use ``a2`` (the first copy's last use)."""

    first: int
    b1: int
    a2: int
    b2: int


def doubles_of(model: RematModel, options: list[list[CutOption]]) -> list[list[Double]]:
    """Per candidate, its double-drop options (single-output candidates with two gaps or
    more), in ``cutmulti.drops_of``'s order."""
    uses = storage_users(model.graph)
    found: list[list[Double]] = []
    for i, outputs in enumerate(model.cand_outputs):
        if len(outputs) != 1:
            found.append([])
            continue
        s = model.storage_tensor[outputs[0]]
        u = uses[s]
        gaps = [(a, b) for a, b in zip(u, u[1:]) if b - a >= MIN_GAP]
        first = {dict(o.cuts).get(s, -1): k for k, o in enumerate(options[i])}
        found.append([Double(first[b1], b1, a2, b2) for n, (_, b1) in enumerate(gaps) for a2, b2 in gaps[n + 1:]
                      if b1 in first])
    return found


def neighbours(model: RematModel, i: int) -> set[int]:
    """The candidates a double drop of ``i`` excludes: its candidate consumers and the
    candidates producing its inputs."""
    made = {model.producer[k] for k, readers in enumerate(model.readers) if i in readers}
    return (set(model.cand_consumers[i]) | made) - {-1, i}


class DoubleProgram(CutProgram):
    """``CutProgram`` with double-drop options (module docstring): ``options[i]`` lists the
    one-drop options and then, from ``singles[i]`` on, one per ``doubles[i]`` entry."""

    def __init__(self, model: RematModel, options: list[list[CutOption]], dyn_budget: int,
                 max_nonzeros: int = MAX_NONZEROS, stop: threading.Event | None = None) -> None:
        self.doubles = doubles_of(model, options)
        self.singles = [len(o) for o in options]
        n = len(options)
        # Second recomputes' steps: (b2, candidate, b1), encoded as q = n + index.
        self.seconds = sorted({(d.b2, i, d.b1) for i, ds in enumerate(self.doubles) for d in ds})
        self.second_index = {key: n + k for k, key in enumerate(self.seconds)}
        self._double_cache: dict[int, list[tuple[int, Double]]] = {}  # _double_cols, read per step
        super().__init__(model, [o + [o[d.first] for d in ds] for o, ds in zip(options, self.doubles)], dyn_budget,
                         max_nonzeros, stop)
        self._double_cache.clear()  # read only by the memory rows, built by now
        if self.too_large:
            return
        for i, ds in enumerate(self.doubles):
            cols = self.y_cols[i][self.singles[i]:]
            for col in cols:
                self.cost[col] *= 2.0
                for c in neighbours(model, i):
                    self.row(add_scaled({col: 1.0}, self.r[c]), -1.0, 1.0)

    def _double_cols(self, i: int) -> list[tuple[int, Double]]:
        cols = self._double_cache.get(i)
        if cols is None:
            cols = self._double_cache[i] = list(zip(self.y_cols[i][self.singles[i]:], self.doubles[i]))
        return cols

    def _steps(self) -> list[tuple[int, int | None, Expr]]:
        steps = super()._steps()
        for b2, i, b1 in self.seconds:
            runs = {col: 1.0 for col, d in self._double_cols(i) if (d.b1, d.b2) == (b1, b2)}
            steps.append((b2, self.second_index[(b2, i, b1)], runs))
        return steps

    def _done(self, i: int, d: Double, p: int, q: int | None, own: bool) -> bool:
        """Whether ``i``'s second recompute for ``d`` has run by step ``(p, q)``; ``own``: at
        that recompute's own step too (its output is live there, its inputs still read)."""
        if q is None or q < len(self.options):
            return d.b2 < p or (q is None and d.b2 == p)
        _, at, b1 = self.seconds[q - len(self.options)]
        return d.b2 < p or (d.b2 == p and ((d.b1, i) <= (b1, at) if own else (d.b1, i) < (b1, at)))

    def _versions(self, j: int, p: int, q: int | None) -> list[float | list[tuple[Expr, float]] | None]:
        model = self.model
        original, recomputed = super()._versions(j, p, q)
        i = model.producer[j]
        if i >= 0 and self.doubles[i] and isinstance(recomputed, list):
            ended = {col: -1.0 for col, d in self._double_cols(i) if d.a2 < p}
            recomputed = [(add_scaled(expr, ended), c0) for expr, c0 in recomputed]
        second: list[tuple[Expr, float]] | None = None
        if i >= 0 and p <= model.last[j]:
            done = {col: 1.0 for col, d in self._double_cols(i) if self._done(i, d, p, q, True)}
            second = [(done, 0.0)] if done else None
        if p > model.last[j]:  # one bound per reader: two readers' second recomputes share one copy
            to_come = [{col: 1.0 for col, d in self._double_cols(h) if not self._done(h, d, p, q, False)}
                       for h in model.readers[j]]
            if any(to_come):
                original = [*(original if isinstance(original, list) else ()), *((c, 0.0) for c in to_come if c)]
        return [original, recomputed, second]


def double_names(model: RematModel, program: DoubleProgram,
                 chosen: dict[int, int]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``apply_recompute``'s names and cuts for ``chosen`` (candidate -> option index of
    ``program``): ``cutmulti.joint_names`` of its double drops and one-drop recomputes."""
    graph = model.graph
    ops = graph.ops
    drops, names, from_ops = [], [], {}
    for i in sorted(chosen):
        k = chosen[i]
        op = ops[model.cand_op[i]]
        if k >= program.singles[i]:
            d = program.doubles[i][k - program.singles[i]]
            drops.append(Drop(op.name, op.outputs[0], ops[d.b1].name, ops[d.b2].name))
            continue
        names.append(op.name)
        from_ops.update({graph.tensors[t].name: cut_name(graph, at) for t, at in program.options[i][k].cuts})
    return joint_names(drops, names, from_ops)


def double_program(model: RematModel, dyn_budget: int, max_nonzeros: int = MAX_NONZEROS,
                   stop: threading.Event | None = None) -> DoubleProgram | None:
    """The program for ``model`` at ``dyn_budget``, or ``None`` outside the cut model, past
    ``max_nonzeros`` (RL250 at 0.8 needs about 2.1 times ``cutmilp``'s 1.0 million) or
    when ``stop`` is set while it builds (``programbuild.ProgramBuild.cancel``)."""
    options = cut_options(model)
    if options is None:
        return None
    program = DoubleProgram(model, options, dyn_budget, max_nonzeros, stop)
    return None if program.too_large else program


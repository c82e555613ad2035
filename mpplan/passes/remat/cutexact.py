"""Solve the cut-choosing MILP (``mpplan.passes.remat.cutmilp``) with HiGHS, started from a
heuristic's answer, and map its answer to ``apply_recompute``'s names and cut points."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mpplan.errors import ConfigError
from mpplan.passes.remat.cutmilp import CutProgram, cut_options
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.model import NEVER, RematModel
from mpplan.passes.remat.rewriting import cut_name, cut_positions

__all__ = ["CutChoice", "choice_names", "choice_of_point", "option_of", "solve_cuts", "solve_program", "warm_point"]


@dataclass(frozen=True, slots=True)
class CutChoice:
    """A solve's answer: ``chosen`` (candidate -> option index), the MILP's ``status``
    (``optimal`` or ``time_limit``) and its proved lower ``bound`` on the cost."""

    chosen: dict[int, int]
    status: str
    bound: float | None


def warm_point(program: CutProgram, chosen: dict[int, int]) -> list[float]:
    """Column values of ``program`` for ``chosen`` (candidate -> option): the MILP's start
    from a heuristic's answer (feasible when that answer fits)."""
    model, x = program.model, [0.0] * len(program.cost)
    anchor: dict[int, int] = {}
    for i in sorted(chosen, reverse=True):  # consumers come later: settle them first
        x[program.y_cols[i][chosen[i]]] = 1.0
        consumers = (anchor[c] for c in model.cand_consumers[i] if c in anchor)
        a = min([program.options[i][chosen[i]].first_late, *consumers])
        if a < NEVER:
            anchor[i] = a
    for i, a in anchor.items():
        for at, col in zip(program.anchors[i], program.z_cols[i]):
            x[col] = 1.0 if at >= a else 0.0
    for aux, bounds in program.aux_bounds:
        x[aux] = min(1.0, max([0.0, *(c0 + sum(v * x[c] for c, v in expr.items()) for expr, c0 in bounds)]))
    return x


def option_of(model: RematModel, names: Sequence[str], from_ops: Mapping[str, str]) -> dict[int, int] | None:
    """``choice_names``' inverse: candidate -> option for one round of ``apply_recompute``
    (outputs without a cut in ``from_ops`` at the rule's split); ``None`` if none matches."""
    options = cut_options(model)
    graph = model.graph
    index = {graph.ops[k].name: i for i, k in enumerate(model.cand_op)}
    chosen: dict[int, int] = {}
    for name in names:
        i = index.get(name, -1)
        if options is None or i < 0:
            return None
        want = {model.storage_tensor[j]: model.split[j] for j in model.cand_outputs[i] if model.split[j] < NEVER}
        try:
            want.update((t, at) for t, at in cut_positions(graph, (name,), from_ops).items() if t in want)
        except ConfigError:
            return None  # a cut at no later reader: no option's
        match = [k for k, o in enumerate(options[i]) if dict(o.cuts) == want]
        if not match:
            return None
        chosen[i] = match[0]
    return chosen


def solve_cuts(model: RematModel, dyn_budget: int, time_limit_s: float,
               warm: dict[int, int] | None = None) -> CutChoice | None:
    """The least-cost recomputes and cuts keeping every step's dynamic bytes within
    ``dyn_budget``, started from ``warm`` (candidate -> option) if given; ``None`` when
    the graph is outside the model, the MILP too large, no choice fits, or none was found
    in ``time_limit_s``."""
    options = cut_options(model)
    if options is None or available_backend() is None:
        return None
    program = CutProgram(model, options, dyn_budget)
    return None if program.too_large else solve_program(program, time_limit_s, warm)


def solve_program(program: CutProgram, time_limit_s: float, warm: dict[int, int] | None = None) -> CutChoice | None:
    """``program``'s least-cost answer (candidate -> option index of ``program.options``) with
    HiGHS, started from ``warm`` if given; ``None`` when no backend, no choice fits, or none
    was found in ``time_limit_s``."""
    backend = available_backend()
    if backend is None:
        return None
    start = None if warm is None else warm_point(program, warm)
    status, x, _, bound = solve_arrays(program, backend, time_limit_s, start)
    return choice_of_point(program, status, x, bound)


def choice_of_point(program: CutProgram, status: str, x: Sequence[float] | None,
                    bound: float | None) -> CutChoice | None:
    """A solve of ``program`` (status, column values, bound in the program's scaled cost) as a
    ``CutChoice``; ``None`` when it has no values or neither found nor proved an optimum."""
    if x is None or status not in ("optimal", "time_limit"):
        return None
    chosen = {i: k for i, cols in enumerate(program.y_cols) for k, col in enumerate(cols) if x[col] > 0.5}
    scale = max(program.model.cand_cost, default=1.0) or 1.0
    return CutChoice(chosen, status, None if bound is None else bound * scale)


def choice_names(model: RematModel, chosen: dict[int, int]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The ops ``chosen`` recomputes and their cut points (tensor name -> ``from_op``), as
    ``apply_recompute`` takes them."""
    options = cut_options(model) or []
    graph = model.graph
    names = tuple(graph.ops[model.cand_op[i]].name for i in sorted(chosen))
    from_ops = {graph.tensors[t].name: cut_name(graph, at) for i, k in chosen.items() for t, at in options[i][k].cuts}
    return names, from_ops

"""remat's ``budget`` policy: fit a byte budget with the least added op cost.

The heuristic (``mpplan.passes.remat.greedy``) is a greedy over moves, from several
starts, with pruning and local search; its ``Choice`` re-simulates only the steps a
move touches, so a step costs about what the move touches rather than the whole graph.

The exact solver is a MILP (``mpplan.passes.remat.ilp``) over the same memory model,
warm-started with the heuristic's answer, under a time limit; it reports its best
bound and gap.  ``solver="auto"`` is exact on graphs of up to ``EXACT_MAX_OPS`` ops
when a MILP backend (``highspy``, else scipy's HiGHS) is installed, and the heuristic
otherwise (with a logged note when the backend is missing).  A budget under the
smallest peak any choice of recomputes reaches raises ``InfeasibleError`` naming that
smallest feasible budget in bytes (proved minimal by the MILP when one is installed).

Example: eight layers whose activations (LOAD 18436 bytes) must fit in 12000 bytes.

>>> from mpplan.capture import synthetic
>>> from mpplan.passes.remat.model import build_model
>>> model = build_model(synthetic.chain(8, train=True, batch=64, width=8))
>>> fit = fit_budget(model, model.static_bytes + 12_000, "heuristic", 10.0, time.perf_counter())
>>> fit.solver, [model.candidate_names()[i] for i in fit.chosen]
('heuristic', ['layers.0', 'layers.1', 'layers.2', 'layers.4'])
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from mpplan.errors import ConfigError, InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat import ilp
from mpplan.passes.remat.choice import Choice
from mpplan.passes.remat.greedy import drop_unneeded, greedy, heuristic, improve, least_peak
from mpplan.passes.remat.index import ModelIndex
from mpplan.passes.remat.model import RematModel, build_model

__all__ = ["EXACT_MAX_OPS", "SOLVERS", "BudgetFit", "BudgetInfeasibleError", "fit_budget", "least_peak_choice",
           "min_feasible_budget"]

_log = logging.getLogger(__name__)

SOLVERS = ("auto", "heuristic", "exact")

#: ``solver="auto"`` uses the MILP on graphs of up to this many ops.
EXACT_MAX_OPS = 1000

@dataclass(frozen=True, slots=True)
class BudgetFit:
    """What the budget search decided: the candidates to recompute (``chosen``) and how
    sure it is.

    ``solver`` names what decided (``heuristic``, ``highs`` or ``scipy-highs``);
    ``optimal`` whether the added cost is proved least; ``bound`` a
    proved lower bound on it and ``gap`` = (cost - bound) / cost (``None`` when
    nothing bounds it); ``note`` why a solver was not used or stopped early.
    """

    chosen: tuple[int, ...]
    solver: str
    optimal: bool = False
    bound: float | None = None
    gap: float | None = None
    note: str = ""


def fit_budget(model: RematModel, limit: int, solver: str, time_limit_s: float, clock: float, *,
               refuse_by: float | None = None) -> BudgetFit:
    """The least added cost with ``peak <= limit`` bytes, ``limit`` under the peak without
    recomputation, found by ``clock + time_limit_s`` (``clock``: a ``time.perf_counter``
    reading); ``BudgetInfeasibleError`` (carrying the least-peak choice found) when no
    choice of recomputes fits.

    A refusal happens only under the least peak of searches that do not aim at ``limit``
    (``least_peak_choice``, then with a MILP backend the MILP minimising the peak), and when
    the searches aimed at ``limit`` miss, those searches' answer is used if it fits: a
    budget is never refused where the least peak found fits.  So the policy is monotone in
    ``limit`` whenever that least peak is proved (the refusal then names "the smallest
    feasible budget"); otherwise a refusal names the least peak found in the time left,
    which may differ from budget to budget.  The MILP minimising the peak runs when the
    MILP aimed at ``limit`` finds no fit, until ``refuse_by`` (a ``time.perf_counter``
    reading after the limit, from a caller that keeps time for after a refusal; default,
    and when the aimed MILP proved ``limit`` infeasible: the limit).  On RL250 it proves the
    least peak (113,380 bytes) in 12 s, while the MILP aimed at 113,801 bytes found no fit
    in its 13 s and, with a second left, the greedy's least peak (119,900) was named as the
    smallest budget found feasible, though 114,535 planned.  On a training graph the remat
    pass gives this one fit the whole limit and no ``refuse_by``: the MILP minimising the
    peak gets what the aimed MILP leaves.
    """
    backend, note = _backend(solver, model)
    deadline = clock + time_limit_s
    lower = model.lower_bound()
    if limit < lower:
        _raise_infeasible(model, limit, backend, deadline, lower)
    dyn = limit - model.static_bytes
    # The heuristic may use a third of the time when a MILP follows, all of it otherwise.
    share = time_limit_s / 3 if backend is not None else time_limit_s
    heur = heuristic(model, dyn, clock + share)
    least = None  # the greedy's least-peak choice, when the heuristic aimed at ``limit`` misses
    if heur.load > dyn:
        least = least_peak_choice(model, heur)
        if least.load <= dyn:
            heur = improve(drop_unneeded(least, dyn), dyn, clock + share)
    if backend is None:
        if least is not None and heur.load > dyn:
            _refuse(model, limit, lower, least, least.peak <= lower)
        return BudgetFit(heur.chosen, "heuristic", note=note)
    solution = ilp.solve(
        model,
        dyn,
        time_limit_s=_remaining(deadline),
        warm_start=heur.chosen if heur.load <= dyn else None,
        backend=backend,
    )
    found = [heur]
    if solution.chosen is not None:  # re-scored exactly: the MILP works to a tolerance
        found.append(drop_unneeded(Choice.build(model, solution.chosen, index=heur.index), dyn))
    fits = [choice for choice in found if choice.load <= dyn]
    if not fits:
        assert least is not None, "the heuristic's own fit is among the fits"
        last = deadline if refuse_by is None or solution.status == "infeasible" else max(deadline, refuse_by)
        least, proved = _min_peak(model, backend, last, lower, least)
        if least.load > dyn:
            _refuse(model, limit, lower, least, proved)
        fit = improve(drop_unneeded(least, dyn), dyn, last)
        return BudgetFit(fit.chosen, "heuristic", bound=solution.bound, gap=_gap(fit.cost, solution.bound),
                         note="the least peak found fits: the MILP aimed at the budget found no fit in its time")
    best = min(fits, key=lambda choice: (choice.cost, choice.load, choice.chosen))
    optimal = solution.status == "optimal" and found[-1].load <= dyn and solution.chosen is not None
    bound = best.cost if optimal else solution.bound
    if solution.status in ("too_large", "infeasible"):
        return BudgetFit(best.chosen, "heuristic", note=solution.note)
    return BudgetFit(best.chosen, solution.backend, optimal=optimal, bound=bound, gap=_gap(best.cost, bound),
                     note=solution.note)


def _gap(cost: float, bound: float | None) -> float | None:
    """(cost - bound) / cost, ``None`` when nothing bounds the cost."""
    return None if bound is None else (0.0 if cost <= 0 else max(0.0, (cost - bound) / cost))


def min_feasible_budget(
    graph: Graph, *, solver: str = "auto", time_limit_s: float = 60.0, model: RematModel | None = None
) -> tuple[int, bool]:
    """The smallest peak (bytes) any choice of recomputes gives, and whether it is proved.

    Exact (the MILP minimising the peak) when a backend is installed and ``solver``
    allows it; otherwise the greedy's least peak, an upper bound (proved only when it
    meets ``RematModel.lower_bound``).
    """
    if solver not in SOLVERS:
        raise ConfigError(f"remat solver: expected one of {', '.join(SOLVERS)}, got {solver!r}")
    model = build_model(graph) if model is None else model
    found, proved = _min_peak(model, _backend(solver, model)[0], time.perf_counter() + time_limit_s,
                              model.lower_bound(), least_peak_choice(model))
    return found.peak, proved


def _remaining(deadline: float) -> float:
    """Seconds left before ``deadline``; at least one, so a solver always gets a look."""
    return max(1.0, deadline - time.perf_counter())


def _backend(solver: str, model: RematModel) -> tuple[str | None, str]:
    """The MILP backend to use (``None``: the heuristic decides) and a note saying why not."""
    if solver == "heuristic":
        return None, ""
    backend = ilp.available_backend()
    if backend is None:
        note = "no MILP backend installed (pip install highspy): used the heuristic"
        _log.warning("remat: %s", note)
        return None, note
    if solver == "auto" and model.num_ops > EXACT_MAX_OPS:
        return None, f"{model.num_ops} ops > {EXACT_MAX_OPS}: used the heuristic"
    return backend, ""


def least_peak_choice(model: RematModel, best: Choice | None = None) -> Choice:
    """The least-peak choice the greedy finds: lowered one peak at a time from nothing,
    from its run aimed straight at ``lower_bound`` (pushed one byte at a time it can take
    recomputes that lower the excess but leave the peak where it is, and stall), and
    from ``best``.  Without ``best`` the answer does not depend on any budget."""
    index = ModelIndex.of(model) if best is None else best.index
    empty = Choice.build(model, index=index)
    aimed = greedy(empty.copy(), model.lower_bound() - model.static_bytes, prune=False)
    starts = [least_peak(empty), least_peak(aimed)]
    if best is not None:
        starts.append(least_peak(best.copy()))
    return min(starts, key=lambda choice: (choice.load, choice.cost, choice.chosen))


def _min_peak(model: RematModel, backend: str | None, deadline: float, lower: int,
              found: Choice) -> tuple[Choice, bool]:
    """The least-peak choice found from the greedy's ``found`` (``least_peak_choice``) by
    the MILP minimising the peak, when ``backend`` names one, and whether its peak is
    proved least (by the MILP, or by meeting ``lower``)."""
    if backend is not None and found.peak > lower:
        solution = ilp.solve(model, None, time_limit_s=_remaining(deadline), warm_start=found.chosen,
                             backend=backend)
        if solution.chosen is not None:
            exact = Choice.build(model, solution.chosen, index=found.index)
            if exact.load < found.load:
                found = exact
        if solution.status == "optimal":
            return found, True
    return found, found.peak <= lower


class BudgetInfeasibleError(InfeasibleError):
    """No choice of recomputes found fits the budget; ``chosen`` is the least-peak choice
    found (candidate indices), the best infeasible answer."""

    def __init__(self, message: str, missing_bytes: int, chosen: tuple[int, ...]) -> None:
        super().__init__(message, missing_bytes=missing_bytes)
        self.chosen = chosen


def _raise_infeasible(model: RematModel, limit: int, backend: str | None, deadline: float, lower: int) -> None:
    _refuse(model, limit, lower, *_min_peak(model, backend, deadline, lower, least_peak_choice(model)))


def _refuse(model: RematModel, limit: int, lower: int, found: Choice, proved: bool) -> None:
    """Refuse ``limit``, naming ``found``'s peak as the smallest budget (``proved``: shown least)."""
    what = "the smallest feasible budget is" if proved else "the smallest budget found feasible is"
    raise BudgetInfeasibleError(
        f"graph {model.graph.name!r}: remat budget {limit} bytes is infeasible: {what} {found.peak} bytes "
        f"(static {model.static_bytes} bytes; no choice of recomputes goes under {lower} bytes); "
        "raise the budget or the device capacity",
        missing_bytes=max(0, found.peak - limit),
        chosen=found.chosen,
    )

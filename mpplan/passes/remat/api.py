"""The ``remat`` entry point: check the arguments, run a policy, measure the rewritten graph
(the package docstring describes the policies; ``phases`` runs ``budget``'s search)."""

from __future__ import annotations

import time

from mpplan import sim
from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.passes.remat.budget import SOLVERS
from mpplan.passes.remat.model import build_model
from mpplan.passes.remat.phases import fit_in_phases
from mpplan.passes.remat.policies import mirror_plan, mirror_search, sqrt_checkpoints
from mpplan.passes.remat.result import RematResult, measured, unchanged
from mpplan.passes.remat.rewriting import candidate_indices

__all__ = ["POLICIES", "remat", "resolve_budget"]

POLICIES = ("none", "mirror", "sqrt", "budget")


def remat(
    graph: Graph,
    policy: str,
    *,
    threshold: int | None = None,
    budget: float | str | None = None,
    solver: str = "auto",
    time_limit_s: float = 60.0,
    rounds: bool = True,
) -> RematResult:
    """Rewrite ``graph`` with the recomputes ``policy`` chooses (module docstring).

    ``threshold`` (bytes) steers ``mirror`` (``None``: MXNet's threshold search);
    ``budget`` (bytes, a fraction in (0, 1] of the no-remat peak, or a size string
    such as ``"16GiB"``) is what ``budget`` fits; ``solver`` is ``auto``,
    ``heuristic`` or ``exact``; ``time_limit_s`` caps the budget search: the exact
    solver, and the heuristic's extra starts and local search (its first greedy
    pass always runs to the end); ``rounds`` lets the budget policy recompute a tensor
    more than once on graphs without a backward pass, in the phases of
    ``mpplan.passes.remat.phases.fit_in_phases`` (its docstring gives how they share the
    limit): cut points (``cuts``), a second round (``rounds``) and local searches on the
    cuts, or, when one round at the rule's cuts cannot fit, the least peaks of two rounds
    and of cut points.  Raises ``ConfigError`` for a bad argument and
    ``InfeasibleError`` (``RematInfeasibleError``, with the best infeasible rewrite)
    when no choice of recomputes fits the budget.
    """
    clock = time.perf_counter()
    if policy not in POLICIES:
        raise ConfigError(f"remat policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    if solver not in SOLVERS:
        raise ConfigError(f"remat solver: expected one of {', '.join(SOLVERS)}, got {solver!r}")
    if not time_limit_s > 0:
        raise ConfigError(f"remat time_limit_s: expected a positive number of seconds, got {time_limit_s!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0):
        raise ConfigError(f"remat threshold: expected a non-negative number of bytes, got {threshold!r}")
    baseline = sim.given_peak(graph)
    if policy == "none":
        return unchanged(graph, policy, baseline, clock)
    model = build_model(graph)
    if policy == "mirror":
        if threshold is None:
            threshold, _ = mirror_search(graph, model=model)
        plan = mirror_plan(graph, threshold, model=model)
        chosen = candidate_indices(model, plan.recompute)
        return measured(model, policy, chosen, baseline, clock, threshold=threshold)
    if policy == "sqrt":
        chosen = candidate_indices(model, sqrt_checkpoints(graph, model=model))
        return measured(model, policy, chosen, baseline, clock)
    if budget is None:
        raise ConfigError("remat budget: the budget policy needs bytes (16GiB) or a fraction (0.8) of the peak")
    limit = resolve_budget(budget, baseline)
    if limit >= baseline:
        return unchanged(graph, policy, baseline, clock, budget_bytes=limit, solver="none", optimal=True, bound=0.0,
                         gap=0.0, note="the graph fits without recomputation")
    return fit_in_phases(model, limit, baseline, clock, solver, time_limit_s, rounds)


def resolve_budget(budget: float | str, baseline: int) -> int:
    """Bytes of a budget given as bytes, a size string or a fraction of ``baseline``
    (``ConfigError`` for anything else)."""
    if isinstance(budget, str):
        from mpplan.budget import parse_budget

        try:
            budget = parse_budget(budget)
        except ValueError as exc:
            raise ConfigError(f"remat budget: {exc}") from None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise ConfigError(f"remat budget: expected bytes or a fraction in (0, 1], got {budget!r}")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ConfigError(f"remat budget: a fraction must lie in (0, 1], got {budget}")
        return int(budget * baseline)
    if budget <= 0:
        raise ConfigError(f"remat budget: expected a positive number of bytes, got {budget}")
    return budget

"""The ``remat`` entry point and its record: check the arguments, run a policy, measure
the rewritten graph (the package docstring describes the policies)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpplan import sim
from mpplan.errors import ConfigError, InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat.budget import SOLVERS, BudgetInfeasibleError, fit_budget
from mpplan.passes.remat.cutlns2 import build_seconds, eligible, search_lns
from mpplan.passes.remat.cuts import fit_cuts, fit_least_cuts
from mpplan.passes.remat.cutsearch import search_cuts
from mpplan.passes.remat.cutwindow import search_local
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.model import RematModel, build_model
from mpplan.passes.remat.policies import mirror_plan, mirror_search, sqrt_checkpoints
from mpplan.passes.remat.programbuild import ProgramBuild
from mpplan.passes.remat.rewriting import apply_recompute, candidate_indices, repeated_op, rewrite
from mpplan.passes.remat.rounds import fit_least_rounds, fit_rounds

__all__ = ["POLICIES", "RematInfeasibleError", "RematResult", "records_of", "remat", "resolve_budget", "result_of"]

POLICIES = ("none", "mirror", "sqrt", "budget")

#: With ``solver="auto"``, the share of ``time_limit_s`` kept for the local search on cut
#: points (``cutsearch``): the second-round phase, which takes all the time it is given,
#: ends before it, so the search runs even then (RL1000 at 0.9 ended at 0.82% without it).
#: The cut phase is given no more than the time to the second-round phase's end (half the
#: time to the limit, at most that): else, once it used its half, the rounds had no time at
#: all and the search started late (docs/benchmarks.md).  Its first fit's greedy pass still
#: runs to its end, so a cut phase given less than that pass overruns its share.
SEARCH_SHARE = 0.25

#: With ``solver="auto"``, the share of ``time_limit_s`` kept after the search for the LNS
#: whose sub-MILPs are built for their neighbourhood (``cutwindow``): the search ends before
#: it, the second-round phase before both.  It took the place of the double-drop search
#: (``cutmulti``), which found nothing cheaper on either RL1000 cell in its 15 s; in its 21 s
#: this LNS took RL1000 0.9 from the search's 0.718% to 0.705% and 0.8 from 3.111% to 3.104%
#: (2026-11-28, load 2.1).  The search's share stays 0.25 (the rounds, which never run on
#: RL1000, end at 0.4 of the limit): with 0.15 a busy run left it 10 s and 0.9 ended at 0.717%.
LOCAL_SHARE = 0.35

#: With ``solver="auto"`` on a graph whose double-drop program builds in seconds
#: (``cutlns2.eligible``), the share of ``time_limit_s`` kept at the end for the LNS on that
#: program (``cutlns2``), in place of the searches' shares: the cut phase ends before it.
LNS_SHARE = 0.65


# --- records -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RematResult:
    """What ``remat`` decided and the graph it made.

    ``graph`` is the rewritten graph (the input itself when nothing is recomputed);
    ``recomputed`` the original activations whose late readers now read a recompute,
    ``recompute_ops`` the ops added (recomputes and recreated views), in graph order.
    ``compute_overhead`` is the added op cost over the original graph's total op cost.
    ``peak_bytes`` is ``static + LOAD`` of the new graph's as-given order (``sim``),
    ``baseline_peak_bytes`` the same for the input graph; ``budget_bytes`` the
    budget resolved to bytes (``budget`` policy).  Solver fields: ``solver`` names
    what decided (``rule`` for none/mirror/sqrt, ``heuristic``, ``highs`` or
    ``scipy-highs``), ``optimal`` whether the added cost is proved least, ``bound``
    a proved lower bound on the added cost and ``gap`` = (cost - bound) / cost
    (``None`` when nothing bounds it), ``seconds`` the time taken, ``note`` why a
    solver was not used or stopped early.  ``from_ops`` maps each tensor whose late
    region a solver placed to the op it starts at (``RematRecord.from_op``).
    """

    graph: Graph
    policy: str
    recomputed: tuple[str, ...]
    recompute_ops: tuple[str, ...]
    added_cost: float
    compute_overhead: float
    peak_bytes: int
    baseline_peak_bytes: int
    budget_bytes: int | None = None
    threshold: int | None = None
    solver: str = "rule"
    optimal: bool = False
    bound: float | None = None
    gap: float | None = None
    seconds: float = 0.0
    note: str = ""
    from_ops: Mapping[str, str] = field(default_factory=dict)

    def plan_records(self) -> tuple[dict[str, Any], ...]:
        """``records_of`` the rewritten graph, for ``Plan.remat``."""
        return records_of(self.graph, self.from_ops)


class RematInfeasibleError(InfeasibleError):
    """No choice of recomputes fits the budget.  ``best`` is the least-peak rewrite
    found (its ``peak_bytes`` over the budget): the best infeasible answer, which the
    planner plans and the CLI writes next to the refusal.  ``plan`` is that plan,
    when the planner made one."""

    def __init__(self, message: str, missing_bytes: int, best: RematResult, plan: Any = None) -> None:
        super().__init__(message, missing_bytes=missing_bytes)
        self.best = best
        self.plan = plan


def records_of(graph: Graph, from_ops: Mapping[str, str] | None = None) -> tuple[dict[str, Any], ...]:
    """One record per recomputed tensor of ``graph``: the tensor, the op that made it (for
    a later round, the recompute it repeats: ``repeated_op``), the recompute op and
    tensor that replace it late, its bytes, and ``from_op`` where ``from_ops`` places
    the tensor's late region."""
    from_ops = from_ops or {}
    records = []
    for op in graph.ops:
        if op.recompute_of is None or graph.tensor(op.outputs[0]).alias_of is not None:
            continue
        original = graph.op(repeated_op(op.name))
        for old, new in zip(original.outputs, op.outputs):
            record = {
                "tensor": old,
                "op": original.name,
                "recompute_op": op.name,
                "recompute_tensor": new,
                "bytes": graph.tensor(new).nbytes,
            }
            if old in from_ops:
                record["from_op"] = from_ops[old]
            records.append(record)
    return tuple(records)


# --- the entry point -----------------------------------------------------------------


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
    more than once on graphs without a backward pass: one round at the rule's cuts gets a
    third of the time, then cut points it chooses (``mpplan.passes.remat.cuts``) and a
    second round (``mpplan.passes.remat.rounds``) compete in the time left (each only
    when that covers the fits it makes, timed as the first; with ``auto`` the cuts and then the
    rounds stop short of the last ``SEARCH_SHARE`` + ``LOCAL_SHARE`` of the limit, where a local search on cuts,
    ``cutsearch``, and then an LNS on the cut MILP, ``cutwindow``, use whatever they left; on a graph
    whose double-drop MILP builds in seconds, ``cutlns2.eligible``, the cuts stop short of the
    last ``LNS_SHARE`` instead, where the LNS on that MILP, ``cutlns2``, replaces both searches; its
    MILP is built in a thread from the first fit on, ``programbuild.ProgramBuild``, when
    ``cutlns2.build_seconds`` says the build ends before that share),
    or step in when one round at the
    rule's cuts cannot fit.  Raises ``ConfigError`` for a bad argument and
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
        return _unchanged(graph, policy, baseline, clock)
    model = build_model(graph)
    if policy == "mirror":
        if threshold is None:
            threshold, _ = mirror_search(graph, model=model)
        plan = mirror_plan(graph, threshold, model=model)
        chosen = candidate_indices(model, plan.recompute)
        return _result(model, policy, chosen, baseline, clock, threshold=threshold)
    if policy == "sqrt":
        chosen = candidate_indices(model, sqrt_checkpoints(graph, model=model))
        return _result(model, policy, chosen, baseline, clock)
    if budget is None:
        raise ConfigError("remat budget: the budget policy needs bytes (16GiB) or a fraction (0.8) of the peak")
    limit = resolve_budget(budget, baseline)
    if limit >= baseline:
        return _unchanged(graph, policy, baseline, clock, budget_bytes=limit, solver="none", optimal=True, bound=0.0,
                          gap=0.0, note="the graph fits without recomputation")
    several = rounds and not model.training  # recompute a tensor more than once: cuts, then rounds
    # The LNS on the double-drop program, built meanwhile: only when the build can end before the LNS's share (a
    # build still running holds the GIL beside the fits; on RL250 at 0.8 a 3 s limit took 10 s with it, 5 s without)
    lns = (several and solver == "auto" and eligible(model)
           and build_seconds(model) <= (1 - LNS_SHARE) * time_limit_s)
    build = ProgramBuild(model, limit) if lns else None
    try:
        try:
            fit = fit_budget(model, limit, solver, time_limit_s / 3 if several else time_limit_s, clock)
            result = _result(model, policy, fit.chosen, baseline, clock, budget_bytes=limit, solver=fit.solver,
                             optimal=fit.optimal, bound=fit.bound, gap=fit.gap, note=fit.note)
            label = fit.solver
        except BudgetInfeasibleError as exc:
            left = max(time_limit_s / 4, time_limit_s - (time.perf_counter() - clock))
            least = _least_several(model, limit, policy, baseline, clock, solver, left) if several else None
            if least is None:
                best = _result(model, policy, exc.chosen, baseline, clock, budget_bytes=limit, solver="least-peak",
                               note="the budget is infeasible: the least peak found")
                raise RematInfeasibleError(str(exc), exc.missing_bytes, best) from None
            result, label = least, solver
        took = time.perf_counter() - clock  # a fit's first greedy pass runs to its end: a phase needs its fits' time
        search = several and solver == "auto"  # then, in their shares and the time left, local searches on cuts
        ends = ({"rounds": 1 - LNS_SHARE} if lns
                else {"rounds": 1 - SEARCH_SHARE - LOCAL_SHARE, "search": 1 - LOCAL_SHARE})
        kinds = ("cuts", "rounds", "lns") if lns else ("cuts", "rounds", "search", "local")[:4 if search else 2]
        for kind in kinds if several else ():  # cheaper answers
            end = clock + time_limit_s * ends.get(kind, 1)
            left = end - time.perf_counter()
            if left < took * {"cuts": 1, "rounds": 2}.get(kind, 0) or not result.added_cost:  # rounds fit twice
                continue
            beat = result.added_cost
            if kind in ("cuts", "rounds"):
                cap = clock + time_limit_s * ends.get("rounds", 1) - time.perf_counter()  # cuts: to the rounds' end
                found = (fit_cuts(model, limit, solver, min(left / 2, cap), beat=beat) if kind == "cuts"
                         else fit_rounds(model, limit, solver, left, beat=beat))
            else:  # the local searches start from the answer's recomputes, named by the ops they repeat
                once = [repeated_op(op) for op in result.recompute_ops]
                if kind in ("search", "local"):
                    search_kind = search_cuts if kind == "search" else search_local
                    found = search_kind(model, once, result.from_ops, limit, end)
                else:
                    found = search_lns(graph, once, result.from_ops, limit, end, build)
            if found is None:
                continue
            multi = result_of(graph, found.names, policy, baseline, clock, from_ops=found.from_ops, budget_bytes=limit,
                              solver=f"{label}+{kind}", note=f"{kind}; the answer before costs {beat:g}")
            if multi.peak_bytes <= limit and multi.added_cost < result.added_cost:
                result = multi
        return result
    finally:  # a build the LNS did not consume (remat raised, or skipped it) stops: it holds the GIL
        if build is not None:
            build.cancel()


def _least_several(model: RematModel, limit: int, policy: str, baseline: int, clock: float, solver: str,
                   time_limit_s: float) -> RematResult | None:
    """A fit of ``limit`` by two rounds or by cut points, each aimed at targets that do not
    depend on ``limit`` (so a budget is refused only under their least peaks), or ``None``."""
    for kind in ("rounds", "cuts"):
        more = fit_least_rounds(model, limit, time_limit_s) if kind == "rounds" else fit_least_cuts(model, limit)
        if more is None:
            continue
        multi = result_of(model.graph, more.names, policy, baseline, clock, from_ops=more.from_ops,
                          budget_bytes=limit, solver=f"{solver}+{kind}",
                          note=f"{kind}: one round at the rule's cuts does not fit")
        if multi.peak_bytes <= limit:
            return multi
    return None


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


def result_of(graph: Graph, ops: Iterable[str], policy: str, baseline: int, clock: float,
              *, from_ops: Mapping[str, str] | None = None, **fields: Any) -> RematResult:
    """The ``RematResult`` of ``apply_recompute(graph, ops, from_ops)`` (later rounds
    included), measured as ``remat`` measures; ``fields`` fill the solver's fields."""
    ops = tuple(dict.fromkeys(ops))
    if not ops:
        return _unchanged(graph, policy, baseline, clock, **fields)
    present = {op.name for op in graph.ops}
    if not from_ops and all(name in present for name in ops):
        model = build_model(graph)
        return _result(model, policy, candidate_indices(model, ops), baseline, clock, **fields)
    from_ops = dict(from_ops or {})
    rewritten = apply_recompute(graph, ops, from_ops)
    added = tuple(op for op in rewritten.ops if op.name not in present)
    added_cost = sum(op.cost for op in added)
    total = sum(op.cost for op in graph.ops)
    return RematResult(
        graph=rewritten,
        policy=policy,
        recomputed=tuple(r["tensor"] for r in records_of(rewritten)),
        recompute_ops=tuple(op.name for op in added),
        added_cost=added_cost,
        compute_overhead=added_cost / total if total > 0 else 0.0,
        peak_bytes=sim.given_peak(rewritten),
        baseline_peak_bytes=baseline,
        seconds=round(time.perf_counter() - clock, 6),
        from_ops=from_ops,
        **fields,
    )


def _result(model: RematModel, policy: str, chosen: Iterable[int], baseline: int, clock: float,
            **fields: Any) -> RematResult:
    """Rewrite for ``chosen`` and measure the new graph with ``sim``."""
    ev = evaluate(model, chosen)
    graph, added, added_cost = rewrite(model, ev)
    peak = sim.given_peak(graph) if ev.chosen else baseline
    total = sum(op.cost for op in model.graph.ops)
    names = tuple(
        model.graph.tensors[model.storage_tensor[j]].name for i in ev.chosen for j in model.cand_outputs[i]
    )
    return RematResult(
        graph=graph,
        policy=policy,
        recomputed=names,
        recompute_ops=added,
        added_cost=added_cost,
        compute_overhead=added_cost / total if total > 0 else 0.0,
        peak_bytes=peak,
        baseline_peak_bytes=baseline,
        seconds=round(time.perf_counter() - clock, 6),
        **fields,
    )


def _unchanged(graph: Graph, policy: str, baseline: int, clock: float, **fields: Any) -> RematResult:
    return RematResult(
        graph=graph,
        policy=policy,
        recomputed=(),
        recompute_ops=(),
        added_cost=0.0,
        compute_overhead=0.0,
        peak_bytes=baseline,
        baseline_peak_bytes=baseline,
        seconds=round(time.perf_counter() - clock, 6),
        **fields,
    )

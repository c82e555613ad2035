"""The record ``remat`` returns, and a rewrite measured into one: its recomputes, their
cost, and the rewritten graph's peak by ``sim`` (every policy and phase measures alike)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpplan import sim
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.model import RematModel, build_model
from mpplan.passes.remat.rewriting import apply_recompute, candidate_indices, repeated_op, rewrite

__all__ = ["RematInfeasibleError", "RematResult", "measured", "records_of", "result_of", "unchanged"]


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


def result_of(graph: Graph, ops: Iterable[str], policy: str, baseline: int, clock: float,
              *, from_ops: Mapping[str, str] | None = None, **fields: Any) -> RematResult:
    """The ``RematResult`` of ``apply_recompute(graph, ops, from_ops)`` (later rounds
    included), measured as ``remat`` measures; ``fields`` fill the solver's fields."""
    ops = tuple(dict.fromkeys(ops))
    if not ops:
        return unchanged(graph, policy, baseline, clock, **fields)
    present = {op.name for op in graph.ops}
    if not from_ops and all(name in present for name in ops):
        model = build_model(graph)
        return measured(model, policy, candidate_indices(model, ops), baseline, clock, **fields)
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


def measured(model: RematModel, policy: str, chosen: Iterable[int], baseline: int, clock: float,
             **fields: Any) -> RematResult:
    """Rewrite ``model``'s graph for the candidates ``chosen`` and measure the new graph with ``sim``."""
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


def unchanged(graph: Graph, policy: str, baseline: int, clock: float, **fields: Any) -> RematResult:
    """``graph`` itself, nothing recomputed."""
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

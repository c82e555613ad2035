"""Plans whose recompute fits a byte budget in the user's own loop, and the largest batch that fits a cap.

The remat pass fits its budget on the plan's graph (captured optimizer, the plan's
frees).  In a user's loop memory is eager PyTorch's (``apply_memory``): autograd
holds saved tensors to the end of their node, ``torch.optim`` makes its own
temporaries, and with the step in backward the gradients no longer pile up.
``plan_for_apply`` therefore runs the remat pass's budget policy on the graph that
loop runs (``apply_memory_graph``), whose ``static + LOAD`` is ``apply``'s predicted
peak: the least recompute that fits *that* graph.  The recomputes ``apply`` can
honour (the module's own calls, ``RecomputePolicy.aligned``) are then planned on the
captured graph, as the planner plans a recompute it chose itself, so the plan is
verified like any other.  While the honoured recomputes miss the budget (a
recompute of the loss's ops is out of ``apply``'s reach), the budget handed to the
remat pass is lowered by the miss.

``max_batch`` bisects the batch for the largest one whose ``apply`` prediction fits
a cap, with the least recompute that fits (``plan_for_apply`` at that batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.config import Device
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat import RematInfeasibleError, remat
from mpplan.passes.remat.result import result_of
from mpplan.plan import Plan
from mpplan.plan_records import PlanSettings, RematRecord
from mpplan.planner import PlannerSettings, memory_model, plan
from mpplan.runtime.apply_memory import ApplyPrediction, apply_memory_graph, predict_apply
from mpplan.runtime.recompute import RecomputePolicy

__all__ = ["ApplyPlan", "BatchFit", "max_batch", "plan_for_apply", "plan_recomputing"]

#: Re-plans ``plan_for_apply`` tries before it gives up on a budget.
ROUNDS = 8


@dataclass(frozen=True, slots=True)
class ApplyPlan:
    """A plan and what ``apply`` is predicted to hold with it; ``remat_budget`` is what the remat pass was given."""

    plan: Plan
    prediction: ApplyPrediction
    remat_budget: int | None


def plan_for_apply(
    program: CapturedProgram,
    devices: Sequence[Device],
    settings: PlannerSettings,
    budget: int | None,
    *,
    calls: Sequence[str] | None = None,
    optimizer_path: str = "single",
    step_in_backward: bool = False,
    allocation: Callable[[int], int] | None = None,
    workspaces: Mapping[str, int] | None = None,
) -> ApplyPlan:
    """Plan ``program`` so that ``apply``'s predicted peak is at most ``budget`` bytes (module docstring).

    ``settings`` are used as given, but for the remat policy and budget: with
    ``budget=None`` the plan recomputes nothing.  ``calls`` are the ATen calls the
    module's real forward makes (``recompute.module_calls``): the recomputes are
    aligned onto them as ``apply`` aligns them, so the prediction counts only those
    ``apply`` can honour (``None``: the traced forward is taken as the real one).
    ``optimizer_path`` and ``step_in_backward`` say how the loop's optimizer runs
    (``predict_apply``), as ``allocation`` (``cuda_block_bytes`` for a GPU) and ``workspaces``
    (``PlannedModule.workspaces`` of a probed step) say how its memory is counted.  Raises
    ``InfeasibleError`` when no budget the remat pass
    accepts brings ``apply``'s peak under ``budget``; its ``missing_bytes`` is how far
    the least peak found is above it.
    """

    def predict(ops: Sequence[str] = (), from_ops: Mapping[str, str] | None = None) -> ApplyPrediction:
        return predict_apply(program, ops, optimizer_path=optimizer_path, step_in_backward=step_in_backward,
                             from_ops=from_ops, workspaces=workspaces, allocation=allocation)

    if budget is None:
        planned = plan(program.graph, devices, replace(settings, remat="none", remat_budget=None))
        return ApplyPlan(planned, predict(), None)
    if budget <= 0:
        raise ValueError(f"plan_for_apply: budget: expected a positive number of bytes, got {budget}")
    unplanned = predict()
    if unplanned.peak_bytes <= budget:
        planned = plan(program.graph, devices, replace(settings, remat="none", remat_budget=None))
        return ApplyPlan(planned, unplanned, None)
    loop_graph = apply_memory_graph(program, optimizer_path=optimizer_path, step_in_backward=step_in_backward)
    asked = budget
    best: ApplyPrediction | None = None
    for _ in range(ROUNDS):
        at_floor = False
        try:
            chosen = remat(loop_graph, "budget", budget=asked, solver=settings.remat_solver,
                           time_limit_s=settings.remat_time_limit_s)
        except RematInfeasibleError as exc:  # the least peak any recompute reaches in this loop
            chosen, at_floor = exc.best, True
        policy = RecomputePolicy.from_records(program, chosen.plan_records())
        if calls is not None:
            policy = policy.aligned(calls)
        predicted = predict(policy.ops, policy.from_ops)
        best = predicted if best is None or predicted.peak_bytes < best.peak_bytes else best
        miss = predicted.peak_bytes - budget
        if miss <= 0:
            return ApplyPlan(plan_recomputing(program.graph, devices, settings, policy.ops, budget,
                                              from_ops=policy.from_ops), predicted, asked)
        if at_floor:
            break
        asked -= max(miss, 1)
        if asked <= 0:
            break
    assert best is not None
    raise InfeasibleError(
        f"apply budget {budget} bytes: the least peak apply is predicted to reach is {best.peak_bytes} bytes; "
        "raise the budget",
        missing_bytes=best.peak_bytes - budget,
    )


def plan_recomputing(
    graph: Graph, devices: Sequence[Device], settings: PlannerSettings, ops: Sequence[str], budget: int,
    *, from_ops: Mapping[str, str] | None = None,
) -> Plan:
    """The plan of ``graph`` that recomputes ``ops``, made as the planner makes one for its own choice.

    ``from_ops`` places late regions (recomputed tensor -> cut op), as ``remat``'s
    ``RematResult.from_ops`` does.  Its settings say ``remat: budget`` at ``budget``
    bytes, which ``apply`` (not the plan's own arena) is held to; ``remat_chosen.fitted``
    says so.
    """
    clock = time.perf_counter()
    dynamic = memory_model(graph, settings.grads)
    result = result_of(dynamic, ops, "budget", 0, clock, from_ops=from_ops)
    inner = plan(result.graph, devices, replace(settings, remat="none", remat_budget=None, grads="static"))
    recorded = replace(settings, remat="budget", remat_budget=budget)
    return replace(
        inner,
        graph_name=graph.name,
        graph_hash=graph.content_hash,
        settings=PlanSettings.from_mapping({
            **recorded.to_dict(), "placement_chosen": inner.settings.get("placement_chosen"),
            "remat_chosen": {"budget_bytes": budget, "fitted": "apply", "solver": settings.remat_solver},
        }),
        remat=tuple(RematRecord.from_mapping(r) for r in result.plan_records()),
        compute_overhead=result.compute_overhead,
    )


@dataclass(frozen=True, slots=True)
class BatchFit:
    """The largest batch whose ``apply`` fits ``cap``, its plan, and the batches tried (batch -> fits)."""

    batch: int
    result: ApplyPlan
    tried: tuple[tuple[int, bool], ...]


def max_batch(
    capture: Callable[[int], tuple[CapturedProgram, Sequence[str] | None]],
    devices: Sequence[Device],
    settings: PlannerSettings,
    cap: int,
    *,
    start: int = 1,
    limit: int = 1 << 16,
    optimizer_path: str = "single",
    step_in_backward: bool = False,
) -> BatchFit:
    """The largest batch in ``[start, limit]`` whose ``apply`` is predicted to fit ``cap`` bytes.

    ``capture(batch)`` returns the program captured at ``batch`` and the module's
    real calls (``recompute.module_calls``).  Doubles from ``start`` until a batch does not fit, then
    bisects; each batch is planned with ``plan_for_apply`` (the least recompute
    that fits; ``optimizer_path`` and ``step_in_backward`` as there).  Assumes that
    what fits at a batch fits at every smaller one.
    Raises ``InfeasibleError`` when even ``start`` does not fit.
    """
    tried: dict[int, ApplyPlan | None] = {}

    def fits(batch: int) -> bool:
        if batch not in tried:
            program, calls = capture(batch)
            try:
                tried[batch] = plan_for_apply(program, devices, settings, cap, calls=calls,
                                              optimizer_path=optimizer_path, step_in_backward=step_in_backward)
            except InfeasibleError:
                tried[batch] = None
        return tried[batch] is not None

    if not fits(start):
        raise InfeasibleError(f"max_batch: batch {start} does not fit {cap} bytes with any recompute")
    good, bad = start, None
    while bad is None:
        nxt = min(good * 2, limit)
        if nxt == good:
            break
        if fits(nxt):
            good = nxt
        else:
            bad = nxt
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    result = tried[good]
    assert result is not None
    return BatchFit(good, result, tuple((b, r is not None) for b, r in sorted(tried.items())))


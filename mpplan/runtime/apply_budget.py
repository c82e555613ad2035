"""Plans whose recompute fits a byte budget in the user's own loop, and the largest batch that fits a cap.

The remat pass fits its budget on the plan's graph (captured optimizer, the plan's
frees).  In a user's loop memory is eager PyTorch's (``apply_memory``): autograd
holds saved tensors to the end of their node, ``torch.optim`` makes its own
temporaries.  ``plan_for_apply`` closes that gap: it plans, predicts ``apply``'s
peak, and while the prediction misses the budget, lowers the budget handed to the
remat pass by the miss and plans again.  The least recompute that fits the
remat pass's budget then fits the user's loop too.

``max_batch`` bisects the batch for the largest one whose ``apply`` prediction fits
a cap, with the least recompute that fits (``plan_for_apply`` at that batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.config import Device
from mpplan.errors import InfeasibleError
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.runtime.apply_memory import ApplyPrediction, predict_apply
from mpplan.runtime.recompute import RecomputePolicy

__all__ = ["ApplyPlan", "BatchFit", "max_batch", "plan_for_apply"]

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
) -> ApplyPlan:
    """Plan ``program`` so that ``apply``'s predicted peak is at most ``budget`` bytes (module docstring).

    ``settings`` are used as given, but for the remat policy and budget: with
    ``budget=None`` the plan recomputes nothing.  ``calls`` are the ATen calls the
    module's real forward makes (``recompute.module_calls``): the recomputes are
    aligned onto them as ``apply`` aligns them, so the prediction counts only those
    ``apply`` can honour (``None``: the traced forward is taken as the real one).  Raises ``InfeasibleError`` when no
    budget the remat pass accepts brings ``apply``'s peak under ``budget``; its
    ``missing_bytes`` is how far the least peak found is above it.
    """
    if budget is None:
        planned = plan(program.graph, devices, replace(settings, remat="none", remat_budget=None))
        return ApplyPlan(planned, predict_apply(program, optimizer_path=optimizer_path), None)
    if budget <= 0:
        raise ValueError(f"plan_for_apply: budget: expected a positive number of bytes, got {budget}")
    unplanned = predict_apply(program, optimizer_path=optimizer_path)
    if unplanned.peak_bytes <= budget:
        planned = plan(program.graph, devices, replace(settings, remat="none", remat_budget=None))
        return ApplyPlan(planned, unplanned, None)
    asked, at_floor = budget, False
    best: ApplyPrediction | None = None
    for _ in range(ROUNDS):
        try:
            planned = plan(program.graph, devices, replace(settings, remat="budget", remat_budget=asked))
        except InfeasibleError as exc:
            if at_floor or exc.missing_bytes <= 0:
                raise
            # Under the remat pass's floor on its own graph; apply's graph may still fit at that floor.
            asked, at_floor = asked + exc.missing_bytes, True
            planned = plan(program.graph, devices, replace(settings, remat="budget", remat_budget=asked))
        policy = RecomputePolicy.from_records(program, planned.remat)
        if calls is not None:
            policy = policy.aligned(calls)
        predicted = predict_apply(program, policy.ops, optimizer_path=optimizer_path)
        best = predicted if best is None or predicted.peak_bytes < best.peak_bytes else best
        miss = predicted.peak_bytes - budget
        if miss <= 0:
            return ApplyPlan(planned, predicted, asked)
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
) -> BatchFit:
    """The largest batch in ``[start, limit]`` whose ``apply`` is predicted to fit ``cap`` bytes.

    ``capture(batch)`` returns the program captured at ``batch`` and the module's
    real calls (``recompute.module_calls``).  Doubles from ``start`` until a batch does not fit, then
    bisects; each batch is planned with ``plan_for_apply`` (the least recompute
    that fits).  Assumes that what fits at a batch fits at every smaller one.
    Raises ``InfeasibleError`` when even ``start`` does not fit.
    """
    tried: dict[int, ApplyPlan | None] = {}

    def fits(batch: int) -> bool:
        if batch not in tried:
            program, calls = capture(batch)
            try:
                tried[batch] = plan_for_apply(
                    program, devices, settings, cap, calls=calls, optimizer_path=optimizer_path
                )
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


"""The optimizer update a training capture appends: its spec, and the update traced as in-place ATen ops.

The update runs inside the traced step after the gradients, under ``no_grad``, one parameter at a
time; each parameter's ops are annotated with the module owning it, so ``Op.module`` names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx.traceback as fx_traceback

from mpplan.capture.torch_capture.annotations import MODULE, owner
from mpplan.errors import CaptureError

OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True, slots=True)
class OptimizerSpec:
    """The optimizer update appended to a training graph, with ``torch.optim``'s defaults.

    ``sgd`` is plain SGD without momentum (``torch.optim.SGD(lr)``): no state,
    ``p -= lr * g``.  ``adam`` is ``torch.optim.Adam(lr, betas, eps)`` without weight
    decay, written as its capturable single-tensor update: ``exp_avg`` and
    ``exp_avg_sq`` per trainable parameter (same shape and dtype) and one shared
    float32 scalar ``step`` that the graph increments before use, so states start at
    zero exactly as ``torch.optim.Adam``'s do.
    """

    name: str
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise CaptureError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, got {self.name!r}")
        if not (self.lr > 0 and self.eps > 0 and all(0 <= b < 1 for b in self.betas)):
            raise CaptureError(f"optimizer {self.name!r}: expected lr > 0, eps > 0, 0 <= betas < 1, got {self}")


def optimizer_states(spec: OptimizerSpec | None, trainable: Sequence[str]) -> list[tuple[str, str, str]]:
    """The optimizer states the traced step takes, in placeholder order: ``(key, tensor name, state)``.

    Adam keeps ``exp_avg`` and ``exp_avg_sq`` per trainable parameter (``key`` the
    parameter's FQN, shaped like it), then one shared float32 scalar ``step`` (``key``
    ``""``); SGD keeps none.  ``optimizer_update`` finds them by these tensor names.
    """
    if spec is None or spec.name != "adam":
        return []
    per_param = [(name, f"{name}.{state}", state) for name in trainable for state in ("exp_avg", "exp_avg_sq")]
    return [*per_param, ("", "adam.step", "step")]


def optimizer_update(
    spec: OptimizerSpec, pairs: list[tuple[str, torch.Tensor, torch.Tensor]], state: dict[str, torch.Tensor]
) -> None:
    """The in-place parameter update, as torch.optim's single-tensor implementations do it."""
    if spec.name == "sgd":
        for name, p, g in pairs:
            with fx_traceback.annotate({MODULE: owner(name)}):
                p.add_(g, alpha=-spec.lr)
        return
    beta1, beta2 = spec.betas
    step = state["adam.step"]
    step.add_(1)
    # Capturable Adam: the bias corrections are tensors, so the graph stays valid for every step.
    step_size_neg = (spec.lr / (1 - torch.pow(beta1, step))).neg()
    scale = (1 - torch.pow(beta2, step)).sqrt() * step_size_neg
    eps_term = spec.eps / step_size_neg
    for name, p, g in pairs:
        with fx_traceback.annotate({MODULE: owner(name)}):
            exp_avg, exp_avg_sq = state[f"{name}.exp_avg"], state[f"{name}.exp_avg_sq"]
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = exp_avg_sq.sqrt()
            denom.div_(scale).add_(eps_term)
            p.addcdiv_(exp_avg, denom)

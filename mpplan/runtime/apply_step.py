"""The optimizer step in backward: each parameter updated, and its gradient freed, as soon as backward makes it.

In a plain loop every ``.grad`` lives from the moment backward makes it until
``optimizer.step()`` at the end, so the peak of the step's end holds all gradients
at once, plus (on ``torch.optim``'s ``foreach`` path, CUDA's default) one
temporary per parameter.  ``StepInBackward`` registers a
``Tensor.register_post_accumulate_grad_hook`` on every parameter of the user's
optimizer: when autograd has accumulated a parameter's gradient (its
``AccumulateGrad`` node runs as soon as the gradient is complete), the hook runs the
user's own optimizer for that one parameter and sets ``.grad`` to ``None``.  At most
one gradient and one parameter's temporaries are then alive beyond what backward
itself holds.  ``mpplan.runtime.apply_memory`` models exactly that
(``step_in_backward=True``).

The user's optimizer stays the one that updates: its ``step`` runs with its
``param_groups`` narrowed to the one group holding the parameter, and that group's
``params`` to the parameter alone (both restored at once), so its hyperparameters,
learning-rate schedules and per-parameter ``state`` are the user's, readable and
saved by ``optimizer.state_dict()`` as usual.  Elementwise optimizers (SGD, Adam,
AdamW, ...) give the same results as stepping all parameters at the end; on one
device kind, with the same ``foreach`` setting, bit for bit.  The loop's own
``optimizer.step()`` then finds no gradient and does nothing, and
``zero_grad()`` is harmless.

Why it is an option, not the default: it changes what the loop can do between
``backward()`` and ``step()``.  Gradient clipping over all parameters, gradient
accumulation over several backward passes, ``GradScaler``'s unscale and skipped
steps, optimizers that need a closure (LBFGS) or the whole gradient (Shampoo-like)
all see no gradients, or step too early.  A loop without those is unchanged.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from mpplan.runtime.apply_memory import OPTIMIZER_PATHS

__all__ = ["StepInBackward", "optimizer_path"]


class StepInBackward:
    """Hooks that step ``optimizer`` per parameter inside backward (module docstring); ``remove()`` takes them off.

    ``steps`` counts the per-parameter steps taken since construction.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"step_in_backward: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.steps = 0
        self._handles: list[Any] = []
        # Autograd runs one thread per CUDA device: two parameters on two GPUs may be ready at once,
        # and narrowing the optimizer's groups must not interleave.
        self._lock = threading.Lock()
        seen: set[int] = set()
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in seen or not param.requires_grad:
                    continue
                seen.add(id(param))
                self._handles.append(param.register_post_accumulate_grad_hook(self._hook(group)))

    def remove(self) -> None:
        """Take the hooks off: the optimizer steps at ``optimizer.step()`` again."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, group: dict[str, Any]) -> Any:
        def step(param: torch.Tensor) -> None:
            optimizer = self.optimizer
            with self._lock:
                groups, params = optimizer.param_groups, group["params"]
                optimizer.param_groups = [group]
                group["params"] = [param]
                try:
                    optimizer.step()
                finally:
                    group["params"] = params
                    optimizer.param_groups = groups
                param.grad = None
                self.steps += 1

        return step


def optimizer_path(optimizer: torch.optim.Optimizer) -> str:
    """How ``optimizer`` runs its update (``apply_memory.OPTIMIZER_PATHS``): its ``foreach``, else torch's default.

    ``torch.optim`` takes the ``foreach`` path by default when every parameter is on
    CUDA, and the per-parameter loop otherwise.
    """
    setting = next((g.get("foreach") for g in optimizer.param_groups if g.get("foreach") is not None), None)
    if setting is None:
        params = [p for g in optimizer.param_groups for p in g["params"]]
        setting = bool(params) and all(p.device.type == "cuda" for p in params)
    path = "foreach" if setting else "single"
    assert path in OPTIMIZER_PATHS
    return path

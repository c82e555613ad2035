"""A user's training loop, metered: what the tests of ``mpplan.apply`` run a wrapped model (or eager) through."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mpplan import zoo
from mpplan.capture.torch_capture import default_loss
from mpplan.runtime.trace import capture_for
from mpplan.runtime.tracking import MeteringMode, StorageMeter


class CallCounter(TorchDispatchMode):
    """Count the ATen calls a step makes (a recompute shows as extra calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def captured_gpt(model_kwargs: dict[str, int], input_kwargs: dict[str, int],
                 device: str = "cpu") -> tuple[Any, Any, Any]:
    """A seeded zoo GPT, its inputs, and its Adam training step captured on ``device``."""
    torch.manual_seed(0)
    model = zoo.build("gpt", **model_kwargs)
    inputs = zoo.example_inputs("gpt", **input_kwargs)
    program = capture_for(model, inputs, torch.device(device), mode="train", optimizer="adam", loss_fn=None)
    return model, inputs, program


def _step(module, opt, inputs) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = default_loss(module(**inputs) if isinstance(inputs, dict) else module(*inputs))
    loss.backward()
    opt.step()
    return loss


def metered_loop(module, opt, inputs, steps: int = 3, device: str = "cpu", calls: CallCounter | None = None):
    """Train ``steps`` steps as a user would: the storage meter's peak over the steps after the first
    (Adam makes its state in the first), and the losses.  ``calls``, when given, counts those steps' ATen calls."""
    meter = StorageMeter(device)
    meter.register([list(module.parameters()), list(module.buffers()), inputs], pinned=True)
    counter = calls if calls is not None else CallCounter()
    losses = []
    for i in range(steps):
        if i == 1:
            meter.reset_peaks()
            counter.calls = 0
        torch.manual_seed(100 + i)  # dropout draws the same masks in every run
        with MeteringMode(meter, torch.device(device)), counter:
            loss = _step(module, opt, inputs)
        losses.append(float(loss.detach()))
        del loss
    meter.sample()
    return meter.peaks[device], losses


def cuda_loop_peak(wrapped, opt, inputs, device: torch.device, base: int, steps: int = 3) -> int:
    """The CUDA allocator's peak over the steps after the first, above ``base`` (what was allocated before).
    The first step probes the kernels' workspaces (``PlannedModule.probing``), which the prediction then holds."""
    cuda_inputs = [x.to(device) for x in inputs]
    for i in range(steps):
        if i == 0:
            with wrapped.probing():
                _step(wrapped, opt, cuda_inputs)
            continue
        if i == 1:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        _step(wrapped, opt, cuda_inputs)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base

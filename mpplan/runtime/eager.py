"""The eager baseline: the original module run by plain PyTorch on one device.

One step is what a user's loop does: in train mode ``zero_grad(set_to_none=True)``,
forward, ``default_loss`` (or the given loss), ``backward`` and, when asked,
``optimizer.step()`` with ``torch.optim.SGD``/``Adam`` configured like the captured
optimizer; in infer mode a forward in eval mode under ``no_grad``.  The module is a
deep copy, so the caller's model is never touched.

Memory is measured like the executor's: on a virtual (CPU) device by the live
storage bytes of every tensor the step creates or holds (a ``MeteringMode`` sees
forward, autograd and optimizer ops alike); on a GPU by the allocator's peak.  The
first step's results are kept (on CPU) for the numerics check.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from mpplan.capture.torch_capture import OptimizerSpec, default_loss
from mpplan.runtime import devices as devices_mod
from mpplan.runtime.measure import EagerDevice, EagerMeasurement
from mpplan.runtime.tracking import MeteringMode, StorageMeter

__all__ = ["EagerRun", "Snapshot", "call_module", "make_optimizer", "run_eager", "to_device"]


@dataclass(frozen=True)
class Snapshot:
    """Results of one step, on CPU: outputs (the loss in train mode), gradients and state by FQN."""

    outputs: tuple[torch.Tensor | None, ...]
    grads: Mapping[str, torch.Tensor]
    state: Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class EagerRun:
    """The eager baseline's measurement and its first step's results."""

    measurement: EagerMeasurement
    snapshot: Snapshot


def run_eager(
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    mode: str,
    optimizer: OptimizerSpec | None,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    device: torch.device,
    steps: int,
    warmup: int,
    seed: int = 0,
) -> EagerRun:
    """Run ``warmup + steps`` eager steps of a copy of ``model`` on ``device``; peaks over the timed steps.

    On a GPU the base (what the GPU holds before the copy is made, library
    workspaces created first) is taken before anything of the module exists, so its
    parameters, inputs, gradients and optimizer state are all measured.
    """
    cuda = device.type == "cuda"
    base = devices_mod.allocator_base(_one_device(device))[str(device)] if cuda else None
    meter = StorageMeter(device=str(device))
    with torch.no_grad():
        module = copy.deepcopy(model).to(device)
    inputs = to_device(example_inputs, device)
    train = mode == "train"
    module.train(train)
    opt = make_optimizer(optimizer, module) if train else None
    loss_of = loss_fn or default_loss
    meter.register([list(module.parameters()), list(module.buffers()), inputs], pinned=True)

    def step() -> Any:
        if not train:
            with torch.no_grad():
                out = call_module(module, inputs)
            return tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        for p in module.parameters():
            p.grad = None
        loss = loss_of(call_module(module, inputs))
        loss.backward()
        if opt is not None:
            opt.step()
        return (loss.detach(),)

    snapshot: Snapshot | None = None
    times: list[float] = []
    for i in range(warmup + steps):
        if i == warmup:
            if cuda:
                devices_mod.reset_peak(device)
            meter.reset_peaks()
        torch.manual_seed(seed)
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with MeteringMode(meter, device):
            outputs = step()
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
        if snapshot is None:
            snapshot = Snapshot(
                outputs=tuple(None if o is None else o.detach().to("cpu", copy=True) for o in outputs),
                grads={n: p.grad.detach().to("cpu", copy=True) for n, p in module.named_parameters()
                       if p.grad is not None},
                state=_state(module),
            )
        del outputs
    meter.sample()
    tracked = meter.peaks.get(str(device), 0)
    window = devices_mod.allocator_window(device, base) if base is not None else None
    eager_device = EagerDevice(
        name=str(device),
        measured_peak_bytes=window.measured if window is not None else tracked,
        tracked_peak_bytes=tracked,
        allocator_peak_bytes=None if window is None else window.peak_allocated,
        reserved_peak_bytes=None if window is None else window.peak_reserved,
        source="allocator" if window is not None else "tracked",
        allocator_base_bytes=None if window is None else window.base.allocated,
        requested_peak_bytes=None if window is None else window.measured_requested,
    )
    assert snapshot is not None
    return EagerRun(
        EagerMeasurement(devices=(eager_device,), step_time_s=_median(times), step_times_s=tuple(times)), snapshot
    )


def make_optimizer(spec: OptimizerSpec | None, module: torch.nn.Module) -> torch.optim.Optimizer | None:
    """``torch.optim`` configured like the captured optimizer (``None`` when there is none)."""
    if spec is None:
        return None
    params = [p for p in module.parameters() if p.requires_grad]
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr)
    return torch.optim.Adam(params, lr=spec.lr, betas=spec.betas, eps=spec.eps)


def call_module(module: torch.nn.Module, inputs: Any) -> Any:
    """``module(*inputs)`` for a tuple or list, ``module(**inputs)`` for a dict."""
    if isinstance(inputs, dict):
        return module(**inputs)
    return module(*inputs)


def to_device(inputs: Any, device: torch.device) -> Any:
    """``inputs`` with every tensor leaf moved to ``device``."""
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, inputs)


def _one_device(device: torch.device) -> devices_mod.DeviceMap:
    return devices_mod.map_devices(["eager"], [str(device)])


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {n: p.detach().to("cpu", copy=True) for n, p in module.named_parameters()}
    state.update({n: b.detach().to("cpu", copy=True) for n, b in module.named_buffers()})
    return state


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0

"""Capture a model for the device it will run on.

Capture traces on fake tensors living on the model's first real device (CPU for a
CPU or meta model), and ATen picks kernels by device: attention, for one, lowers
to ``_scaled_dot_product_flash_attention_for_cpu`` on CPU and to a CUDA kernel on a
GPU.  A program executed on a GPU must therefore be traced for that GPU.  Without
moving or copying the real weights, ``capture_for`` traces a *meta twin* of the
model (same modules, parameters on ``meta``) with the example inputs on the target
device, so the fake tensors live there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from mpplan.capture.torch_capture import CapturedProgram, OptimizerSpec, capture_program
from mpplan.runtime.eager import to_device

__all__ = ["capture_for", "meta_twin"]


def capture_for(
    model: torch.nn.Module,
    example_inputs: Any,
    device: torch.device,
    *,
    mode: str,
    optimizer: str | OptimizerSpec | None,
    loss_fn: Callable[[Any], torch.Tensor] | None,
) -> CapturedProgram:
    """``capture_program`` with kernels chosen for ``device`` (the model itself when it is already there)."""
    placed = (t.device for t in (*model.parameters(), *model.buffers()) if t.device.type != "meta")
    here = next(placed, torch.device("cpu"))
    if device.type == "cpu" and here.type == "cpu":
        return capture_program(model, example_inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn)
    return capture_program(
        meta_twin(model), to_device(example_inputs, device), mode=mode, optimizer=optimizer, loss_fn=loss_fn
    )


def meta_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are ``meta`` tensors (no data is copied)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)

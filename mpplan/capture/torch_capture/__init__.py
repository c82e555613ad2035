"""Capture a PyTorch module as an mpplan ``Graph`` by fake-tensor tracing at ATen level.

``capture_program`` runs the module once under ``make_fx(tracing_mode="fake")``: every
parameter, buffer and input is replaced by a ``FakeTensor`` (shape, dtype and device,
no storage), so a 1.5B-parameter model, or one whose parameters live on the ``meta``
device, captures on a laptop.  In ``"train"`` mode the traced function is the whole
step: forward, loss, ``torch.autograd.grad`` over the trainable parameters and, when
asked, the optimizer update, all recorded as ATen ops in one joint ``fx.Graph``.
The fx graph is then lowered to the IR, one ATen call per ``Op`` (the rules: ``lowering``).

Kinds: parameters, buffers and lifted constants are ``param`` (static model state;
only trainable parameters get gradients); user inputs ``input``; optimizer state
``optimizer_state``; the storage a parameter's gradient lives in ``grad`` with
``grad_of`` the parameter (views of it are ``grad`` too, without ``grad_of``, so each
parameter has exactly one tensor naming it); the loss, or the forward's outputs in
``"infer"`` mode, ``output`` and ``Graph.outputs``.  Everything else ``activation``.

Tracing toggles ``module.train()``/``eval()`` for the mode asked and restores every
submodule's flag afterwards; it briefly registers forward hooks on the submodules and
uses ``torch.fx.traceback``'s node-meta context (the phase, module and autograd-node
marks live only in the traced GraphModule's ``node.meta["custom"]``; the IR carries
them as fields), so captures are not thread-safe.

The modules, in the order a capture runs them: ``inputs`` (the example inputs' tensor leaves),
``tracing`` (fake tensors and ``make_fx``), ``annotations`` (phase, module and autograd-node
marks on fx nodes), ``optimizer`` (the update), ``lowering`` (fx graph to IR, with ``cost``),
``program`` (the records returned).  Import from this package: it re-exports the public names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpplan.capture.torch_capture.cost import BYTES_PER_US as BYTES_PER_US
from mpplan.capture.torch_capture.cost import FLOPS_PER_US as FLOPS_PER_US
from mpplan.capture.torch_capture.cost import MIN_COST_US as MIN_COST_US
from mpplan.capture.torch_capture.inputs import input_leaves
from mpplan.capture.torch_capture.lowering import lower
from mpplan.capture.torch_capture.optimizer import OPTIMIZERS as OPTIMIZERS
from mpplan.capture.torch_capture.optimizer import OptimizerSpec
from mpplan.capture.torch_capture.program import CapturedProgram, Source, SourceRole
from mpplan.capture.torch_capture.tracing import PROGRESS_MIN_MODULES as PROGRESS_MIN_MODULES
from mpplan.capture.torch_capture.tracing import default_loss, trace
from mpplan.errors import CaptureError
from mpplan.graph import Graph

__all__ = [
    "CapturedProgram",
    "OptimizerSpec",
    "Source",
    "SourceRole",
    "capture",
    "capture_program",
    "default_loss",
]

MODES = ("infer", "train")


def capture(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    mode: str = "infer",
    optimizer: str | OptimizerSpec | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> Graph:
    """Trace ``module`` on ``example_inputs`` into a validated IR ``Graph`` (see ``capture_program``)."""
    return capture_program(module, example_inputs, mode=mode, optimizer=optimizer, loss_fn=loss_fn).graph


def capture_program(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    mode: str = "infer",
    optimizer: str | OptimizerSpec | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
) -> CapturedProgram:
    """Trace ``module`` with fake tensors and lower the ATen graph to the IR.

    ``example_inputs`` is a tuple (or list) of positional arguments or a dict of
    keyword arguments; tensors in it (real or ``meta``, nested in lists, tuples or
    dicts) become graph inputs, other leaves (ints, bools, ``None``, strings) are
    passed as constants.  ``mode="infer"`` traces the forward under ``no_grad`` in
    eval mode; ``mode="train"`` traces forward, ``loss_fn(output)`` (``default_loss``
    when ``None``), the gradients of every parameter with ``requires_grad`` and the
    ``optimizer`` update (``"sgd"``, ``"adam"`` or an ``OptimizerSpec``), in train mode.
    No real tensor is allocated.  Raises ``CaptureError`` on bad arguments or when the
    module cannot be traced (data-dependent control flow, an exception in forward).
    """
    spec = _check_arguments(module, example_inputs, mode, optimizer, loss_fn)
    gm, slots, grad_params = trace(module, example_inputs, mode, spec, loss_fn or default_loss)
    name = f"{type(module).__name__}.{mode}" + (f".{spec.name}" if spec else "")
    return lower(gm, slots, grad_params, name=name, mode=mode, optimizer=spec)


# ---------------------------------------------------------------------------------------------
# Arguments


def _check_arguments(
    module: object, example_inputs: object, mode: str, optimizer: object, loss_fn: object
) -> OptimizerSpec | None:
    if not isinstance(module, torch.nn.Module):
        raise CaptureError(f"capture: expected a torch.nn.Module, got {type(module).__name__}")
    if mode not in MODES:
        raise CaptureError(f"capture: mode must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(example_inputs, torch.Tensor):
        raise CaptureError(
            "capture: example_inputs must be a tuple of arguments or a dict of kwargs; wrap a tensor as (x,)"
        )
    if not isinstance(example_inputs, (tuple, list, dict)):
        raise CaptureError(
            "capture: example_inputs must be a tuple of arguments or a dict of kwargs, "
            f"got {type(example_inputs).__name__}"
        )
    input_leaves(example_inputs)  # rejects unsupported leaf types early
    if loss_fn is not None and not callable(loss_fn):
        raise CaptureError(f"capture: loss_fn must be callable, got {type(loss_fn).__name__}")
    if optimizer is None:
        return None
    if mode != "train":
        raise CaptureError(f"capture: an optimizer needs mode='train', got mode={mode!r}")
    if isinstance(optimizer, OptimizerSpec):
        return optimizer
    if isinstance(optimizer, str):
        return OptimizerSpec(optimizer)
    raise CaptureError(f"capture: optimizer must be None, 'sgd', 'adam' or an OptimizerSpec, got {optimizer!r}")


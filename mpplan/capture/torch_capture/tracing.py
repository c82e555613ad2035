"""Fake-tensor tracing: ``make_fx`` runs the whole step (forward, loss, gradients, update) on fake tensors.

Every parameter, buffer and input is replaced by a ``FakeTensor`` (shape, dtype and device, no
storage), so a 1.5B-parameter model, or one whose parameters live on the ``meta`` device, traces
on a laptop.  Fake tensors live on the module's first non-meta device, else on CPU, so a meta
model traces CPU kernels' choices (e.g. which attention kernel ``scaled_dot_product_attention``
picks).  Tracing toggles ``module.train()``/``eval()`` for the mode asked and restores every
submodule's flag afterwards.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch import fx
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree

from mpplan.capture.torch_capture.annotations import (
    BACKWARD,
    FORWARD,
    OPTIMIZER,
    PHASE,
    backward_annotations,
    module_annotations,
)
from mpplan.capture.torch_capture.inputs import input_leaves, rebuild_inputs
from mpplan.capture.torch_capture.optimizer import OptimizerSpec, optimizer_states, optimizer_update
from mpplan.capture.torch_capture.program import SourceRole
from mpplan.errors import CaptureError
from mpplan.progress import progress

#: Models with at least this many submodules get a capture progress bar (on a terminal).
PROGRESS_MIN_MODULES = 200


def default_loss(output: Any) -> torch.Tensor:
    """The loss ``capture`` differentiates when no ``loss_fn`` is given.

    A scalar floating-point tensor is the loss as is; a mapping (HF ``ModelOutput``)
    with a tensor ``loss`` gives that; otherwise ``.float().mean()`` of the first
    tensor leaf of the output (the logits of a language model).
    """
    if isinstance(output, torch.Tensor):
        first = output
    else:
        if isinstance(output, Mapping) and isinstance(output.get("loss"), torch.Tensor):
            loss: torch.Tensor = output["loss"]
            return loss
        leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
        if not leaves:
            raise CaptureError(
                f"default loss: the module returned no tensor (got {type(output).__name__}); pass loss_fn"
            )
        first = leaves[0]
    if first.dim() == 0 and first.is_floating_point():
        return first
    return first.float().mean()


@dataclass(frozen=True, slots=True)
class Slot:
    """A traced function argument: what it binds to and the IR tensor name it wants."""

    role: SourceRole
    key: str
    name: str
    state: str | None = None


def trace(
    module: torch.nn.Module,
    example_inputs: Any,
    mode: str,
    spec: OptimizerSpec | None,
    loss_fn: Callable[[Any], torch.Tensor],
) -> tuple[fx.GraphModule, list[Slot], list[str]]:
    """make_fx the step; returns the GraphModule, its placeholder slots in order, and the
    FQNs whose gradients follow the loss in the outputs (train mode)."""
    train = mode == "train"
    params = list(module.named_parameters())
    buffers = list(module.named_buffers())
    inputs = input_leaves(example_inputs)
    trainable = [name for name, p in params if p.requires_grad] if train else []
    if train and not trainable:
        raise CaptureError(f"capture: {type(module).__name__} has no parameter with requires_grad; nothing to train")

    flat, slots = _fake_sources(params, buffers, inputs, trainable, spec)
    grad_params: list[str] = []  # filled while tracing: trainable params that got a gradient

    def step(*values: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        by_slot = dict(zip(slots, values))
        state = {s.name: v for s, v in by_slot.items()}
        weights = {s.key: v for s, v in by_slot.items() if s.role in (SourceRole.PARAM, SourceRole.BUFFER)}
        args, kwargs = rebuild_inputs(example_inputs, [v for s, v in by_slot.items() if s.role is SourceRole.INPUT])
        with fx_traceback.annotate({PHASE: FORWARD}), torch.set_grad_enabled(train):
            output = torch.func.functional_call(module, weights, args, kwargs)
            if not train:
                leaves = tuple(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
                if not leaves:
                    raise CaptureError(f"capture: {type(module).__name__} returned no tensor")
                return leaves
            loss = loss_fn(output)
        _check_loss(loss)
        leaves_in = [state[name] for name in trainable]
        with fx_traceback.annotate({PHASE: BACKWARD}), backward_annotations(loss):
            raw = torch.autograd.grad(loss, leaves_in, allow_unused=True)
            grads = _own_storages(raw, values)
        pairs = [(name, state[name], g) for name, g in zip(trainable, grads) if g is not None]
        grad_params.extend(name for name, _, _ in pairs)
        if spec is not None:
            with fx_traceback.annotate({PHASE: OPTIMIZER}), torch.no_grad():
                optimizer_update(spec, pairs, state)
        return (loss, *(g for _, _, g in pairs))

    try:
        with ExitStack() as stack:
            stack.enter_context(_quiet_fake_tensor_log())
            stack.enter_context(fx_traceback.preserve_node_meta())
            stack.enter_context(_training_flags(module, train))
            bar = stack.enter_context(
                progress(f"capturing {type(module).__name__} (forward)", _count_submodules(module), unit="module",
                         enabled=_count_submodules(module) >= PROGRESS_MIN_MODULES)
            )
            stack.enter_context(module_annotations(module, on_leave=bar.update))
            gm = make_fx(step, _ANNOTATED_DECOMPOSITIONS, tracing_mode="fake", **_MAKE_FX_OPTIONS)(*flat)
    except CaptureError:
        raise
    except Exception as e:  # any failure inside user code or the tracer: one precise CaptureError
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        hint = ""
        if isinstance(e, _DATA_DEPENDENT):
            hint = " (it reads tensor values, e.g. `if x.sum() > 0` or `.item()`, which fake tracing cannot know)"
        raise CaptureError(
            f"capture: could not trace {type(module).__name__} in {mode} mode{hint}: {type(e).__name__}: {first}"
        ) from e
    return gm, slots, grad_params


def _annotated_batch_norm(
    input: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``native_batch_norm`` as the same kernel under a schema that declares its writes.

    ``native_batch_norm``'s schema hides that training updates the running stats in
    place; ``_native_batch_norm_legit`` (``Tensor(a!) running_mean``) says so, so
    the IR lists them as written.  Without running stats, or in eval mode, nothing
    is written and the ``no_stats`` / ``no_training`` variants say that.
    """
    aten = torch.ops.aten
    result: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    if running_mean is None or running_var is None:
        result = aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    elif not training:
        result = aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
    else:
        result = aten._native_batch_norm_legit.default(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
    return result


#: Decompositions applied while tracing: legacy ops whose schemas hide a mutation.
_ANNOTATED_DECOMPOSITIONS = MappingProxyType({torch.ops.aten.native_batch_norm.default: _annotated_batch_norm})

_DATA_DEPENDENT = (DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode)


@contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """Mute the fake-tensor logger's traceback dump for a failing op: the CaptureError says it once."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    saved = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = saved


def _make_fx_options() -> dict[str, bool]:
    """make_fx flags: allow real constants in the module; skip torch-function metadata we never read.

    Skipping ``torch_fn`` metadata halves the trace time of optimizer-heavy graphs;
    the flag is private, so it is passed only where this torch has it.
    """
    wanted = {"_allow_non_fake_inputs": True, "_disable_torch_fn_metadata_mode": True}
    accepted = inspect.signature(make_fx).parameters
    return {k: v for k, v in wanted.items() if k in accepted}


_MAKE_FX_OPTIONS = MappingProxyType(_make_fx_options())


def _fake_sources(
    params: list[tuple[str, torch.nn.Parameter]],
    buffers: list[tuple[str, torch.Tensor]],
    inputs: list[tuple[str, torch.Tensor]],
    trainable: list[str],
    spec: OptimizerSpec | None,
) -> tuple[list[torch.Tensor], list[Slot]]:
    """The traced step's arguments as fake tensors, in placeholder order, with their slots.

    Parameters, buffers, the optimizer's state (``optimizer_states``) and the tensor
    inputs; only trainable parameters require grad.
    """
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    device = _trace_device([t for _, t in params] + [t for _, t in buffers] + [t for _, t in inputs])
    grad = set(trainable)
    flat: list[torch.Tensor] = []
    slots: list[Slot] = []

    def add(t: torch.Tensor, slot: Slot, requires_grad: bool = False) -> None:
        flat.append(_fake(fake_mode, t, device, requires_grad=requires_grad))
        slots.append(slot)

    for name, p in params:
        add(p, Slot(SourceRole.PARAM, name, name), requires_grad=name in grad)
    for name, b in buffers:
        add(b, Slot(SourceRole.BUFFER, name, name))
    by_name = dict(params)
    for key, name, state in optimizer_states(spec, trainable):
        like = by_name[key] if key else torch.empty((), dtype=torch.float32, device="meta")  # Adam's scalar step
        add(like, Slot(SourceRole.OPTIMIZER_STATE, key, name, state))
    for name, x in inputs:
        add(x, Slot(SourceRole.INPUT, name, name))
    return flat, slots


def _trace_device(tensors: Sequence[torch.Tensor]) -> torch.device:
    """Where fake tensors live: the first non-meta device among the module's tensors and inputs, else CPU."""
    for t in tensors:
        if t.device.type != "meta":
            return t.device
    return torch.device("cpu")


def _fake(mode: FakeTensorMode, t: torch.Tensor, device: torch.device, *, requires_grad: bool) -> torch.Tensor:
    """A storage-less stand-in for ``t``: same shape, strides and dtype; meta tensors move to ``device``."""
    where = device if t.device.type == "meta" else t.device
    with mode:
        fake = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=where)
    return fake.requires_grad_(requires_grad) if requires_grad else fake


def _check_loss(loss: object) -> None:
    if not isinstance(loss, torch.Tensor):
        raise CaptureError(f"capture: the loss must be a tensor, got {type(loss).__name__}")
    if loss.numel() != 1 or not loss.is_floating_point():
        raise CaptureError(
            f"capture: the loss must be a floating-point scalar, got shape {tuple(loss.shape)} dtype {loss.dtype}"
        )
    if not loss.requires_grad:
        raise CaptureError("capture: the loss does not depend on any trainable parameter")


def storage_ref(t: torch.Tensor) -> Hashable:
    """A key that compares equal for tensors sharing one storage, fake tensors included."""
    ref: Hashable = StorageWeakRef(t.untyped_storage())  # type: ignore[no-untyped-call]
    return ref


def _own_storages(grads: Sequence[torch.Tensor | None], sources: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Clone a gradient unless it owns its whole storage alone.

    Autograd may hand two parameters the same tensor (``p + q``), an expanded view
    of a scalar (``p.sum()``), or a slice of a larger buffer (``cat``); eager
    ``AccumulateGrad`` copies those too.  Afterwards each gradient is (a view of) a
    storage of exactly its size that no other gradient or source shares.
    """
    seen = {storage_ref(t) for t in sources}
    owned: list[torch.Tensor | None] = []
    for g in grads:
        if g is not None:
            ref = storage_ref(g)
            if ref in seen or g.untyped_storage().nbytes() != g.numel() * g.element_size():
                g = g.clone()
                ref = storage_ref(g)
            seen.add(ref)
        owned.append(g)
    return owned


@contextmanager
def _training_flags(module: torch.nn.Module, training: bool) -> Iterator[None]:
    """Put ``module`` in train or eval mode for the trace; restore every submodule's flag after."""
    saved = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, flag in saved:
            m.training = flag


def _count_submodules(module: torch.nn.Module) -> int:
    return sum(1 for _ in module.modules()) - 1

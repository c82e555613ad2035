"""Capture a PyTorch module as an mpplan ``Graph`` by fake-tensor tracing at ATen level.

``capture_program`` runs the module once under ``make_fx(tracing_mode="fake")``: every
parameter, buffer and input is replaced by a ``FakeTensor`` (shape, dtype and device,
no storage), so a 1.5B-parameter model, or one whose parameters live on the ``meta``
device, captures on a laptop.  In ``"train"`` mode the traced function is the whole
step: forward, loss, ``torch.autograd.grad`` over the trainable parameters and, when
asked, the optimizer update, all recorded as ATen ops in one joint ``fx.Graph``.

The fx graph is then lowered to the IR, one ATen call per ``Op``:

* **Views** (a schema return with non-write ``alias_info``, e.g. ``view``, ``t``,
  ``expand``, ``split``) become tensors with ``alias_of`` their base argument.  An
  output the schema calls fresh that nevertheless shares its input's storage
  (``_unsafe_view``) is an alias too: storage identity of the fake values decides.
* **In-place** writes (a schema argument with ``alias_info.is_write``: ``relu_``,
  ``add_``, ``out=`` arguments, batch-norm running stats, ``_foreach_*_``) list the
  mutated tensor as both input and output; later readers of the fx node the op
  returned read that same IR tensor.  ``native_batch_norm``, whose schema hides its
  running-stat update, is traced as the same kernel under the annotated
  ``_native_batch_norm_legit`` so the write shows.
* Multi-output ops get one IR tensor per tensor element, named after the
  ``getitem`` node that reads it (``<node>.<i>`` when none does); ``getitem`` itself
  is no op.  Ops without tensor outputs are kept, with no outputs.
* Tensor sizes are ``numel * element_size``; a view (``alias_of``) allocates
  nothing and has ``nbytes`` 0, as in graph files; its ``shape`` and ``dtype`` say
  what it looks like.
* ``Op.cost`` is roofline microseconds on a 100 TFLOP/s, 2 TB/s GPU (the model
  ``capture.synthetic`` uses): ``max(FLOPs / 1e8, bytes moved / 2e6, 1)`` with the
  FLOPs of ``torch.utils.flop_counter``'s formula where one exists (matmul, conv,
  attention) and the logical bytes the op reads and writes; ops that only make
  views (and ops that write nothing) cost 0.
* ``Op.module`` is the dotted path of the innermost submodule whose ``forward`` ran
  the op (``None`` at the root); backward ops inherit their forward op's module and
  optimizer ops the module owning their parameter.
* ``Op.backward_of`` links a backward op to the forward op it differentiates through
  autograd's sequence number: the forward fx node records the number of the autograd
  node it created, and hooks on every autograd node of the loss's graph mark the ops
  run while that node's backward executes.  Ops the engine runs between nodes (the
  seed ``ones_like``, gradient accumulation, clones of shared gradients) take the
  link of their first consumer that has one, else of their inputs' producers.

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
them as fields), so captures are not thread-safe.  Fake tensors live on the module's
first non-meta device, else on CPU, so a meta model traces CPU kernels' choices
(e.g. which attention kernel ``scaled_dot_product_attention`` picks).
"""

from __future__ import annotations

import enum
import inspect
import logging
import math
import operator
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import cached_property
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
from torch.utils.flop_counter import flop_registry

from mpplan.errors import CaptureError, GraphError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.progress import progress

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
OPTIMIZERS = ("sgd", "adam")

#: Cost model (the one ``capture.synthetic`` uses): a GPU doing 100 TFLOP/s and 2 TB/s, as
#: FLOPs and bytes per microsecond, and a floor of one microsecond (a kernel launch) per op.
FLOPS_PER_US = 100e6
BYTES_PER_US = 2e6
MIN_COST_US = 1.0

# Keys of the annotations this module puts in fx ``node.meta["custom"]`` while tracing.
_PHASE = "mpplan_phase"
_MODULE = "mpplan_module"
_GRAD_FN = "mpplan_grad_fn"
_FORWARD, _BACKWARD, _OPTIMIZER = "forward", "backward", "optimizer"


class SourceRole(str, enum.Enum):
    """What a graph source (an fx placeholder or lifted constant) binds to."""

    PARAM = "param"
    BUFFER = "buffer"
    INPUT = "input"
    OPTIMIZER_STATE = "optimizer_state"
    CONSTANT = "constant"


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


@dataclass(frozen=True, slots=True)
class Source:
    """One value the program starts from.

    ``node`` is the fx placeholder (or ``get_attr``) node, ``tensor`` its IR tensor.
    ``key`` is the parameter or buffer FQN, the input name (``input0``, ``input_ids``,
    ``input0.1`` for nested inputs), the parameter FQN an optimizer state belongs to
    (``""`` for Adam's shared ``step``), or the GraphModule attribute of a constant.
    ``state`` names the optimizer state: ``exp_avg``, ``exp_avg_sq`` or ``step``.
    """

    node: str
    tensor: str
    role: SourceRole
    key: str
    state: str | None = None


@dataclass(frozen=True)
class CapturedProgram:
    """A captured ``Graph`` plus what an executor needs to run it op by op on real tensors.

    ``module`` is the traced ATen-level ``fx.GraphModule``; calling it on the source
    values in ``sources`` order (placeholders only) runs the whole step and returns
    the values named in ``output_nodes``: the forward outputs in ``"infer"`` mode,
    ``(loss, *gradients)`` in ``"train"`` mode.  ``op_nodes`` maps each IR op to its
    fx node, ``node_tensors`` each tensor-valued fx node to the IR tensor it holds (a
    version of it, for in-place ops), ``grads`` each trainable parameter's FQN to the
    IR tensor holding its gradient, ``op_phases`` each IR op to ``"forward"``,
    ``"backward"`` or ``"optimizer"``.

    To execute a schedule of IR ops on real tensors::

        env = program.bind(module, inputs)      # fx node name -> tensor, for every source
        with torch.no_grad():                   # backward ops are explicit: no autograd
            for op in order:
                program.run_op(op, env)         # node.target(*args) with args read from env
                # when a storage dies, for every IR tensor t aliasing it: del env[n] for n in tensor_nodes[t]

    ``run_op`` stores the result under the op's fx node name, binds every ``getitem``
    of a multi-output result and then drops the tuple, so elements nobody reads die
    at once, as the IR assumes.  In-place ops mutate the tensors in ``env`` (and so,
    through ``bind``, the module's own parameters, buffers and given inputs).  To back
    a dynamic IR tensor by planned memory, write the result into the planned buffer
    and store that buffer in ``env`` under the same fx node names.
    """

    graph: Graph
    module: fx.GraphModule
    mode: str
    optimizer: OptimizerSpec | None
    sources: tuple[Source, ...]
    op_nodes: Mapping[str, str]
    node_tensors: Mapping[str, str]
    grads: Mapping[str, str]
    output_nodes: tuple[str | None, ...]
    op_phases: Mapping[str, str]

    @cached_property
    def nodes(self) -> Mapping[str, fx.Node]:
        """The GraphModule's fx nodes by name."""
        return MappingProxyType({n.name: n for n in self.module.graph.nodes})

    @cached_property
    def tensor_nodes(self) -> Mapping[str, tuple[str, ...]]:
        """IR tensor -> the fx nodes whose values are (versions of) it: drop them all to free it."""
        inverse: dict[str, list[str]] = {}
        for node, tensor in self.node_tensors.items():
            inverse.setdefault(tensor, []).append(node)
        return MappingProxyType({t: tuple(ns) for t, ns in inverse.items()})

    @cached_property
    def _getitems(self) -> Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]]:
        return MappingProxyType({n.name: tuple(_getitem_paths(n).items()) for n in self.module.graph.nodes})

    def run_op(self, op: str, env: MutableMapping[str, Any]) -> None:
        """Run IR op ``op`` on the values in ``env`` (keyed by fx node name) and store its results there."""
        self.run_node(self.op_nodes[op], env)

    def run_node(self, name: str, env: MutableMapping[str, Any], keys: Mapping[str, str] = MappingProxyType({})) -> None:
        """Run fx node ``name`` on the values in ``env`` and store its results there.

        ``keys`` renames fx node names to env keys, for reads and writes alike: a
        recompute reruns its original's node but keeps its results apart from the
        original's, and its late readers read them from there.
        """
        node = self.nodes[name]
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: env[keys.get(n.name, n.name)])
        result = node.target(*args, **kwargs)  # type: ignore[operator]
        paths = self._getitems[node.name]
        if not paths:
            env[keys.get(node.name, node.name)] = result
            return
        for item, path in paths:
            value = result
            for i in path:
                value = value[i]
            env[keys.get(item, item)] = value

    def bind(self, module: torch.nn.Module, example_inputs: Any) -> dict[str, Any]:
        """Initial ``env`` for ``run_op``: each source's real value, keyed by fx node name.

        Parameters (detached, sharing storage), buffers and inputs are the module's and
        the given ones; optimizer states are fresh zeros on their parameter's device;
        constants come from the GraphModule.  ``example_inputs`` must have the
        structure the program was captured with.
        """
        params = dict(module.named_parameters())
        buffers = dict(module.named_buffers())
        inputs = dict(_input_leaves(example_inputs))
        env: dict[str, Any] = {}
        for src in self.sources:
            if src.role is SourceRole.PARAM:
                value = params[src.key].detach()
            elif src.role is SourceRole.BUFFER:
                value = buffers[src.key]
            elif src.role is SourceRole.INPUT:
                if src.key not in inputs:
                    raise CaptureError(f"bind: input {src.key!r} missing; expected inputs {sorted(inputs)}")
                value = inputs[src.key]
            elif src.role is SourceRole.CONSTANT:
                value = getattr(self.module, src.key)
            else:
                spec = self.graph.tensor(src.tensor)
                device = params[src.key].device if src.key else next(iter(params.values())).device
                value = torch.zeros(spec.shape or (), dtype=getattr(torch, spec.dtype or "float32"), device=device)
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                raise CaptureError(f"bind: source {src.key!r} is on the meta device; executing needs real tensors")
            env[src.node] = value
        return env


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
            return output["loss"]
        leaves = [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
        if not leaves:
            raise CaptureError(
                f"default loss: the module returned no tensor (got {type(output).__name__}); pass loss_fn"
            )
        first = leaves[0]
    if first.dim() == 0 and first.is_floating_point():
        return first
    return first.float().mean()


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
    gm, slots, grad_params = _trace(module, example_inputs, mode, spec, loss_fn or default_loss)
    name = f"{type(module).__name__}.{mode}" + (f".{spec.name}" if spec else "")
    return _lower(gm, slots, grad_params, name=name, mode=mode, optimizer=spec)


# ---------------------------------------------------------------------------------------------
# Arguments and inputs


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
            f"capture: example_inputs must be a tuple of arguments or a dict of kwargs, got {type(example_inputs).__name__}"
        )
    _input_leaves(example_inputs)  # rejects unsupported leaf types early
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


_CONSTANT_LEAVES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def _input_leaves(example_inputs: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensor leaves of the example inputs with their names, in flattening order."""
    leaves, _ = pytree.tree_flatten_with_path(example_inputs)
    named: list[tuple[str, torch.Tensor]] = []
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            named.append((_input_name(path), leaf))
        elif not isinstance(leaf, _CONSTANT_LEAVES):
            raise CaptureError(
                f"capture: example input {_input_name(path)!r} has unsupported type {type(leaf).__name__}; "
                "expected tensors, or ints, floats, bools, strings or None"
            )
    return named


def _input_name(path: Sequence[Any]) -> str:
    parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    if path and hasattr(path[0], "idx"):
        parts[0] = f"input{parts[0]}"
    return ".".join(parts) or "input"


# ---------------------------------------------------------------------------------------------
# Tracing


@dataclass(frozen=True, slots=True)
class _Slot:
    """A traced function argument: what it binds to and the IR tensor name it wants."""

    role: SourceRole
    key: str
    name: str
    state: str | None = None


def _trace(
    module: torch.nn.Module,
    example_inputs: Any,
    mode: str,
    spec: OptimizerSpec | None,
    loss_fn: Callable[[Any], torch.Tensor],
) -> tuple[fx.GraphModule, list[_Slot], list[str]]:
    """make_fx the step; returns the GraphModule, its placeholder slots in order, and the
    FQNs whose gradients follow the loss in the outputs (train mode)."""
    train = mode == "train"
    params = list(module.named_parameters())
    buffers = list(module.named_buffers())
    inputs = _input_leaves(example_inputs)
    trainable = [name for name, p in params if p.requires_grad] if train else []
    if train and not trainable:
        raise CaptureError(f"capture: {type(module).__name__} has no parameter with requires_grad; nothing to train")

    flat, slots = _fake_sources(params, buffers, inputs, trainable, spec)
    grad_params: list[str] = []  # filled while tracing: trainable params that got a gradient

    def step(*values: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        by_slot = dict(zip(slots, values))
        state = {s.name: v for s, v in by_slot.items()}
        weights = {s.key: v for s, v in by_slot.items() if s.role in (SourceRole.PARAM, SourceRole.BUFFER)}
        args, kwargs = _rebuild_inputs(example_inputs, [v for s, v in by_slot.items() if s.role is SourceRole.INPUT])
        with fx_traceback.annotate({_PHASE: _FORWARD}), torch.set_grad_enabled(train):
            output = torch.func.functional_call(module, weights, args, kwargs)
            if not train:
                leaves = tuple(t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor))
                if not leaves:
                    raise CaptureError(f"capture: {type(module).__name__} returned no tensor")
                return leaves
            loss = loss_fn(output)
        _check_loss(loss)
        leaves_in = [state[name] for name in trainable]
        with fx_traceback.annotate({_PHASE: _BACKWARD}), _backward_annotations(loss):
            raw = torch.autograd.grad(loss, leaves_in, allow_unused=True)
            grads = _own_storages(raw, values)
        pairs = [(name, state[name], g) for name, g in zip(trainable, grads) if g is not None]
        grad_params.extend(name for name, _, _ in pairs)
        if spec is not None:
            with fx_traceback.annotate({_PHASE: _OPTIMIZER}), torch.no_grad():
                _optimizer_update(spec, pairs, state)
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
            stack.enter_context(_module_annotations(module, on_leave=bar.update))
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
    if running_mean is None or running_var is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    if not training:
        return aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
    return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, True, momentum, eps)


#: Decompositions applied while tracing: legacy ops whose schemas hide a mutation.
_ANNOTATED_DECOMPOSITIONS = MappingProxyType({torch.ops.aten.native_batch_norm.default: _annotated_batch_norm})

#: Models with at least this many submodules get a capture progress bar (on a terminal).
PROGRESS_MIN_MODULES = 200

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
) -> tuple[list[torch.Tensor], list[_Slot]]:
    """The traced step's arguments as fake tensors, in placeholder order, with their slots.

    Parameters, buffers, Adam's state (two per trainable parameter, then the shared
    step) and the tensor inputs; only trainable parameters require grad.
    """
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    device = _trace_device([t for _, t in params] + [t for _, t in buffers] + [t for _, t in inputs])
    grad = set(trainable)
    flat: list[torch.Tensor] = []
    slots: list[_Slot] = []

    def add(t: torch.Tensor, slot: _Slot, requires_grad: bool = False) -> None:
        flat.append(_fake(fake_mode, t, device, requires_grad=requires_grad))
        slots.append(slot)

    for name, p in params:
        add(p, _Slot(SourceRole.PARAM, name, name), requires_grad=name in grad)
    for name, b in buffers:
        add(b, _Slot(SourceRole.BUFFER, name, name))
    if spec is not None and spec.name == "adam":
        by_name = dict(params)
        for name in trainable:
            for state in ("exp_avg", "exp_avg_sq"):
                add(by_name[name], _Slot(SourceRole.OPTIMIZER_STATE, name, f"{name}.{state}", state))
        add(
            torch.empty((), dtype=torch.float32, device="meta"),
            _Slot(SourceRole.OPTIMIZER_STATE, "", "adam.step", "step"),
        )
    for name, x in inputs:
        add(x, _Slot(SourceRole.INPUT, name, name))
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


def _rebuild_inputs(example_inputs: Any, tensors: list[torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example_inputs`` with its tensor leaves replaced, as (args, kwargs)."""
    leaves, spec = pytree.tree_flatten(example_inputs)
    it = iter(tensors)
    rebuilt = pytree.tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    if isinstance(rebuilt, dict):
        return (), dict(rebuilt)
    return tuple(rebuilt), {}


def _check_loss(loss: object) -> None:
    if not isinstance(loss, torch.Tensor):
        raise CaptureError(f"capture: the loss must be a tensor, got {type(loss).__name__}")
    if loss.numel() != 1 or not loss.is_floating_point():
        raise CaptureError(
            f"capture: the loss must be a floating-point scalar, got shape {tuple(loss.shape)} dtype {loss.dtype}"
        )
    if not loss.requires_grad:
        raise CaptureError("capture: the loss does not depend on any trainable parameter")


def _own_storages(grads: Sequence[torch.Tensor | None], sources: Sequence[torch.Tensor]) -> list[torch.Tensor | None]:
    """Clone a gradient unless it owns its whole storage alone.

    Autograd may hand two parameters the same tensor (``p + q``), an expanded view
    of a scalar (``p.sum()``), or a slice of a larger buffer (``cat``); eager
    ``AccumulateGrad`` copies those too.  Afterwards each gradient is (a view of) a
    storage of exactly its size that no other gradient or source shares.
    """
    seen = {StorageWeakRef(t.untyped_storage()) for t in sources}
    owned: list[torch.Tensor | None] = []
    for g in grads:
        if g is not None:
            ref = StorageWeakRef(g.untyped_storage())
            if ref in seen or g.untyped_storage().nbytes() != g.numel() * g.element_size():
                g = g.clone()
                ref = StorageWeakRef(g.untyped_storage())
            seen.add(ref)
        owned.append(g)
    return owned


def _optimizer_update(
    spec: OptimizerSpec, pairs: list[tuple[str, torch.Tensor, torch.Tensor]], state: dict[str, torch.Tensor]
) -> None:
    """The in-place parameter update, as torch.optim's single-tensor implementations do it."""
    if spec.name == "sgd":
        for name, p, g in pairs:
            with fx_traceback.annotate({_MODULE: _owner(name)}):
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
        with fx_traceback.annotate({_MODULE: _owner(name)}):
            exp_avg, exp_avg_sq = state[f"{name}.exp_avg"], state[f"{name}.exp_avg_sq"]
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denom = exp_avg_sq.sqrt()
            denom.div_(scale).add_(eps_term)
            p.addcdiv_(exp_avg, denom)


def _owner(fqn: str) -> str | None:
    """The module path owning parameter ``fqn`` (``None`` for the root)."""
    return fqn.rpartition(".")[0] or None


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


@contextmanager
def _module_annotations(module: torch.nn.Module, on_leave: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Annotate every node traced inside a submodule's forward with the submodule's path.

    ``on_leave`` is called as each submodule's forward returns (a progress bar's tick).
    """
    open_scopes: list[Any] = []
    handles = []

    def enter(path: str) -> Callable[..., None]:
        def pre_hook(_module: torch.nn.Module, _args: Any) -> None:
            scope = fx_traceback.annotate({_MODULE: path})
            scope.__enter__()
            open_scopes.append(scope)

        return pre_hook

    def leave(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)
        on_leave()

    try:
        for path, sub in module.named_modules():
            if path:
                handles.append(sub.register_forward_pre_hook(enter(path)))
                handles.append(sub.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _backward_annotations(loss: torch.Tensor) -> Iterator[None]:
    """Mark the ops each autograd node runs in backward with that node's sequence number."""
    open_scopes: list[Any] = []
    handles = []

    def pre_hook(seq: int) -> Callable[..., None]:
        def hook(_grad_outputs: Any) -> None:
            scope = fx_traceback.annotate({_GRAD_FN: seq})
            scope.__enter__()
            open_scopes.append(scope)

        return hook

    def post_hook(_grad_inputs: Any, _grad_outputs: Any) -> None:
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)

    seen: set[torch.autograd.graph.Node] = set()
    stack = [loss.grad_fn] if loss.grad_fn is not None else []
    try:
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            handles.append(node.register_prehook(pre_hook(node._sequence_nr())))
            handles.append(node.register_hook(post_hook))
            stack.extend(fn for fn, _ in node.next_functions if fn is not None and fn not in seen)
        yield
    finally:
        for h in handles:
            h.remove()


# ---------------------------------------------------------------------------------------------
# Lowering the fx graph to the IR


@dataclass
class _Draft:
    """A tensor being built; frozen into ``Tensor`` once kinds are final."""

    nbytes: int
    kind: Kind
    shape: tuple[int, ...]
    dtype: str
    alias_of: str | None = None
    grad_of: str | None = None


@dataclass
class _OpDraft:
    name: str
    type: str
    inputs: list[str]
    outputs: list[str]
    cost: float
    phase: str | None
    module: str | None
    grad_fn: int | None
    seq_nr: int | None
    backward_of: str | None = None


def _lower(
    gm: fx.GraphModule,
    slots: list[_Slot],
    grad_params: list[str],
    *,
    name: str,
    mode: str,
    optimizer: OptimizerSpec | None,
) -> CapturedProgram:
    """Walk the fx graph once, building tensors and ops; then fix kinds, links and outputs."""
    drafts: dict[str, _Draft] = {}
    fake_of: dict[str, torch.Tensor] = {}
    value: dict[fx.Node, Any] = {}  # fx node -> IR name, or nested lists of them for multi-output nodes
    ops: list[_OpDraft] = []
    sources: list[Source] = []
    used: set[str] = set()

    def fresh_name(wanted: str) -> str:
        candidate, i = wanted, 0
        while candidate in used:
            i += 1
            candidate = f"{wanted}_{i}"
        used.add(candidate)
        return candidate

    def new_tensor(wanted: str, fake: torch.Tensor, kind: Kind, alias_of: str | None = None) -> str:
        tname = fresh_name(wanted)
        drafts[tname] = _Draft(
            nbytes=0 if alias_of is not None else _logical_bytes(fake),
            kind=kind,
            shape=tuple(int(s) for s in fake.shape),
            dtype=str(fake.dtype).removeprefix("torch."),
            alias_of=alias_of,
        )
        fake_of[tname] = fake
        return tname

    placeholders = iter(slots)
    output_names: list[str | None] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            slot = next(placeholders)
            kind = {
                SourceRole.PARAM: Kind.PARAM,
                SourceRole.BUFFER: Kind.PARAM,
                SourceRole.INPUT: Kind.INPUT,
                SourceRole.OPTIMIZER_STATE: Kind.OPTIMIZER_STATE,
            }[slot.role]
            value[node] = new_tensor(slot.name, node.meta["val"], kind)
            sources.append(Source(node.name, value[node], slot.role, slot.key, slot.state))
        elif node.op == "get_attr":
            val = node.meta.get("val", getattr(gm, str(node.target), None))
            if isinstance(val, torch.Tensor):
                value[node] = new_tensor(node.name, val, Kind.PARAM)
                sources.append(Source(node.name, value[node], SourceRole.CONSTANT, str(node.target)))
            else:
                value[node] = None
        elif node.op == "call_function" and node.target is operator.getitem:
            parent = value.get(node.args[0])
            value[node] = parent[node.args[1]] if isinstance(parent, list) else None
        elif node.op == "call_function":
            ops.append(_lower_op(node, value, fake_of, new_tensor))
        elif node.op == "output":
            output_names = [
                _flat_name(value.get(a)) if isinstance(a, fx.Node) else None for a in _arg_leaves(node.args[0])
            ]
        else:
            raise CaptureError(f"capture: unsupported fx node {node.name!r} of kind {node.op!r}")

    grads = _mark_grads(drafts, grad_params, output_names[1:] if mode == "train" else [])
    graph_outputs = output_names[:1] if mode == "train" else output_names
    graph_outputs_unique = tuple(dict.fromkeys(o for o in graph_outputs if o is not None))
    for out in graph_outputs_unique:
        if drafts[out].kind is Kind.ACTIVATION:
            drafts[out].kind = Kind.OUTPUT
    _link_backward(ops)

    tensors = tuple(Tensor(n, d.nbytes, d.kind, d.shape, d.dtype, d.alias_of, d.grad_of) for n, d in drafts.items())
    ir_ops = tuple(
        Op(o.name, o.type, tuple(o.inputs), tuple(o.outputs), cost=o.cost, backward_of=o.backward_of, module=o.module)
        for o in ops
    )
    graph = Graph(name, tensors, ir_ops, graph_outputs_unique)
    try:
        graph.validate()
    except GraphError as e:  # a lowering bug, not a user error; keep the message precise anyway
        raise CaptureError(f"capture: the captured graph is malformed: {e}") from e
    node_tensors = {n.name: v for n, v in value.items() if isinstance(v, str)}
    return CapturedProgram(
        graph=graph,
        module=gm,
        mode=mode,
        optimizer=optimizer,
        sources=tuple(sources),
        op_nodes=MappingProxyType({o.name: o.name for o in ops}),
        node_tensors=MappingProxyType(node_tensors),
        grads=MappingProxyType(grads),
        output_nodes=tuple(_output_node_names(gm)),
        op_phases=MappingProxyType({o.name: o.phase or _FORWARD for o in ops}),
    )


def _flat_name(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _output_node_names(gm: fx.GraphModule) -> list[str | None]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [a.name if isinstance(a, fx.Node) else None for a in _arg_leaves(out.args[0])]


def _arg_leaves(arg: Any) -> list[Any]:
    """Leaves of an fx argument structure (nested lists and tuples), ``None`` included."""
    if isinstance(arg, (list, tuple)):
        return [leaf for a in arg for leaf in _arg_leaves(a)]
    return [arg]


def _lower_op(
    node: fx.Node,
    value: dict[fx.Node, Any],
    fake_of: dict[str, torch.Tensor],
    new_tensor: Callable[..., str],
) -> _OpDraft:
    """One IR op for one ATen call: inputs, in-place writes, views and fresh outputs."""
    target = node.target
    schema = target._schema if isinstance(target, torch._ops.OpOverload) else None
    inputs: list[str] = []
    for arg in node.all_input_nodes:
        for t in _names_in(value.get(arg)):
            if t not in inputs:
                inputs.append(t)

    bound = _bind_schema(schema, node) if schema is not None else []
    writes: list[str] = []
    for arg, val in bound:
        if arg.alias_info is not None and arg.alias_info.is_write:
            writes.extend(t for t in _names_in(_arg_value(val, value)) if t not in writes)

    element_names = _getitem_paths(node)
    outputs: list[str] = []
    fresh_bytes = 0

    def lower_value(val: Any, path: tuple[int, ...], ret: Any) -> Any:
        nonlocal fresh_bytes
        if isinstance(val, (list, tuple)):
            return [lower_value(v, path + (i,), ret) for i, v in enumerate(val)]
        if not isinstance(val, torch.Tensor):
            return None
        wanted = node.name if not path else _element_name(node.name, path, element_names)
        base = _alias_base(ret, bound, path, value) if ret is not None else None
        if ret is not None and ret.alias_info is not None and ret.alias_info.is_write and base is not None:
            result = base
        elif ret is not None and ret.alias_info is not None and base is not None:
            result = new_tensor(wanted, val, Kind.ACTIVATION, alias_of=base)
        else:
            same = next((t for t in inputs if fake_of[t] is val), None)
            if same is not None:  # a schema-less in-place op returned its input
                result = same
            else:
                shared = next((t for t in inputs if _same_storage(fake_of[t], val)), None)
                result = new_tensor(wanted, val, Kind.ACTIVATION, alias_of=shared)
                if shared is None:
                    fresh_bytes += _logical_bytes(val)
        if result not in outputs:
            outputs.append(result)
        return result

    val = node.meta.get("val")
    if schema is not None and len(schema.returns) > 1 and isinstance(val, (list, tuple)):
        value[node] = [lower_value(v, (j,), schema.returns[j]) for j, v in enumerate(val)]
    else:
        ret = schema.returns[0] if schema is not None and schema.returns else None
        value[node] = lower_value(val, (), ret)
    for t in writes:
        if t not in outputs:
            outputs.append(t)

    custom = node.meta.get("custom") or {}
    read = sum(_logical_bytes(fake_of[t]) for t in inputs)
    written = fresh_bytes + sum(_logical_bytes(fake_of[t]) for t in writes)
    return _OpDraft(
        name=node.name,
        type=str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target)),
        inputs=inputs,
        outputs=outputs,
        cost=_cost(node, read + written) if written else 0.0,
        phase=custom.get(_PHASE),
        module=custom.get(_MODULE),
        grad_fn=custom.get(_GRAD_FN),
        seq_nr=node.meta.get("seq_nr"),
    )


def _names_in(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return [n for x in v for n in _names_in(x)]
    return []


def _arg_value(val: Any, value: dict[fx.Node, Any]) -> Any:
    """IR names held by an fx argument (a node or a list of nodes)."""
    if isinstance(val, fx.Node):
        return value.get(val)
    if isinstance(val, (list, tuple)):
        return [_arg_value(v, value) for v in val]
    return None


def _bind_schema(schema: torch._C.FunctionSchema, node: fx.Node) -> list[tuple[Any, Any]]:
    """(schema argument, fx value) pairs for the arguments the node passes."""
    bound = []
    for i, arg in enumerate(schema.arguments):
        if not arg.kwarg_only and i < len(node.args):
            bound.append((arg, node.args[i]))
        elif arg.name in node.kwargs:
            bound.append((arg, node.kwargs[arg.name]))
    return bound


def _alias_base(ret: Any, bound: list[tuple[Any, Any]], path: tuple[int, ...], value: dict[fx.Node, Any]) -> str | None:
    """The IR tensor a schema return aliases: the argument sharing its alias set.

    A list return such as ``split``'s ``Tensor(a)[]`` exposes no alias set, so the
    first aliased argument is the base; a list argument pairs element by element.
    """
    info = ret.alias_info
    if info is None:
        return None
    candidates = [
        (arg, val) for arg, val in bound if arg.alias_info is not None and arg.alias_info.is_write == info.is_write
    ]
    match = [(a, v) for a, v in candidates if a.alias_info.before_set & info.before_set] or candidates
    if not match:
        return None
    names = _arg_value(match[0][1], value)
    if isinstance(names, list):
        index = path[-1] if path else 0
        names = names[index] if index < len(names) else None
    return names if isinstance(names, str) else None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())


def _getitem_paths(node: fx.Node) -> dict[str, tuple[int, ...]]:
    """fx node name -> index path, for every (nested) ``getitem`` reading ``node``'s result."""
    paths: dict[str, tuple[int, ...]] = {}
    frontier: list[tuple[fx.Node, tuple[int, ...]]] = [(node, ())]
    while frontier:
        current, prefix = frontier.pop()
        for user in current.users:
            if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
                paths[user.name] = prefix + (user.args[1],)
                frontier.append((user, prefix + (user.args[1],)))
    return paths


def _element_name(node: str, path: tuple[int, ...], element_names: dict[str, tuple[int, ...]]) -> str:
    for name, p in element_names.items():
        if p == path:
            return name
    return node + "".join(f".{i}" for i in path)


def _logical_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _cost(node: fx.Node, moved_bytes: int) -> float:
    """Roofline microseconds: ``max(FLOPs / FLOPS_PER_US, bytes moved / BYTES_PER_US, MIN_COST_US)``.

    FLOPs come from ``torch.utils.flop_counter``'s formula where one exists (matmul,
    conv, attention), else count as 0; bytes moved are the logical sizes read and
    written.
    """
    flops = 0.0
    packet = getattr(node.target, "overloadpacket", None)
    if packet is not None and packet in flop_registry:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        try:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=node.meta.get("val")))
        except (TypeError, ValueError, IndexError, AttributeError, RuntimeError):
            flops = 0.0  # a formula that does not fit this overload's arguments: bytes decide
    return max(flops / FLOPS_PER_US, moved_bytes / BYTES_PER_US, MIN_COST_US)


def _mark_grads(drafts: dict[str, _Draft], params: list[str], grad_names: list[str | None]) -> dict[str, str]:
    """Give each parameter's gradient storage kind ``grad`` and ``grad_of``; views of it kind ``grad``."""

    def root(t: str) -> str:
        while (parent := drafts[t].alias_of) is not None:
            t = parent
        return t

    grads: dict[str, str] = {}
    roots: set[str] = set()
    for param, g in zip(params, grad_names):
        assert g is not None, f"gradient of {param} is not a tensor"
        r = root(g)
        assert drafts[r].kind is Kind.ACTIVATION and r not in roots, f"gradient of {param} does not own its storage"
        drafts[r].kind = Kind.GRAD
        drafts[r].grad_of = param
        roots.add(r)
        grads[param] = g
    for t, d in drafts.items():
        if d.alias_of is not None and root(t) in roots:
            d.kind = Kind.GRAD
    return grads


def _link_backward(ops: list[_OpDraft]) -> None:
    """Set ``backward_of`` and inherited ``module`` on backward ops (see the module docstring)."""
    forward_of_seq: dict[int, _OpDraft] = {}
    for o in ops:
        if o.phase == _FORWARD and o.seq_nr is not None:
            forward_of_seq.setdefault(o.seq_nr, o)
    backward = [o for o in ops if o.phase == _BACKWARD]
    for o in backward:
        fwd = forward_of_seq.get(o.grad_fn) if o.grad_fn is not None else None
        if fwd is not None:
            o.backward_of, o.module = fwd.name, fwd.module
    # Engine-run ops: inherit from the first consumer with a link, then from input producers.
    producer: dict[str, _OpDraft] = {}
    consumers: dict[str, list[_OpDraft]] = {}
    for o in ops:
        for t in o.outputs:
            if t not in o.inputs:
                producer.setdefault(t, o)
        for t in o.inputs:
            consumers.setdefault(t, []).append(o)
    by_name = {o.name: o for o in ops}
    for o in reversed(backward):
        if o.backward_of is None:
            linked = next((c for t in o.outputs for c in consumers.get(t, ()) if c.backward_of), None)
            if linked is not None:
                o.backward_of = linked.backward_of
    for o in backward:
        if o.backward_of is None:
            linked = next((p for t in o.inputs if (p := producer.get(t)) is not None and p.backward_of), None)
            if linked is not None:
                o.backward_of = linked.backward_of
        if o.backward_of is not None and o.grad_fn is None:
            o.module = by_name[o.backward_of].module
    assert all(math.isfinite(o.cost) for o in ops)

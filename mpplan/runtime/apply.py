"""``apply``: run a model with a plan's placement and recompute inside an ordinary training loop.

``apply(model, plan, example_inputs)`` returns a ``PlannedModule`` wrapping
``model``; ``out = m(*inputs)``, ``loss.backward()`` and ``optimizer.step()`` on
``m.parameters()`` (the model's own parameters) work as usual.  Unlike accelerate's
``dispatch_model`` it trains: every device move is an autograd-visible ``Tensor.to``.

What it does, from the plan and the captured graph:

* every parameter and buffer moves (``param.data``, so optimizers keep working) to
  the home device of its storage: the device of the ops that use or update it;
* every submodule that runs ops of its own runs on the device the plan gave the
  first of its forward ops that computes (not just a view): a forward pre-hook
  moves its tensor inputs there;
* while the wrapped forward runs, a ``TorchFunctionMode`` moves the arguments of
  any call that mixes devices (a residual add across a cut, a tied weight read on a
  second device) to the device of the innermost running submodule: the plan's
  cross-device copies, done differentiably, so their gradients flow back;
* the plan's recomputes (``Plan.remat``) are honoured call by call
  (``mpplan.runtime.recompute``): autograd keeps a recipe instead of each
  recomputed result, and the backward node that needs it reruns that one ATen call,
  where the plan put ``F@recompute``.  Recomputes of the loss's own ops (made after
  the module returns) are out of reach and left out (``PlannedModule.recompute_ops``
  lists those honoured).  A record's cut point (``from_op``) may be any backward reader
  of its tensor: the backward nodes before it read the original, kept for them
  (``mpplan.runtime.apply_cuts``);
* backward ops run where autograd runs them, on their forward op's device, which
  is the rule the planner places backward ops by; gradients and optimizer state
  live with their parameter, as planned;
* with ``step_in_backward=optimizer`` (or ``PlannedModule.step_in_backward``), the
  user's optimizer updates each parameter as soon as backward has made its
  gradient, and the gradient is freed at once (``mpplan.runtime.apply_step``): the
  gradients and the optimizer's temporaries no longer pile up at the step's end.
  An option, because a loop that clips, accumulates or scales gradients between
  ``backward()`` and ``step()`` needs them all.

Memory is eager autograd's (saved tensors, ``.grad``, the optimizer's temporaries),
not the plan's arenas: ``PlannedModule.prediction()`` is the peak predicted for
that (``mpplan.runtime.apply_memory``), which the tests hold the measured peak to.
On a GPU the kernels also take workspaces no traced value shows: run one step inside
``with m.probing():`` and the prediction holds them from then on
(``mpplan.runtime.apply_workspace``).
What it does not honour: the plan's op order, its frees, arenas and offsets, and
cuts that fall inside one submodule's own code (those ops follow the submodule's
first op).  ``evaluate`` is the faithful, measured execution of the plan itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from mpplan.capture.torch_capture import CapturedProgram, OptimizerSpec, SourceRole
from mpplan.plan import Plan
from mpplan.runtime.allocation import cuda_block_bytes
from mpplan.runtime.apply_memory import ApplyPrediction, predict_apply
from mpplan.runtime.apply_step import StepInBackward, optimizer_path as optimizer_path_of
from mpplan.runtime.apply_workspace import op_workspaces, probing_calls
from mpplan.runtime.devices import DevicesArg, map_devices
from mpplan.runtime.recompute import RecomputeHooks, RecomputePolicy, module_calls
from mpplan.runtime.schedule import compile_schedule
from mpplan.runtime.trace import capture_for
from mpplan.runtime.workspace import WorkspaceProbe

__all__ = ["PlannedModule", "apply", "module_devices"]


def apply(
    model: torch.nn.Module,
    plan: Plan,
    example_inputs: Any,
    *,
    mode: str = "train",
    optimizer: str | OptimizerSpec | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    devices: DevicesArg = None,
    step_in_backward: torch.optim.Optimizer | None = None,
) -> PlannedModule:
    """Place ``model`` as ``plan`` says and return it wrapped for an ordinary loop.

    ``mode``, ``optimizer`` and ``loss_fn`` must be what the plan's graph was captured
    with (the graph hash is checked).  ``model``'s parameters and buffers are moved in
    place (the same ``Parameter`` objects, so an optimizer made before or after works);
    ``step_in_backward``: the user's optimizer, to step per parameter inside backward
    (module docstring).  ``PlannedModule.remove()`` takes the hooks off again.
    """
    device_map = map_devices([d.name for d in plan.devices], devices)
    first = device_map.torch_device(plan.devices[0].name)
    program = capture_for(model, example_inputs, first, mode=mode, optimizer=optimizer, loss_fn=loss_fn)
    schedule = compile_schedule(program, plan)
    placed = schedule.placed
    topo = placed.graph.topology
    homes: dict[str, str] = {}
    for src in program.sources:
        if src.role in (SourceRole.PARAM, SourceRole.BUFFER):
            s = topo.storage_of[topo.tensor_index[src.tensor]]
            homes[src.key] = placed.storage_device[s]
    per_module = module_devices(program, schedule)
    recompute = None
    if plan.remat and mode == "train":
        recompute = RecomputePolicy.from_records(program, plan.remat)
    wrapped = PlannedModule(
        model,
        {k: str(device_map.torch_device(d)) for k, d in homes.items()},
        {m: str(device_map.torch_device(d)) for m, d in per_module.items()},
        planned={m: d for m, d in per_module.items()},
        recompute=recompute,
        program=program,
    )
    if wrapped.hooks is not None:  # index the recomputes by the calls a real forward makes
        wrapped.hooks.policy = wrapped.hooks.policy.aligned(module_calls(wrapped, example_inputs))
    if step_in_backward is not None:
        wrapped.step_in_backward(step_in_backward)
    return wrapped


def module_devices(program: Any, schedule: Any) -> dict[str, str]:
    """Submodule path (``""`` for the root) -> planned device of the first forward op it runs itself.

    Ops that only make views are skipped when the module has others: the copy pass
    runs a view where its base lives (``t`` of a tied weight sits with the
    embedding), which says nothing about where the module computes.
    """
    graph = schedule.graph
    computing: dict[str, str] = {}
    viewing: dict[str, str] = {}
    for step in schedule.steps:
        if step.copy is not None or program.op_phases.get(step.op) != "forward":
            continue
        op = graph.op(step.op)
        module = op.module or ""
        pure_view = bool(op.outputs) and all(
            graph.tensor(t).alias_of is not None and t not in op.inputs for t in op.outputs
        )
        (viewing if pure_view else computing).setdefault(module, step.device)
    return {**viewing, **computing}


class PlannedModule(torch.nn.Module):
    """``module`` with its parameters placed and its submodules pinned to devices (see ``apply``).

    ``param_devices`` maps parameter and buffer FQNs to torch devices,
    ``module_devices`` submodule paths to torch devices, ``planned`` submodule paths
    to planned device names (for reports), ``recompute`` the forward calls to
    recompute (``None``: none).  ``program`` is the captured program ``apply``
    planned from (what ``prediction`` scores); ``hooks`` the recompute hooks, whose
    ``mismatch`` says whether the module ran the calls the graph lists.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        param_devices: Mapping[str, str],
        module_devices: Mapping[str, str],
        *,
        planned: Mapping[str, str] | None = None,
        recompute: RecomputePolicy | None = None,
        program: CapturedProgram | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.program = program
        self.hooks = RecomputeHooks(recompute) if recompute is not None and recompute.recompute else None
        self.param_devices = MappingProxyType(dict(param_devices))
        self.module_devices = MappingProxyType(dict(module_devices))
        self.planned = MappingProxyType(dict(planned or {}))
        self.stepping: StepInBackward | None = None
        #: IR op -> the workspace its kernels took in the last step run under ``probing`` (bytes), and the
        #: workspaces of calls there like no IR op's (call key -> bytes; the prediction does not hold them).
        self.workspaces: dict[str, int] = {}
        self.unmatched_workspaces: dict[str, int] = {}
        self._stack: list[torch.device] = []
        self._handles: list[Any] = []
        self._place_state()
        self._install_hooks()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        root = self.module_devices.get("")
        if root is not None:
            with self._moving():  # the user's inputs may or may not be there already: not a call of the graph
                args, kwargs = _to_device((args, kwargs), torch.device(root))
        with self._mixed_device_moves():
            if self.hooks is None:
                return self.module(*args, **kwargs)
            with self.hooks.forward():
                return self.module(*args, **kwargs)

    @property
    def recompute_ops(self) -> tuple[str, ...]:
        """The plan's recomputed forward ops this module honours (IR names)."""
        return self.hooks.policy.ops if self.hooks is not None else ()

    def step_in_backward(self, optimizer: torch.optim.Optimizer) -> StepInBackward:
        """Step ``optimizer`` per parameter inside backward from now on (``mpplan.runtime.apply_step``)."""
        if self.stepping is not None:
            self.stepping.remove()
        self.stepping = StepInBackward(optimizer)
        return self.stepping

    def prediction(self, optimizer_path: str | None = None) -> ApplyPrediction:
        """The peak this module is predicted to hold per step in a user's loop, all devices together.

        ``optimizer_path`` is how ``torch.optim`` runs the update: ``"foreach"``
        (its default when the parameters are on CUDA) or ``"single"`` (elsewhere);
        ``None`` reads it from the optimizer stepping in backward, if any, else picks
        that default from where the parameters are.  The step in backward is modelled
        while it is on.  With the parameters on CUDA each storage counts as the caching
        allocator rounds it (``allocation``), and the workspaces of a probed step
        (``probing``) are held at their ops' steps.
        """
        if self.program is None:
            raise ValueError("prediction: this PlannedModule was not made by apply (it has no captured program)")
        if optimizer_path is None and self.stepping is not None:
            optimizer_path = optimizer_path_of(self.stepping.optimizer)
        devices = {p.device.type for p in self.module.parameters()}
        on_cuda = devices == {"cuda"}
        if optimizer_path is None:
            optimizer_path = "foreach" if on_cuda else "single"
        return predict_apply(self.program, self.recompute_ops, optimizer_path=optimizer_path,
                             step_in_backward=self.stepping is not None,
                             from_ops=self.hooks.policy.from_ops if self.hooks is not None else None,
                             workspaces=self.workspaces, allocation=cuda_block_bytes if on_cuda else None)

    @contextmanager
    def probing(self, probe: WorkspaceProbe | None = None,
                device_types: tuple[str, ...] = ("cuda",)) -> Iterator[WorkspaceProbe]:
        """Measure the workspaces the GPU kernels of the steps run inside take (one step is enough);
        ``prediction`` holds each at its op's step from then on, until the next probe replaces them.

        The probe resets the allocator's peak statistics around each call, so measure peaks after it.
        With ``torch.backends.cudnn.benchmark`` on, the first step tries several algorithms and their
        workspaces: probe a later step.  One GPU at a time (``apply_workspace.probing_calls``).
        ``probe`` reads the CUDA allocator by default; ``device_types`` are the devices whose calls it
        probes (tests probe the CPU's with a simulated allocator).
        """
        if self.program is None:
            raise ValueError("probing: this PlannedModule was not made by apply (it has no captured program)")
        with probing_calls(probe if probe is not None else WorkspaceProbe(), device_types) as used:
            yield used
        self.workspaces, self.unmatched_workspaces = op_workspaces(self.program, used.found)

    def remove(self) -> None:
        """Take the hooks off (parameters stay where they are); the optimizer steps at ``step()`` again."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.stepping is not None:
            self.stepping.remove()
            self.stepping = None

    def _place_state(self) -> None:
        with torch.no_grad():
            for name, param in self.module.named_parameters():
                target = self.param_devices.get(name)
                if target is not None and param.device != torch.device(target):
                    param.data = param.data.to(target)
            for path, owner in self.module.named_modules():
                for key, buf in list(owner._buffers.items()):
                    fqn = f"{path}.{key}" if path else key
                    target = self.param_devices.get(fqn)
                    if buf is not None and target is not None and buf.device != torch.device(target):
                        owner._buffers[key] = buf.to(target)

    def _install_hooks(self) -> None:
        for path, sub in self.module.named_modules():
            device = self.module_devices.get(path)
            if device is None:
                continue
            self._handles.append(sub.register_forward_pre_hook(self._enter(torch.device(device)), with_kwargs=True))
            self._handles.append(sub.register_forward_hook(self._leave, always_call=True))

    def _enter(self, device: torch.device) -> Callable[..., Any]:
        def hook(_module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
            self._stack.append(device)
            with self._moving():
                return _to_device((args, kwargs), device)

        return hook

    def _leave(self, _module: torch.nn.Module, _args: Any, _output: Any) -> None:
        if self._stack:
            self._stack.pop()

    @contextmanager
    def _mixed_device_moves(self) -> Iterator[None]:
        with _MixedDeviceMode(self._stack, self._moving):
            yield

    @contextmanager
    def _moving(self) -> Iterator[None]:
        """The plan's copies: calls the graph does not list, so the recompute hooks don't count them."""
        if self.hooks is None:
            yield
            return
        with self.hooks.paused():
            yield


class _MixedDeviceMode(TorchFunctionMode):
    """Move the tensor arguments of a call that mixes devices to the innermost running submodule's device."""

    def __init__(self, stack: list[torch.device], moving: Callable[[], Any]) -> None:
        super().__init__()
        self.stack = stack
        self.moving = moving

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.stack:
            found = {t.device for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and _pinned(t)}
            if len(found) > 1:
                with self.moving():
                    args, kwargs = _to_device((args, kwargs), self.stack[-1])
        return func(*args, **kwargs)


def _pinned(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s device matters to a call: all but CPU scalars, which mix with any device.

    A 0-dim tensor on a GPU does not mix with another GPU's tensors.
    """
    return tensor.dim() > 0 or tensor.device.type != "cpu"


def _to_device(values: Any, device: torch.device) -> Any:
    return pytree.tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) and v.device != device else v, values)

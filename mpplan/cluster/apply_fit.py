"""``search.fit: apply``: judge a point by the memory of the user's own loop under ``mpplan.apply``.

With ``fit: plan`` (the default) a point fits when the plan's own peak, run by
mpplan's executor, fits the devices.  A user who trains in their own loop holds
eager autograd's memory instead (saved tensors, ``.grad``, ``torch.optim``'s
temporaries), which ``apply`` predicts.  With ``fit: apply``:

- the driver captures the program and plans each point with
  ``runtime.apply_budget.plan_for_apply`` (the least recompute whose ``apply``
  prediction fits), at the point's remat budget when it names bytes or a fraction,
  never above the smallest device's usable capacity (``apply_budget``);
- the evaluator (``ApplyEvaluator``) trains the model through ``apply`` in a plain
  loop with the user's optimizer and reports the peak that loop holds (on a GPU,
  where other kernels may make another graph, it plans the point there again);
- with ``search.step_in_backward: true`` both model and run the loop with the
  optimizer stepping per parameter inside backward (``mpplan.runtime.apply_step``),
  which frees each gradient as soon as its parameter is updated.

``apply`` predicts all devices together, so the prediction and the measurement are
held to the smallest device: exact on one device, conservative on several.  The
optimizer runs torch's path for the planned devices (``optimizer_path``): foreach
on CUDA, one tensor at a time elsewhere, in the prediction and the measurement alike.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mpplan.budget import capacity_fraction
from mpplan.cluster.evaluator import DeviceOutOfMemory
from mpplan.cluster.records import Candidate
from mpplan.config import Config, Device
from mpplan.errors import ConfigError
from mpplan.passes.remat.api import resolve_budget
from mpplan.planner import PlannerSettings

#: Learning rates of the loop's optimizers (their values do not change the memory).
_LEARNING_RATE = {"adam": 1e-3, "sgd": 1e-2}


def stepped_in_backward(config: Config, asked: bool) -> bool:
    """Whether the loop steps its optimizer per parameter inside backward: ``asked`` (``search.step_in_backward``)
    and a training loop with an optimizer, the only kind with a step to move.

    The prediction and the measurement both decide it here, so they model the same loop.
    """
    spec = config.model.torch
    return asked and spec is not None and spec.mode == "train" and spec.optimizer != "none"


def optimizer_path(names: Sequence[str]) -> str:
    """How ``torch.optim`` runs the update on the devices ``names``: ``foreach`` when all are CUDA
    (its default there), else ``single``.

    >>> optimizer_path(["cuda:0", "cuda:1"]), optimizer_path(["cpu"])
    ('foreach', 'single')
    """
    return "foreach" if names and all(n.startswith("cuda") for n in names) else "single"


def apply_budget(settings: PlannerSettings, devices: Sequence[Device], unplanned_peak: int) -> int:
    """The bytes ``apply``'s predicted peak must stay under at one point.

    The smallest device's usable capacity, lowered to the remat budget when
    ``planner.remat.policy`` is ``budget``: bytes as given, a fraction of capacity
    (``0.8 capacity``) of the smallest device, a bare fraction of the unplanned peak.
    """
    capacity = min(d.usable for d in devices)
    budget = settings.remat_budget if settings.remat == "budget" else None
    if budget is None:
        return capacity
    of_capacity = capacity_fraction(budget)
    if of_capacity is not None:
        return min(capacity, int(of_capacity * min(d.capacity for d in devices)))
    return min(capacity, resolve_budget(budget, unplanned_peak))


@dataclass(frozen=True, slots=True)
class ApplyPoint:
    """A point planned for the user's loop: the plan, its graph's hash, and ``apply``'s prediction."""

    plan: Any
    graph_hash: str
    predicted_peak_bytes: int
    budget_bytes: int


@dataclass(frozen=True, slots=True)
class ApplyMisfit:
    """A point no recompute fits: ``apply``'s least predicted peak is ``missing_bytes`` above ``budget_bytes``."""

    budget_bytes: int
    missing_bytes: int

    @property
    def least_peak_bytes(self) -> int:
        return self.budget_bytes + self.missing_bytes


def plan_point(
    config: Config, devices: Sequence[Device], settings: PlannerSettings, on: str = "cpu",
    step_in_backward: bool = False,
) -> ApplyPoint | ApplyMisfit:
    """Plan ``config``'s point so ``apply``'s peak fits, or say by how much no recompute fits.

    Captures ``model.torch`` on the torch device ``on`` (the driver: the CPU, no GPU
    needed) with the module's real calls there, so the prediction counts only the
    recomputes ``apply`` honours.  ``step_in_backward``: the loop steps its optimizer
    per parameter inside backward (``search.step_in_backward``).
    """
    import torch

    from mpplan.capture import build_torch_model
    from mpplan.errors import InfeasibleError
    from mpplan.runtime.allocation import cuda_block_bytes
    from mpplan.runtime.apply_budget import plan_for_apply
    from mpplan.runtime.apply_memory import predict_apply
    from mpplan.runtime.recompute import module_calls
    from mpplan.runtime.trace import capture_for

    spec = config.model.torch
    if spec is None:
        raise ConfigError(f"{config.source}: search.fit: apply needs model.torch (a model to train in your loop)")
    model, inputs = build_torch_model(config, device=on)
    optimizer = None if spec.optimizer == "none" else spec.optimizer
    program = capture_for(model, inputs, torch.device(on), mode=spec.mode, optimizer=optimizer, loss_fn=None)
    path = optimizer_path([d.name for d in devices])
    in_backward = stepped_in_backward(config, step_in_backward)
    # On CUDA (foreach's devices) every storage counts as the caching allocator rounds it.
    rounding = cuda_block_bytes if path == "foreach" else None
    unplanned = predict_apply(program, optimizer_path=path, step_in_backward=in_backward,
                              allocation=rounding).peak_bytes
    budget = apply_budget(settings, devices, unplanned)
    calls = module_calls(model, inputs) if spec.mode == "train" else None
    try:
        fitted = plan_for_apply(program, devices, settings, budget, calls=calls, optimizer_path=path,
                                step_in_backward=in_backward, allocation=rounding)
    except InfeasibleError as exc:
        return ApplyMisfit(budget, max(1, exc.missing_bytes or 1))
    return ApplyPoint(fitted.plan, program.graph.content_hash, fitted.prediction.peak_bytes, budget)


@dataclass
class ApplyEvaluator:
    """Measures a candidate in the user's own loop: ``apply``, then ``zero_grad``, forward, backward, ``step``.

    The optimizer is ``torch.optim``'s own for ``model.torch.optimizer`` on the path
    ``optimizer_path`` names.  On CUDA the peak is ``max_memory_allocated`` over the
    steps after the first (Adam makes its state in the first), less what the GPU held before the model came
    (``devices.allocator_base``: cuBLAS's workspaces, created first); on virtual devices it
    is the storage meter's over the same steps.  With ``step_in_backward`` the
    optimizer steps inside backward (``PlannedModule.step_in_backward``), as predicted.
    The whole loop's peak is reported against the plan's first device (``apply``
    predicts all devices together: its prediction has no per-device peaks).
    """

    steps: int = 3
    step_in_backward: bool = False
    """``search.step_in_backward``: the optimizer steps per parameter inside backward."""

    def __call__(self, candidate: Candidate) -> dict[str, Any]:
        import torch

        from mpplan.capture import build_torch_model
        from mpplan.capture.torch_capture import default_loss
        from mpplan.runtime.apply import apply
        from mpplan.runtime.devices import allocator_base, map_devices

        config, planned = candidate.config, candidate.plan
        spec = config.model.torch
        if spec is None:
            raise ConfigError(f"{config.source}: search.fit: apply needs model.torch")
        device_map = map_devices([d.name for d in planned.devices])
        first = device_map.torch_device(planned.devices[0].name)
        on_cuda = first.type == "cuda"
        base = 0
        if on_cuda:  # the driver planned on the CPU: a GPU's kernels may make another graph, planned here again
            planned = self._replanned(config, planned, str(first), self.step_in_backward)
            # What the GPU holds before the model comes, cuBLAS's workspaces made now included, is not the loop's.
            base = allocator_base(device_map)[str(first)].allocated
        model, inputs = build_torch_model(config, device="cpu")
        optimizer = None if spec.optimizer == "none" else spec.optimizer
        wrapped = apply(model, planned, inputs, mode=spec.mode, optimizer=optimizer, devices=device_map.to_dict())
        opt = self._optimizer(wrapped, optimizer, optimizer_path([d.name for d in planned.devices]))
        if opt is not None and stepped_in_backward(config, self.step_in_backward):
            wrapped.step_in_backward(opt)  # the loop's opt.step() then finds no gradient and does nothing
        inputs = [x.to(first) if isinstance(x, torch.Tensor) else x for x in inputs] if on_cuda else inputs
        meter, mode = None, None
        if not on_cuda:
            from mpplan.runtime.tracking import MeteringMode, StorageMeter

            meter = StorageMeter("cpu")
            meter.register([list(wrapped.parameters()), list(wrapped.buffers()), inputs], pinned=True)
            mode = lambda: MeteringMode(meter, torch.device("cpu"))  # noqa: E731 - one context per step
        times: list[float] = []
        for i in range(max(2, self.steps + 1)):
            if i == 1:
                if on_cuda:
                    torch.cuda.synchronize(first)
                    torch.cuda.reset_peak_memory_stats(first)
                else:
                    assert meter is not None
                    meter.reset_peaks()
            clock = time.perf_counter()
            if mode is None:  # on a GPU the first step probes its kernels' workspaces, which the prediction holds
                with wrapped.probing() if i == 0 else contextlib.nullcontext():
                    self._step(wrapped, opt, inputs, default_loss, spec.mode)
                torch.cuda.synchronize(first)
            else:
                with mode():
                    self._step(wrapped, opt, inputs, default_loss, spec.mode)
            if i >= 1:
                times.append(time.perf_counter() - clock)
        if on_cuda:
            peak = max(int(torch.cuda.max_memory_allocated(first)) - base, 0)
        else:
            assert meter is not None
            meter.sample()
            peak = int(meter.peaks["cpu"])
        predicted = wrapped.prediction(optimizer_path([d.name for d in planned.devices])).peak_bytes
        return {
            "devices": [{"name": planned.devices[0].name, "measured_peak_bytes": peak}],
            "step_time_s": statistics.median(times),
            "fit": "apply",
            "apply_predicted_peak_bytes": predicted,
            "recomputed": 0 if wrapped.hooks is None else wrapped.hooks.recomputed,
        }

    @staticmethod
    def _replanned(config: Config, planned: Any, device: str, step_in_backward: bool) -> Any:
        """``planned``, or the plan of the graph captured on ``device`` when that graph is another."""
        from mpplan.config import resolve_devices

        point = plan_point(config, resolve_devices(config), PlannerSettings.from_config(config.planner), on=device,
                           step_in_backward=step_in_backward)
        if isinstance(point, ApplyMisfit):
            raise DeviceOutOfMemory(
                f"{device}: no recompute fits apply's loop in {point.budget_bytes} bytes "
                f"(the least it reaches is {point.least_peak_bytes})"
            )
        return planned if point.graph_hash == planned.graph_hash else point.plan

    @staticmethod
    def _optimizer(module: Any, name: str | None, path: str) -> Any:
        import torch

        if name is None:
            return None
        cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[name]
        return cls(module.parameters(), lr=_LEARNING_RATE[name], foreach=path == "foreach")

    @staticmethod
    def _step(module: Any, opt: Any, inputs: Any, loss_of: Any, mode: str) -> None:
        import torch

        if mode != "train":
            with torch.no_grad():
                module(*inputs)
            return
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        else:  # no optimizer: the loop still drops last step's gradients, as zero_grad would
            for p in module.parameters():
                p.grad = None
        loss = loss_of(module(*inputs))
        loss.backward()
        if opt is not None:
            opt.step()
        del loss

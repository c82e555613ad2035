"""``evaluate``: execute a plan for real, measure every device, compare with eager PyTorch.

The model is captured again (``capture_program`` on the real module, fake tensors,
nothing allocated) and the plan must be for exactly that graph.  The plan then
runs ``warmup + steps`` times through an ``Executor``; peaks and times are taken
over the timed steps, and the first step's results are kept for the numerics
check.  The eager baseline runs the original module the ordinary way on one
device (the first planned device's).  If the numerics disagree, a lock-step run
against an op-by-op reference finds the first op that went wrong.

Nothing of the caller's model changes: the executor clones what it binds and the
baseline runs on a deep copy.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mpplan.capture.torch_capture import CapturedProgram, OptimizerSpec
from mpplan.plan import Plan
from mpplan.runtime import devices as devices_mod
from mpplan.runtime.allocation import allocated, cuda_block_bytes
from mpplan.runtime.devices import DeviceMap, DevicesArg, map_devices
from mpplan.runtime.eager import EagerRun, Snapshot, run_eager
from mpplan.runtime.executor import Executor, StepValues
from mpplan.runtime.measure import DeviceMeasurement, Measurement, Numerics, error_pct
from mpplan.runtime.numerics import compare, first_bad_op, grounded_in_noise
from mpplan.runtime.schedule import Schedule, compile_schedule
from mpplan.runtime.scratch import held_by_run, held_without_arena
from mpplan.runtime.trace import capture_for
from mpplan.runtime.tracking import StorageMeter
from mpplan.runtime.workspace import WorkspaceProbe

__all__ = ["evaluate", "evaluate_program"]

logger = logging.getLogger("mpplan")


def evaluate(
    plan: Plan,
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    mode: str = "train",
    optimizer: str | OptimizerSpec | None = None,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 3,
    warmup: int = 1,
    arena: bool = True,
    devices: DevicesArg = None,
    eager: bool = True,
    seed: int = 0,
) -> Measurement:
    """Run ``plan`` on ``model`` for real and measure it against its prediction and against eager.

    ``mode``, ``optimizer`` and ``loss_fn`` must be those the plan's graph was
    captured with (the graph hash is checked; ``PlanError`` otherwise).  ``arena``
    backs every dynamic tensor by its planned offset; without it each tensor is its
    own allocation, freed after its last use.  ``devices`` maps planned devices to
    torch devices (see ``map_devices``; default: GPUs when there are enough, else
    virtual devices in CPU memory).  ``eager=False`` skips the baseline and with it
    the numerics check.  The capture traces kernels for the first planned device's
    torch device (``capture_for``), so a plan for a GPU run must come from a graph
    traced for the GPU.
    """
    device_map = map_devices([d.name for d in plan.devices], devices)
    program = capture_for(
        model, example_inputs, device_map.torch_device(plan.devices[0].name), mode=mode, optimizer=optimizer,
        loss_fn=loss_fn,
    )
    return evaluate_program(
        program, plan, model, example_inputs, loss_fn=loss_fn, steps=steps, warmup=warmup, arena=arena,
        devices=device_map.to_dict(), eager=eager, seed=seed,
    )


def evaluate_program(
    program: CapturedProgram,
    plan: Plan,
    model: torch.nn.Module,
    example_inputs: Any,
    *,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    steps: int = 3,
    warmup: int = 1,
    arena: bool = True,
    devices: DevicesArg = None,
    eager: bool = True,
    seed: int = 0,
) -> Measurement:
    """``evaluate`` with an already captured ``program`` of ``model`` (saves the capture when reused).

    The program must have been traced for the devices it runs on (``capture_for``).
    """
    if steps < 1 or warmup < 0:
        raise ValueError(f"evaluate: expected steps >= 1 and warmup >= 0, got steps={steps}, warmup={warmup}")
    schedule = compile_schedule(program, plan)
    device_map = map_devices([d.name for d in plan.devices], devices)
    planned = _run_planned(schedule, model, example_inputs, device_map, arena=arena, steps=steps, warmup=warmup,
                           seed=seed)
    baseline: EagerRun | None = None
    numerics: Numerics | None = None
    if eager:
        eager_device = device_map.torch_device(plan.devices[0].name)
        baseline = run_eager(
            model, example_inputs, mode=program.mode, optimizer=program.optimizer, loss_fn=loss_fn,
            device=eager_device, steps=steps, warmup=warmup, seed=seed,
        )
        _release(device_map)
        if len(plan.devices) > 1:
            baseline = EagerRun(
                dataclasses.replace(
                    baseline.measurement,
                    note="one-device eager baseline; an accelerate-style naive split over the planned devices "
                    "is not measured",
                ),
                baseline.snapshot,
            )
        mine = _complete(planned.snapshot, model)
        numerics = compare(mine, baseline.snapshot)
        if not numerics.ok:
            def eager_again() -> Snapshot:
                again = run_eager(
                    model, example_inputs, mode=program.mode, optimizer=program.optimizer, loss_fn=loss_fn,
                    device=eager_device, steps=1, warmup=0, seed=seed,
                )
                _release(device_map)
                return again.snapshot

            numerics = grounded_in_noise(mine, baseline.snapshot, eager_again)
        if not numerics.ok:
            numerics = _diagnose(numerics, schedule, model, example_inputs, device_map, arena, seed)
    return Measurement(
        graph_hash=program.graph.content_hash,
        mode=program.mode,
        arena=arena,
        devices=planned.devices,
        device_map=device_map.to_dict(),
        step_time_s=_median(planned.times),
        step_times_s=tuple(planned.times),
        copied_bytes=planned.copied_bytes,
        transient_bytes=planned.transient_bytes,
        eager=None if baseline is None else baseline.measurement,
        numerics=numerics,
        steps=steps,
        warmup=warmup,
    )


@dataclass(frozen=True)
class _PlannedRun:
    devices: tuple[DeviceMeasurement, ...]
    times: tuple[float, ...]
    snapshot: Snapshot
    copied_bytes: int
    transient_bytes: int


def _run_planned(
    schedule: Schedule,
    model: torch.nn.Module,
    example_inputs: Any,
    device_map: DeviceMap,
    *,
    arena: bool,
    steps: int,
    warmup: int,
    seed: int,
) -> _PlannedRun:
    bases = devices_mod.allocator_base(device_map)
    meter = StorageMeter()
    executor = Executor(schedule, model, example_inputs, device_map, arena=arena, meter=meter)
    # Kernels' workspaces are measured in the warm-up: probing resets the allocator's peaks.
    probe = WorkspaceProbe() if warmup and device_map.cuda_devices else None
    times: list[float] = []
    snapshot: Snapshot | None = None
    copied = transient = 0
    for i in range(warmup + steps):
        if i == warmup:
            for device in device_map.cuda_devices:
                devices_mod.reset_peak(device)
            meter.reset_peaks()
        executor.probe = probe if i < warmup else None
        torch.manual_seed(seed)
        devices_mod.synchronize(device_map)
        start = time.perf_counter()
        values = executor.run_step()
        devices_mod.synchronize(device_map)  # kernels run asynchronously: the step ends when the GPUs are done
        if i >= warmup:
            times.append(time.perf_counter() - start)
        if snapshot is None:
            snapshot = _snapshot(values, executor)
        copied, transient = values.copied_bytes, values.transient_bytes
        del values
    windows = {str(d): devices_mod.allocator_window(d, bases[str(d)]) for d in device_map.cuda_devices}
    plan = schedule.plan
    copied_in = {d.name: 0 for d in plan.devices}
    for c in schedule.placed.copies:
        copied_in[c.dst] += c.bytes
    # The plan's peak counts the scratch it was made with (``scratch.plan_with_scratch``); what the run holds
    # outside the arena beyond that (a plan made without it) and its kernels' workspaces are placed at their
    # ops' steps.  Without an arena every result is its own allocation: static + LOAD, and the workspaces.
    # A GPU's allocator also counts each allocation rounded up to its block size (``allocation``).
    workspaces = probe.found if probe is not None else {}
    if arena:
        storages = _peaks(held_by_run(plan, executor.op_scratch, {}))
    else:
        storages = {d.name: d.lower_bound_bytes for d in plan.devices}
    allocator = storages
    if device_map.cuda_devices:
        rounded = allocated(plan, schedule.placed)
        allocator = (_peaks(held_by_run(rounded, executor.op_scratch, workspaces)) if arena
                     else held_without_arena(schedule.placed, rounded, workspaces, cuda_block_bytes))
    results = []
    for d in plan.devices:
        torch_device = device_map.torch_device(d.name)
        scratch = executor.scratch_bytes.get(d.name, 0)
        on_device = [op for op in workspaces if plan.placement.get(op, d.name) == d.name]
        tracked = meter.peaks.get(d.name, 0)
        counted = meter.total_peaks.get(d.name, 0)
        window = windows.get(str(torch_device))
        shared = device_map.sharing(d.name)
        own_gpu = window is not None and len(shared) == 1
        measured = window.measured if own_gpu and window is not None else counted
        # What the meter counts leaves the workspaces out; the allocator (a GPU to itself) counts them too.
        predicted_storage = storages[d.name]
        predicted = allocator[d.name] if own_gpu else predicted_storage
        results.append(
            DeviceMeasurement(
                name=d.name,
                torch_device=str(torch_device),
                predicted_peak_bytes=predicted,
                predicted_storage_bytes=predicted_storage,
                measured_peak_bytes=measured,
                error_pct=error_pct(predicted, measured),
                tracked_peak_bytes=tracked,
                transient_peak_bytes=meter.transient_peaks.get(d.name, 0),
                counted_peak_bytes=counted,
                scratch_bytes=scratch if arena else 0,
                workspace_bytes=max((workspaces[op] for op in on_device), default=0),
                plan_peak_bytes=d.peak_bytes,
                plan_lower_bound_bytes=d.lower_bound_bytes,
                static_bytes=d.static_bytes,
                arena_bytes=d.arena_bytes,
                copied_in_bytes=copied_in[d.name],
                allocator_peak_bytes=None if window is None else window.peak_allocated,
                reserved_peak_bytes=None if window is None else window.peak_reserved,
                source="allocator" if own_gpu else ("tracked (shared GPU)" if window is not None else "tracked"),
                allocator_base_bytes=None if window is None else window.base.allocated,
                requested_peak_bytes=None if window is None else window.measured_requested,
                shared_with=tuple(n for n in shared if n != d.name) if window is not None else (),
            )
        )
    assert snapshot is not None
    del executor
    _release(device_map)
    return _PlannedRun(tuple(results), tuple(times), snapshot, copied, transient)


def _peaks(plan: Plan) -> dict[str, int]:
    return {d.name: d.peak_bytes for d in plan.devices}


def _snapshot(values: StepValues, executor: Executor) -> Snapshot:
    def host(t: Any) -> Any:
        return t.detach().to("cpu", copy=True) if isinstance(t, torch.Tensor) else None

    return Snapshot(
        outputs=tuple(host(o) for o in values.outputs),
        grads={k: host(v) for k, v in values.grads.items()},
        state={k: host(v) for k, v in executor.state().items()},
    )


def _complete(snapshot: Snapshot, model: torch.nn.Module) -> Snapshot:
    """Parameters and buffers no op touches are not bound by the executor: they keep the model's values."""
    state = dict(snapshot.state)
    for name, value in (*model.named_parameters(), *model.named_buffers()):
        if name not in state:
            state[name] = value.detach().to("cpu", copy=True)
    return Snapshot(snapshot.outputs, snapshot.grads, state)


def _diagnose(
    numerics: Numerics,
    schedule: Schedule,
    model: torch.nn.Module,
    example_inputs: Any,
    device_map: DeviceMap,
    arena: bool,
    seed: int,
) -> Numerics:
    planned = Executor(schedule, model, example_inputs, device_map, arena=arena)
    references = tuple(Executor(schedule, model, example_inputs, device_map, arena=False) for _ in range(2))
    op, why = first_bad_op(planned, (references[0], references[1]), seed)
    del planned, references
    _release(device_map)
    logger.info("numerics: %s", why)
    detail = why if op is not None else f"{numerics.detail}; {why}"
    return Numerics(
        ok=numerics.ok, max_abs_diff=numerics.max_abs_diff, first_bad_op=op, bitwise=numerics.bitwise,
        compared=numerics.compared, rtol=numerics.rtol, atol=numerics.atol, worst=numerics.worst, detail=detail,
        noise=numerics.noise,
    )


def _release(device_map: DeviceMap) -> None:
    """Let go of a finished run's memory before the next one measures (GPU caches included)."""
    gc.collect()
    for device in device_map.cuda_devices:
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


def _median(values: tuple[float, ...] | list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0

"""The evaluation contract between the search and whatever measures a candidate.

An evaluator is any picklable callable ``evaluate_candidate(candidate) -> dict``.
Each actor receives its own copy and keeps it for its lifetime, so an evaluator may
cache what it builds (a model, a captured program) in its own attributes.  The dict
it returns is a measurement, shaped like ``mpplan.runtime.Measurement.to_dict()``;
the search reads::

    {"devices": [{"name": str, "measured_peak_bytes": int, ...}, ...], "step_time_s": float, ...}

and stores the whole dict (it must be JSON-serialisable).

``evaluate_safely`` turns every outcome into an ``Evaluation``, never an exception:

* **The OOM rule.**  An exception is a device out-of-memory when it, or any class
  in its MRO, is ``DeviceOutOfMemory`` (raise it from an evaluator), or is named
  ``OutOfMemoryError`` (``torch.OutOfMemoryError`` alias ``torch.cuda.OutOfMemoryError``,
  and the executor's own, wherever it is defined), or is a host ``MemoryError``
  (virtual devices live in host memory), or is a ``RuntimeError`` saying "out of
  memory" (torch raises some CUDA allocation failures that way).  The search treats
  ``oom`` as "does not fit".  A measured peak above a device's usable
  capacity is an OOM as well: a virtual device does not fail by itself.
* Any other ``Exception`` is an ``error`` with its type and message.
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mpplan.cluster.records import Candidate, Evaluation, Status
from mpplan.cluster.space import workload_key
from mpplan.config import resolve_devices
from mpplan.errors import ConfigError
from mpplan.graph_hash import hash_matches

if TYPE_CHECKING:  # the runtime loads torch: imported on the actor, when it measures
    from mpplan.runtime.devices import DeviceMap

EvaluateFn = Callable[[Candidate], dict[str, Any]]

_OOM_NAMES = frozenset({"OutOfMemoryError", "DeviceOutOfMemory"})


class DeviceOutOfMemory(RuntimeError):
    """An evaluator ran out of memory on a (real or virtual) device; the search records ``oom``."""


def is_out_of_memory(exc: BaseException) -> bool:
    """The OOM rule (module docstring): by class name in the MRO, so no torch import is needed,
    or a ``RuntimeError`` whose message says "out of memory" (CUDA and cuBLAS errors that torch
    raises as plain ``RuntimeError``, e.g. ``CUDA error: out of memory``)."""
    if isinstance(exc, MemoryError) or any(cls.__name__ in _OOM_NAMES for cls in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def evaluate_safely(evaluate_candidate: EvaluateFn, candidate: Candidate, worker: str | None = None) -> Evaluation:
    """Run one evaluation; OOMs, errors, malformed results and capacity overruns come back as statuses."""
    start = time.perf_counter()
    failure: Evaluation | None = None
    try:
        measurement = evaluate_candidate(candidate)
    except Exception as exc:  # noqa: BLE001 - any failure of one candidate is data, not a crash
        status = Status.OOM if is_out_of_memory(exc) else Status.ERROR
        failure = Evaluation(status, error=f"{type(exc).__name__}: {exc}", worker=worker)
    if failure is not None:
        gc.collect()  # the exception's frames held the failed run's tensors: free them before the next one
        return _timed(failure, start)
    problem = _check_measurement(measurement)
    if problem is not None:
        return _timed(Evaluation(Status.ERROR, error=f"evaluator returned {problem}", worker=worker), start)
    overruns = _overruns(measurement, candidate)
    if overruns:
        return _timed(Evaluation(Status.OOM, measurement=measurement, error=overruns, worker=worker), start)
    return _timed(Evaluation(Status.OK, measurement=measurement, worker=worker), start)


def _timed(evaluation: Evaluation, start: float) -> Evaluation:
    return Evaluation(
        evaluation.status,
        evaluation.measurement,
        evaluation.error,
        round(time.perf_counter() - start, 6),
        evaluation.worker,
    )


def _check_measurement(measurement: Any) -> str | None:
    """What is wrong with an evaluator's dict, or None."""
    if not isinstance(measurement, dict):
        return f"a {type(measurement).__name__}, expected a measurement dict"
    devices = measurement.get("devices")
    if not isinstance(devices, list) or not devices:
        return "no devices list"
    for i, d in enumerate(devices):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str):
            return f"devices[{i}] without a name"
        peak = d.get("measured_peak_bytes")
        if isinstance(peak, bool) or not isinstance(peak, int) or peak < 0:
            return f"devices[{i}].measured_peak_bytes {peak!r}, expected bytes"
    step = measurement.get("step_time_s")
    if step is not None and (not isinstance(step, (int, float)) or not math.isfinite(step) or step < 0):
        return f"step_time_s {step!r}, expected seconds"
    try:
        json.dumps(measurement)
    except (TypeError, ValueError) as exc:
        return f"a measurement that is not JSON ({exc})"
    return None


def _overruns(measurement: dict[str, Any], candidate: Candidate) -> str | None:
    capacity = {d.name: d.capacity_bytes for d in candidate.plan.devices}
    over = [
        f"{d['name']} measured {d['measured_peak_bytes']} bytes, capacity {capacity[d['name']]}"
        for d in measurement["devices"]
        if d["name"] in capacity and d["measured_peak_bytes"] > capacity[d["name"]]
    ]
    return "; ".join(over) or None


@dataclass
class RuntimeEvaluator:
    """The default evaluator: runs the plan with ``mpplan.runtime`` on this actor's devices.

    Builds the model and captures its program once per (model, workload), keeping the
    ``cache_size`` most recent (a batch bisection visits many workloads).  Devices are
    the actor's GPUs when Ray gave it enough, else virtual devices in host memory.
    A numerics mismatch against eager (``eager=True``) is an error: a wrong plan
    must not win.
    """

    steps: int = 3
    warmup: int = 1
    arena: bool = True
    eager: bool = False
    cache_size: int = 2
    _built: OrderedDict[str, tuple[Any, Any, Any]] = field(default_factory=OrderedDict, init=False, repr=False)

    def __call__(self, candidate: Candidate) -> dict[str, Any]:
        from mpplan.planner import PlannerSettings
        from mpplan.runtime.devices import map_devices
        from mpplan.runtime.evaluate import evaluate_program
        from mpplan.runtime.scratch import plan_as_run

        planned = candidate.plan
        device_map = map_devices([d.name for d in planned.devices])
        model, inputs, program = self._build(candidate, device_map.torch_device(planned.devices[0].name))
        replanned = not hash_matches(planned.graph_hash, program.graph) or _other_kernels(candidate, device_map)
        if replanned:  # traced for a GPU here, for the CPU on the driver: other kernels, same settings
            settings = PlannerSettings.from_config(candidate.config.planner)
            planned = plan_as_run(program, resolve_devices(candidate.config), settings, device_map.to_dict())
        measurement = evaluate_program(
            program,
            planned,
            model,
            inputs,
            steps=self.steps,
            warmup=self.warmup,
            arena=self.arena,
            eager=self.eager,
            devices=device_map.to_dict(),
        )
        numerics = measurement.numerics
        if numerics is not None and not numerics.ok:
            raise ValueError(
                f"numerics differ from eager PyTorch (first bad op: {numerics.first_bad_op}): {numerics.detail}"
            )
        result = measurement.to_dict()
        if replanned:
            result["replanned"] = {"graph_hash": planned.graph_hash, "max_peak_bytes": planned.max_peak_bytes,
                                   "devices": {d.name: d.peak_bytes for d in planned.devices}}
        return result

    def _build(self, candidate: Candidate, device: Any) -> tuple[Any, Any, Any]:
        from mpplan.capture import build_torch_model
        from mpplan.runtime.trace import capture_for

        config = candidate.config
        spec = config.model.torch
        if spec is None:
            raise ConfigError(f"{config.source}: model: only model.torch can be measured; use search.top_k: 0")
        key = f"{workload_key(config)}@{device}"
        if key in self._built:
            self._built.move_to_end(key)
            return self._built[key]
        while len(self._built) >= self.cache_size:
            self._built.popitem(last=False)
        model, inputs = build_torch_model(config, device="cpu")
        optimizer = None if spec.optimizer == "none" else spec.optimizer
        program = capture_for(model, inputs, device, mode=spec.mode, optimizer=optimizer, loss_fn=None)
        self._built[key] = (model, inputs, program)
        return self._built[key]


def _other_kernels(candidate: Candidate, device_map: DeviceMap) -> bool:
    """Whether some planned device runs on a torch device type other than the one whose kernels the driver
    derived the plan's arena blocks and scratch for (``Candidate.planned_for``): which results a kernel
    computes outside the arena, and so the peak, depends on it even where the graph is the same."""
    if candidate.planned_for is None:
        return False
    return any(device_map.torch_device(d.name).type != candidate.planned_for for d in candidate.plan.devices)

"""Execute plans on real (or virtual) devices, measure them, compare with eager PyTorch.

The verbs:

* ``evaluate(plan, model, example_inputs, ...) -> Measurement``: run the plan op by
  op on its devices (copies, frees, optional arenas), measure per-device peaks and
  step time, run the eager baseline, check numerics;
* ``run_config(config, ...) -> RunResult``: build, capture, plan and evaluate a
  config's torch model (``mpplan run``);
* ``plan_with_scratch(program, plan, devices) -> Plan``: the plan counting what arena
  mode holds outside the arena (results of ops with no ``out=`` overload), so that
  its own peak is what ``evaluate`` measures;
* ``apply(model, plan, example_inputs, ...) -> PlannedModule``: the plan's placement
  and recompute inside an ordinary training loop (``apply_budget.plan_for_apply``
  plans for a budget that holds there).

Only this package touches ``torch.cuda``.  Without enough GPUs, planned devices are
virtual: CPU memory, with every tensor accounted to the planned device it belongs to.
"""

from mpplan.runtime.apply import PlannedModule, apply
from mpplan.runtime.devices import DeviceMap, cuda_available, map_devices
from mpplan.runtime.driver import RunResult, run_config
from mpplan.runtime.evaluate import evaluate, evaluate_program
from mpplan.runtime.measure import DeviceMeasurement, EagerDevice, EagerMeasurement, Measurement, Numerics
from mpplan.runtime.scratch import plan_with_scratch
from mpplan.runtime.trace import capture_for

__all__ = [
    "DeviceMap",
    "DeviceMeasurement",
    "EagerDevice",
    "EagerMeasurement",
    "Measurement",
    "Numerics",
    "PlannedModule",
    "RunResult",
    "apply",
    "capture_for",
    "cuda_available",
    "evaluate",
    "evaluate_program",
    "map_devices",
    "plan_with_scratch",
    "run_config",
]

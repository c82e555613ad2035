"""``run_config``: build, capture, plan and evaluate a config's PyTorch model (``mpplan run``).

The model is built for real on CPU (``build_torch_model``) with the config's
seeded example inputs, captured on fake tensors for the torch device the first
planned device runs on (GPU kernels differ from CPU ones), planned with the
config's planner settings over its devices (its peak counting what arena mode holds
outside the arena there, ``scratch.plan_as_run``), and evaluated; ``RunResult.measurement.to_dict()`` is
``measurement.json``.  By default all of it runs in a child process (``run_isolated``), so
that a crash in a kernel or in the measurement becomes a ``MeasurementCrash``, not a dead run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpplan.capture import build_torch_model
from mpplan.config import Config, resolve_devices
from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings
from mpplan.runtime.devices import DevicesArg, map_devices
from mpplan.runtime.evaluate import evaluate_program
from mpplan.runtime.isolate import run_isolated
from mpplan.runtime.measure import Measurement
from mpplan.runtime.scratch import plan_as_run
from mpplan.runtime.trace import capture_for

__all__ = ["RunResult", "run_config"]


@dataclass(frozen=True)
class RunResult:
    """The plan that ran, what running it measured, and the graph the plan is for.

    ``graph`` was traced for the torch device the plan ran on: on a GPU it differs
    from a CPU capture of the same config (attention lowers to other ATen ops), so
    reports of this plan must use it, not a fresh capture.
    """

    plan: Plan
    measurement: Measurement
    graph: Graph

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict(), "measurement": self.measurement.to_dict()}


def run_config(
    config: Config,
    *,
    arena: bool = True,
    steps: int = 3,
    warmup: int = 1,
    devices: DevicesArg = None,
    eager: bool = True,
    seed: int = 0,
    isolate: bool = True,
) -> RunResult:
    """Plan ``config``'s torch model and execute the plan (see ``evaluate`` for the arguments).

    ``isolate`` runs it in a child process: a fatal signal there raises ``MeasurementCrash``
    (with the child's Python stack) instead of ending the caller's process.
    """
    if isolate:
        return run_isolated(
            _run_config, config, arena, steps, warmup, devices, eager, seed, what=f"running {config.source}"
        )
    return _run_config(config, arena, steps, warmup, devices, eager, seed)


def _run_config(
    config: Config, arena: bool, steps: int, warmup: int, devices: DevicesArg, eager: bool, seed: int
) -> RunResult:
    spec = config.model.torch
    if spec is None:
        raise ConfigError(
            f"{config.source}: model: running a plan needs model.torch; graph files and synthetic graphs "
            "have no tensors to execute"
        )
    model, inputs = build_torch_model(config, device="cpu", seed=seed)
    optimizer = None if spec.optimizer == "none" else spec.optimizer
    targets = resolve_devices(config)
    device_map = map_devices([d.name for d in targets], devices)
    program = capture_for(
        model, inputs, device_map.torch_device(targets[0].name), mode=spec.mode, optimizer=optimizer, loss_fn=None
    )
    # The plan counts what arena mode holds outside the arena on these devices, so its peak is the prediction.
    planned = plan_as_run(program, targets, PlannerSettings.from_config(config.planner), device_map.to_dict())
    measurement = evaluate_program(
        program, planned, model, inputs, steps=steps, warmup=warmup, arena=arena, devices=device_map.to_dict(),
        eager=eager, seed=seed,
    )
    return RunResult(planned, measurement, program.graph)

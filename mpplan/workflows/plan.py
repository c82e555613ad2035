"""``mpplan plan`` as a function: plan a config into its folder, verified, with the report beside it.

The plan is verified before it is written (capacities aside: a plan that does not fit is
still a correct plan, and the best one found is what a user sizes the devices by).  An
infeasible remat budget writes the best infeasible plan, with its report, and returns the
refusal as data.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpplan import sim
from mpplan.config import Config, resolve_devices
from mpplan.errors import ConfigError, InfeasibleError
from mpplan.graph import Graph
from mpplan.outputs import output_folder
from mpplan.plan import Plan, save_plan, write_json_atomic

if TYPE_CHECKING:  # the remat package loads numpy: imported when a plan is made, not when the CLI starts
    from mpplan.passes.remat import RematInfeasibleError


@dataclass(frozen=True)
class PlanOutcome:
    """What ``plan_into_folder`` made and wrote.

    ``budget`` is the remat budget in bytes when the plan, as the device holds it (arena blocks and
    what ops hold outside them, for a torch model), exceeds it on some device; the plan is then
    written and reported like any other, and the exit code is 3.  ``refused`` is the remat pass's
    refusal when its search found no fit (``plan`` is then the least peak found).  The two can
    disagree, since the search counts no arena blocks: the budget is judged on what the device holds.
    ``oversized_op`` is an op whose activations alone exceed every device, when the plan does not fit.
    """

    plan: Plan
    path: Path
    baselines: dict[str, int] = field(default_factory=dict)
    report: Path | None = None
    refused: RematInfeasibleError | None = None
    budget: int | None = None
    oversized_op: tuple[str, int] | None = None

    @property
    def exit_code(self) -> int:
        """0 when the plan fits its devices and the remat budget; 3 when it does not."""
        return 3 if self.budget is not None or self.plan.misfits else 0


def plan_into_folder(config: Config, out: str | None = None) -> PlanOutcome:
    """Plan ``config`` on its devices and write the results into ``out`` (default: ``<output.dir>/plan``).

    Writes ``plan.json`` (verified), ``timeline.json``, ``baselines.json`` and ``report.md``, also
    for the best infeasible plan of a remat budget that nothing fits; ``ConfigError`` when the
    config names no device.
    """
    from mpplan.capture import TRACED_FOR, graph_from_config, program_from_config
    from mpplan.planner import PlannerSettings, plan
    from mpplan.verify import verify

    devices = resolve_devices(config)
    if not devices:
        raise ConfigError(f"{config.source}: devices: needs at least one device to plan for")
    folder = output_folder("plan", out, config.output.dir)
    program = program_from_config(config) if config.model.torch is not None else None
    graph = graph_from_config(config, program)

    def planned(settings: PlannerSettings) -> Plan:
        """The plan; a torch model's as arena mode runs it (its blocks and scratch): the peak a device needs."""
        if program is None:
            return plan(graph, devices, settings)
        from mpplan.runtime.scratch import plan_as_run  # loads torch: only for a torch model, captured above

        return plan_as_run(program, devices, settings, TRACED_FOR)

    settings = PlannerSettings.from_config(config.planner)
    refused = None
    try:
        result = planned(settings)
    except InfeasibleError as exc:  # the remat package's refusal: it is loaded only by a plan that recomputes
        from mpplan.passes.remat import RematInfeasibleError

        if not isinstance(exc, RematInfeasibleError) or exc.plan is None:
            raise
        refused, result = exc, exc.plan
    budget = missed_budget(result)
    verify(graph, result, check_capacity=False)  # a misfit is still a correct plan
    path = save_plan(result, folder / "plan.json")
    static = sim.static_bytes(graph)
    baselines = {
        "one device, as-given order, no sharing": static + sim.no_sharing_bytes(graph),
        "one device, as-given order, perfect allocator": static + sim.order_load(graph, range(len(graph.ops))),
    }
    if result.remat:
        without = planned(dataclasses.replace(settings, remat="none"))
        baselines["these settings without recomputation"] = without.max_peak_bytes
    baselines["this plan"] = result.max_peak_bytes
    report = write_plan_report(graph, result, folder, baselines, figures=False)
    oversized = None
    if result.misfits:
        op, touched = sim.largest_op(graph)
        if op is not None and touched > max(d.capacity_bytes for d in result.devices):
            oversized = (op, touched)
    return PlanOutcome(result, path, baselines, report, refused, budget, oversized)


def missed_budget(planned: Plan) -> int | None:
    """The remat budget in bytes that ``planned`` was made for (``plan.settings.remat_chosen``), when some
    device's peak exceeds it; None when every device holds no more, or there is no budget."""
    budget = (planned.settings.remat_chosen or {}).get("budget_bytes")
    if not isinstance(budget, int) or all(d.peak_bytes <= budget for d in planned.devices):
        return None
    return budget


def write_plan_report(graph: Graph, plan: Plan, out: Path, baselines: dict[str, int], **extra: Any) -> Path:
    """``timeline.json``, ``baselines.json`` and the report of ``plan`` in ``out``; the report's path."""
    from mpplan.report import write_report
    from mpplan.timeline import timeline

    line = timeline(graph, plan)
    write_json_atomic(line.to_dict(), out / "timeline.json")
    write_json_atomic(baselines, out / "baselines.json")
    return write_report(out, plan, timeline=line, baselines=baselines, **extra)

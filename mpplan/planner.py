"""Compose the passes into a Plan: schedule, place, copies, lifetimes, assignment.

Each stage is a pure function of the graph and what earlier stages decided, in its
package under ``mpplan.passes``; this module only wires them together, times them,
and records what they chose.  ``PlannerSettings`` is the config's ``planner:``
section, flattened.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from mpplan import sim
from mpplan.config import Device, PlannerSection, capacity_fraction
from mpplan.errors import ConfigError
from mpplan.from_columns import from_columns
from mpplan.graph import Graph, with_dynamic_grads
from mpplan.liveness import Liveness, live_ranges
from mpplan.passes.assign import assign_arena
from mpplan.passes.copies import Placed, inject_copies, legalize, listing
from mpplan.passes.place import PlacementOptions, choose_placement, module_devices
from mpplan.passes.schedule import schedule as schedule_ops
from mpplan.plan import Buffer, DevicePlan, Plan, PlanSettings, RematRecord
from mpplan.progress import progress

if TYPE_CHECKING:  # the remat package is imported where a plan recomputes: a plan without remat never loads it
    from mpplan.passes.remat import RematResult
    from mpplan.passes.remat.fit import Fitted, PlanGraph

#: Graphs of at least this many ops get a planning progress bar (on a terminal).
PROGRESS_MIN_OPS = 20_000


_SECTION = PlannerSection()

#: PlannerSettings fields that sit in a nested section of ``planner:``, by their path there; every other
#: field has the name of a top-level key.  ``test_planner`` checks the two cover each other exactly.
SECTION_PATHS: dict[str, tuple[str, ...]] = {
    "shift_activations": ("shift", "activations"),
    "shift_from": ("shift", "from_device"),
    "shift_to": ("shift", "to_device"),
    "remat": ("remat", "policy"),
    "remat_threshold": ("remat", "threshold"),
    "remat_budget": ("remat", "budget"),
    "remat_solver": ("remat", "solver"),
    "remat_time_limit_s": ("remat", "time_limit_s"),
}


@dataclass(frozen=True)
class PlannerSettings:
    """The planner's knobs: ``planner:`` in the config (``mpplan.config.PlannerSection``), flattened.

    Defaults, ``from_config`` and ``to_dict`` all come from the section's schema, so a
    new choice (a scheduler, an assigner, a placement) is one registry entry and a new
    setting one section field plus its field here.
    """

    schedule: str = _SECTION.schedule
    assign: str = _SECTION.assign
    alignment: int = _SECTION.alignment
    parallel_safe: bool = _SECTION.parallel_safe
    grads: str = _SECTION.grads
    placement: str = _SECTION.placement
    device_map: Mapping[str, str] = field(default_factory=dict)
    no_split: tuple[str, ...] = _SECTION.no_split
    shift_activations: Any = _SECTION.shift.activations
    shift_from: str | None = _SECTION.shift.from_device
    shift_to: str | None = _SECTION.shift.to_device
    remat: str = _SECTION.remat.policy
    remat_threshold: int | None = _SECTION.remat.threshold
    remat_budget: float | int | str | None = _SECTION.remat.budget
    remat_solver: str = _SECTION.remat.solver
    remat_time_limit_s: float = _SECTION.remat.time_limit_s

    @classmethod
    def from_config(cls, section: PlannerSection) -> PlannerSettings:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value: Any = section
            for part in SECTION_PATHS.get(f.name, (f.name,)):
                value = getattr(value, part)
            values[f.name] = _copied(value, getattr(_SECTION, f.name, None))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The settings as ``plan.json`` records them: the section's layout and YAML keys."""
        return _section_dict(self, _SECTION, ())


_FIELD_OF_PATH = {path: name for name, path in SECTION_PATHS.items()}


def _copied(value: Any, default: Any) -> Any:
    """A section value as the settings hold it: mappings copied, the list-valued keys as tuples."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(default, tuple):
        return tuple(value)
    return value


def _section_dict(settings: PlannerSettings, section: Any, prefix: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        default = getattr(section, f.name)
        key = f.metadata.get("key") or f.name
        path = (*prefix, f.name)
        if dataclasses.is_dataclass(default):
            out[key] = _section_dict(settings, default, path)
            continue
        value = getattr(settings, _FIELD_OF_PATH.get(path, f.name))
        if isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(default, tuple):
            value = list(value)
        out[key] = value
    return out


def plan(graph: Graph, devices: Sequence[Device], settings: PlannerSettings = PlannerSettings()) -> Plan:
    """Plan ``graph`` over ``devices``: the best placement the settings allow, fully assigned."""
    if not devices:
        raise ValueError("plan needs at least one device")
    if settings.remat == "budget":
        return _plan_within_budget(graph, devices, settings)
    seconds: dict[str, float] = {}
    original = graph
    graph = memory_model(graph, settings.grads)
    rematted = None
    stages = 3 + len(devices) + (settings.remat != "none")
    with progress(f"planning {graph.name}", stages, unit="stage", enabled=len(graph.ops) >= PROGRESS_MIN_OPS) as bar:
        clock = time.perf_counter()
        if settings.remat != "none":
            bar.update(0, note="remat")
            rematted = _remat(graph, settings)
            graph = rematted.graph
            seconds["remat"] = _lap(clock)
            bar.update()
            clock = time.perf_counter()
        bar.update(0, note="schedule")
        order = schedule_ops(graph, settings.schedule)
        seconds["schedule"] = _lap(clock)
        bar.update(note="place")
        clock = time.perf_counter()
        capacity = {d.name: d.usable for d in devices}
        op_device, chosen = choose_placement(graph, order, capacity, settings.placement, _placement_options(settings))
        op_device = legalize(graph, order, op_device)
        seconds["place"] = _lap(clock)
        bar.update(note="copies")
        clock = time.perf_counter()
        listed = listing(graph, order, op_device, relist=settings.parallel_safe)
        seconds["copies"] = _lap(clock)
        device_plans, buffers = [], {}
        liveness_s = assign_s = 0.0
        for device in devices:
            bar.update(note=f"assign {device.name}")
            clock = time.perf_counter()
            storages = frozenset(s for s, d in enumerate(listed.storage_device) if d == device.name)
            liveness = live_ranges(listed.graph, listed.order, storages)
            liveness_s += _lap(clock)
            clock = time.perf_counter()
            arena = assign_arena(
                listed.graph,
                liveness,
                assigner=settings.assign,
                alignment=settings.alignment,
                parallel_safe=settings.parallel_safe,
            )
            assign_s += _lap(clock)
            device_plans.append(_device_plan(device, liveness, arena.arena))
            buffers.update(_buffers(listed.graph, device.name, arena.offsets, arena.sizes))
        bar.update()
    seconds["liveness"] = round(liveness_s, 6)
    seconds["assign"] = round(assign_s, 6)
    seconds["total"] = round(sum(seconds.values()), 6)
    ops = listed.graph.ops
    schedule = [ops[k].name for k in listed.order]
    return Plan(
        graph_name=original.name,
        graph_hash=original.content_hash,
        devices=tuple(device_plans),
        schedule=tuple(schedule),
        placement=dict(zip(schedule, listed.op_device)),
        buffers=buffers,
        copies=listed.copies,
        max_peak_bytes=max(d.peak_bytes for d in device_plans),
        cross_device_bytes=listed.cross_device_bytes,
        settings=PlanSettings.from_mapping(
            {**settings.to_dict(), "placement_chosen": chosen, **_remat_chosen(rematted)}
        ),
        seconds=seconds,
        module_devices=module_devices(listed),
        remat=tuple(RematRecord.from_mapping(r) for r in rematted.plan_records()) if rematted else (),
        compute_overhead=rematted.compute_overhead if rematted else 0.0,
    )


def _plan_within_budget(graph: Graph, devices: Sequence[Device], settings: PlannerSettings) -> Plan:
    """``remat: budget``: the budget bounds every device's planned peak (arena at the
    alignment, static included), order first, then recomputes (``mpplan.passes.remat.fit``).
    ``RematInfeasibleError`` carries the plan with the least peak found as ``plan``."""
    from mpplan.passes.remat import RematInfeasibleError
    from mpplan.passes.remat.fit import fit_planned

    if settings.remat_budget is None:
        raise ConfigError("remat budget: the budget policy needs bytes (16GiB) or a fraction (0.8) of the peak")
    inner = dataclasses.replace(settings, remat="none", grads="static")  # the graph is already under grads

    def planner(chosen: PlannerSettings) -> PlanGraph[Plan]:
        def plan_graph(rewritten: Graph) -> tuple[Plan, int, Sequence[str]]:
            planned = plan(rewritten, devices, chosen)
            return planned, planned.max_peak_bytes, planned.schedule
        return plan_graph

    # Own order: the given order's recomputes are also planned in the given order (never worse than fixed).
    given = None if settings.schedule == "as_given" else planner(dataclasses.replace(inner, schedule="as_given"))
    clock = time.perf_counter()
    dynamic = memory_model(graph, settings.grads)
    try:
        fitted = fit_planned(dynamic, _budget(settings, devices), planner(inner), plan_given=given,
                             solver=settings.remat_solver, time_limit_s=settings.remat_time_limit_s)
    except RematInfeasibleError as exc:
        best = _with_remat(graph, exc.plan, settings, time.perf_counter() - clock)
        raise RematInfeasibleError(str(exc), exc.missing_bytes, exc.best, plan=best) from None
    return _with_remat(graph, fitted, settings, time.perf_counter() - clock)


def _with_remat(graph: Graph, fitted: Fitted[Plan], settings: PlannerSettings, seconds: float) -> Plan:
    """The plan of ``fitted`` as a plan of ``graph`` under ``settings``, with its recomputes."""
    inner, result = fitted.plan, fitted.result
    chosen = _remat_chosen(result)
    chosen["remat_chosen"].update(order=fitted.order, fits=fitted.fits)
    timing = {"remat": round(seconds - inner.seconds.get("total", 0.0), 6), **inner.seconds, "total": round(seconds, 6)}
    return dataclasses.replace(
        inner,
        graph_name=graph.name,
        graph_hash=graph.content_hash,
        settings=PlanSettings.from_mapping(
            {**settings.to_dict(), "placement_chosen": inner.settings.get("placement_chosen"), **chosen}
        ),
        seconds=timing,
        remat=tuple(RematRecord.from_mapping(r) for r in result.plan_records()),
        compute_overhead=result.compute_overhead,
    )


def _budget(settings: PlannerSettings, devices: Sequence[Device]) -> Any:
    """The remat budget as the fit takes it: '0.9 capacity' becomes bytes of the smallest device."""
    fraction = capacity_fraction(settings.remat_budget)
    if fraction is None:
        return settings.remat_budget
    return int(fraction * min(d.capacity for d in devices))


def _placement_options(settings: PlannerSettings) -> PlacementOptions:
    return PlacementOptions(
        device_map=settings.device_map,
        no_split=settings.no_split,
        shift_activations=settings.shift_activations,
        shift_from=settings.shift_from,
        shift_to=settings.shift_to,
    )


def _remat(graph: Graph, settings: PlannerSettings) -> RematResult:
    from mpplan.passes.remat import remat

    return remat(
        graph,
        settings.remat,
        threshold=settings.remat_threshold,
        budget=settings.remat_budget,
        solver=settings.remat_solver,
        time_limit_s=settings.remat_time_limit_s,
    )


def _device_plan(device: Device, liveness: Liveness, arena_bytes: int) -> DevicePlan:
    """A device's numbers: its arena over the static bytes, and the lower bound static + LOAD."""
    return DevicePlan(
        name=device.name,
        capacity_bytes=device.usable,
        static_bytes=liveness.static_bytes,
        arena_bytes=arena_bytes,
        peak_bytes=liveness.static_bytes + arena_bytes,
        lower_bound_bytes=liveness.static_bytes + sim.load(liveness.ranges, liveness.num_steps),
    )


def _buffers(graph: Graph, device: str, offsets: Mapping[int, int], sizes: Mapping[int, int]) -> dict[str, Buffer]:
    """The ``Buffer`` of each storage the arena placed, by tensor name in storage id order.

    Made from columns (``from_columns``): a 100k-op plan has 140k of them, all from the
    assigner's own results (0.32 -> 0.21 CPU s against a constructor call each)."""
    stored = sorted(offsets)
    tensors = graph.tensors
    records = from_columns(Buffer, [device] * len(stored), list(map(offsets.__getitem__, stored)),
                           list(map(sizes.__getitem__, stored)))
    return dict(zip([tensors[s].name for s in stored], records))


def _remat_chosen(result: RematResult | None) -> dict[str, Any]:
    """What the remat pass decided, for ``plan.settings`` (the mirror threshold a search found, the solver)."""
    if result is None:
        return {}
    return {
        "remat_chosen": {
            "threshold": result.threshold,
            "budget_bytes": result.budget_bytes,
            "solver": result.solver,
            "optimal": result.optimal,
            "gap": result.gap,
            "note": result.note,
        }
    }


def memory_model(graph: Graph, grads: str) -> Graph:
    """``graph`` as the planner sees it under ``planner.grads``: as is (``static``), or
    ``with_dynamic_grads`` (``dynamic``)."""
    if grads == "static":
        return graph
    if grads == "dynamic":
        return with_dynamic_grads(graph)
    raise ConfigError(f"planner.grads: expected static or dynamic, got {grads!r}")


def rematerialised(graph: Graph, plan_: Plan) -> Graph:
    """The graph a plan's schedule runs: ``graph`` under the plan's memory model, with its recomputes applied.

    A plan that records no ``grads`` setting predates it, when gradients were always static.
    """
    graph = memory_model(graph, str(plan_.settings.get("grads", "static")))
    if not plan_.remat:
        return graph
    from mpplan.passes.remat import apply_recompute

    from_ops = {r.tensor: r.from_op for r in plan_.remat if r.from_op is not None}
    return apply_recompute(graph, dict.fromkeys(r.op for r in plan_.remat), from_ops)


def placed_graph(graph: Graph, plan_: Plan) -> Placed:
    """Rebuild the copy-augmented graph a plan describes (for the executor and reports)."""
    graph = rematerialised(graph, plan_)
    index = graph.topology.op_index
    order = [index[name] for name in plan_.schedule if name in index]
    return inject_copies(graph, order, [plan_.placement[op.name] for op in graph.ops])


def _lap(start: float) -> float:
    return round(time.perf_counter() - start, 6)

"""Predicted memory over the schedule, per device: what the report's timelines plot.

Written next to ``plan.json`` as ``timeline.json`` so ``mpplan report`` can draw a
plan without the model.  Every number comes from the liveness pass over the
copy-augmented graph the plan describes, the same source as the plan's peaks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpplan import sim
from mpplan.graph import Graph
from mpplan.liveness import live_ranges
from mpplan.plan import Plan


@dataclass(frozen=True, slots=True)
class DeviceTimeline:
    """Live bytes per step on one device: activations (dynamic, not copies) and copies in."""

    name: str
    capacity_bytes: int
    static_bytes: int
    arena_bytes: int
    activations: tuple[int, ...]
    copies: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Timeline:
    steps: tuple[str, ...]
    devices: tuple[DeviceTimeline, ...]

    def to_dict(self) -> dict[str, Any]:
        # by hand, not ``asdict``: that deep-copies every one of the per-step numbers
        return {
            "steps": list(self.steps),
            "devices": [
                {"name": d.name, "capacity_bytes": d.capacity_bytes, "static_bytes": d.static_bytes,
                 "arena_bytes": d.arena_bytes, "activations": list(d.activations), "copies": list(d.copies)}
                for d in self.devices
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timeline:
        devices = tuple(
            DeviceTimeline(**{**d, "activations": tuple(d["activations"]), "copies": tuple(d["copies"])})
            for d in data["devices"]
        )
        return cls(tuple(data["steps"]), devices)


def timeline(graph: Graph, plan: Plan) -> Timeline:
    """Per-device live bytes at every step of ``plan``'s schedule."""
    from mpplan.planner import rematerialised

    if len(plan.devices) == 1 and not plan.copies:
        # one device copies nothing: the live ranges under the schedule are the placed graph's,
        # without listing the graph again in that order
        steps_graph = rematerialised(graph, plan)
        index = steps_graph.topology.op_index
        order = [index[name] for name in plan.schedule if name in index]
        if len(order) == len(steps_graph.ops) == len(plan.schedule):
            (device,) = plan.devices
            profile = tuple(sim.order_profile(steps_graph, order))
            line = DeviceTimeline(device.name, device.capacity_bytes, device.static_bytes, device.arena_bytes,
                                  profile, (0,) * len(order))
            return Timeline(tuple(plan.schedule), (line,))
    return _placed_timeline(graph, plan)


def _placed_timeline(graph: Graph, plan: Plan) -> Timeline:
    """The timeline from the copy-augmented graph the plan describes (any number of devices)."""
    from mpplan.planner import placed_graph

    placed = placed_graph(graph, plan)
    topo = placed.graph.topology
    copy_names = {c.name for c in plan.copies}
    steps = len(placed.graph.ops)
    devices = []
    for device in plan.devices:
        mine = frozenset(s for s in topo.storages if placed.storage_device[s] == device.name)
        ranges = live_ranges(placed.graph, range(steps), mine).ranges
        copies = [r for r in ranges if placed.graph.tensors[r.storage].name in copy_names]
        own = [r for r in ranges if placed.graph.tensors[r.storage].name not in copy_names]
        devices.append(
            DeviceTimeline(
                name=device.name,
                capacity_bytes=device.capacity_bytes,
                static_bytes=device.static_bytes,
                arena_bytes=device.arena_bytes,
                activations=tuple(sim.live_profile(own, steps)),
                copies=tuple(sim.live_profile(copies, steps)),
            )
        )
    return Timeline(tuple(op.name for op in placed.graph.ops), tuple(devices))

"""Scoring a full placement exactly: per-device lower-bound peaks (static + LOAD) after copies.

Every placement strategy is judged here, by the one simulator (``mpplan.sim``): ``score``
is (worst peak / capacity, cross-device bytes), lower is better, compared as a tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from mpplan import sim
from mpplan.graph import Graph
from mpplan.liveness import live_ranges
from mpplan.passes.copies import Placed, inject_copies, legalize


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """Exact per-device lower-bound peaks (static + LOAD) of a placement after copies."""

    placed: Placed
    peaks: dict[str, int]


def device_loads(graph: Graph, order: Sequence[int], op_device: Sequence[str], devices: Sequence[str]) -> DeviceLoad:
    placed = inject_copies(graph, order, legalize(graph, order, op_device))
    topo = placed.graph.topology
    per_device: dict[str, set[int]] = {d: set() for d in devices}
    for s in topo.storages:
        per_device.setdefault(placed.storage_device[s], set()).add(s)
    steps = range(len(placed.graph.ops))
    peaks = {}
    for d in devices:
        liveness = live_ranges(placed.graph, steps, frozenset(per_device[d]))
        peaks[d] = liveness.static_bytes + sim.load(liveness.ranges, liveness.num_steps)
    return DeviceLoad(placed, peaks)


def worst_ratio(load: DeviceLoad, capacities: Mapping[str, int]) -> float:
    return max(load.peaks[d] / capacities[d] for d in capacities)


def score(
    graph: Graph, order: Sequence[int], op_device: Sequence[str], capacity: Mapping[str, int]
) -> tuple[float, int]:
    """(worst peak / capacity, cross-device bytes) of a placement, exactly after copies."""
    load = device_loads(graph, order, op_device, list(capacity))
    return worst_ratio(load, capacity), load.placed.cross_device_bytes

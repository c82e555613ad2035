"""Pipeline placement: a contiguous partition of the forward ops (in schedule order) into one stage per device.

Units are cut at module boundaries; the exact DP (``partition``) picks the stages;
boundary refinement then moves one boundary at a time while the exact post-copy
score improves.  Tied parameters and the optimizer's arithmetic get variants of the
grouping, and the best scored is kept.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from mpplan.graph import Graph, Kind
from mpplan.passes.place.complete import complete, forward_ops
from mpplan.passes.place.manual import place_single
from mpplan.passes.place.partition import SegmentCost, partition
from mpplan.passes.place.scoring import device_loads, worst_ratio


def make_units(graph: Graph, sequence: Sequence[int], max_units: int, no_split: Sequence[str] = ()) -> list[list[int]]:
    """Group ``sequence`` into at most ``max_units`` contiguous runs, cutting at module boundaries.

    Ops whose module starts with a ``no_split`` prefix are never separated from the
    other ops of the same module (the prefix's first matching path).
    """
    if not sequence:
        return []

    def key(k: int, depth: int) -> str:
        module = graph.ops[k].module or ""
        for prefix in no_split:
            if module == prefix or module.startswith(prefix + "."):
                return prefix
        return ".".join(module.split(".")[:depth])

    best: list[list[int]] = [list(sequence)]
    for depth in range(1, 8):
        runs = [list(g) for _, g in itertools.groupby(sequence, key=lambda k: key(k, depth))]
        if len(runs) > max_units:
            break
        best = runs
    if len(best) >= max_units or len(best) == len(sequence):
        return best
    # Too coarse: split the largest runs evenly (never inside a no_split block).
    runs = best
    while len(runs) < max_units:
        i = max(range(len(runs)), key=lambda r: len(runs[r]))
        run = runs[i]
        if len(run) < 2 or (no_split and key(run[0], 1) in no_split and key(run[0], 1) == key(run[-1], 1)):
            break
        half = len(run) // 2
        runs[i : i + 1] = [run[:half], run[half:]]
    return runs


def place_pipeline(
    graph: Graph,
    order: Sequence[int],
    capacities: Mapping[str, int],
    *,
    max_units: int | None = None,
    no_split: Sequence[str] = (),
    refine_steps: int = 64,
) -> tuple[str, ...]:
    """Contiguous stages over the forward ops by the exact DP, then boundary refinement.

    The DP scores stages with ``SegmentCost``; refinement moves one boundary by one
    unit at a time while the exact post-copy peaks improve.  When parameters are
    tied (read by forward ops in several units, like GPT-2's embedding and LM head),
    the partition is also made with those readers pulled to the parameter's first
    unit, as accelerate keeps tied weights together, and the better of the two kept:
    copying a hidden state is usually far cheaper than copying a vocabulary matrix.
    Each grouping is also tried with the optimizer's arithmetic on the last stage:
    optimizer state then sits where the last stage's short-lived activations leave
    room, at the price of sending updates back to the parameters' devices.
    """
    devices = list(capacities)
    max_units = max_units or default_units(len(order))
    units = make_units(graph, forward_ops(graph, order), max(max_units, len(devices)), no_split)
    if len(devices) == 1 or len(units) <= 1:
        return place_single(graph, devices[0])
    unit_of_anchor = {k: u for u, run in enumerate(units) for k in run}
    groupings = [unit_of_anchor]
    tied = pull_tied_readers(graph, order, unit_of_anchor)
    if tied != unit_of_anchor:
        groupings.append(tied)
    optimizer = optimizer_ops(graph, order)
    if optimizer:  # the optimizer's arithmetic (and so its state) on the last stage, ZeRO-like
        groupings += [{**grouping, **dict.fromkeys(optimizer, len(units) - 1)} for grouping in list(groupings)]
    stagings = [_Staging.by_dp(graph, order, grouping, len(units), capacities) for grouping in groupings]
    score, best = min(((staging.score(staging.starts), i) for i, staging in enumerate(stagings)))
    return stagings[best].refined(refine_steps, score)


def optimizer_ops(graph: Graph, order: Sequence[int]) -> list[int]:
    """The optimizer's arithmetic: ops outside the backward pass that read optimizer state
    and make new dynamic storage (Adam's ``sqrt`` of its second moment, the bias corrections)."""
    topo = graph.topology
    return [
        k
        for k in order
        if graph.ops[k].backward_of is None
        and graph.ops[k].recompute_of is None
        and any(graph.tensors[s].kind is Kind.OPTIMIZER_STATE for s in topo.op_storages[k])
        and any(not topo.is_static[topo.storage_of[t]] for t in topo.op_outputs[k])
    ]


def default_units(num_ops: int) -> int:
    """How finely the DP cuts: finer stages balance better, and the DP's cost grows as
    units^2 x ops, so the unit count shrinks with the graph (100 units at 1k ops, 32 at 10k)."""
    return max(32, min(128, math.isqrt(10_000_000 // max(num_ops, 1))))


def pull_tied_readers(graph: Graph, order: Sequence[int], unit_of_anchor: Mapping[int, int]) -> dict[int, int]:
    """Anchors with each reader of a tied parameter moved to the parameter's first unit.

    A reader moves when the parameter outweighs the activations it reads; the forward
    ops after it in its unit that depend on it move along, so its (often large) output
    is consumed where it is made instead of being copied back.
    """
    topo = graph.topology
    moved = dict(unit_of_anchor)
    first_unit: dict[int, int] = {}
    for k in order:
        if k not in unit_of_anchor:
            continue  # anchors are forward ops: views of weights are not among them
        u = unit_of_anchor[k]
        params = [s for s in topo.op_storages[k] if graph.tensors[s].kind is Kind.PARAM]
        for s in params:
            first_unit.setdefault(s, u)
        tied = [s for s in params if first_unit[s] != u]
        read = {topo.storage_of[t] for t in topo.op_inputs[k]} - set(params)  # activations (and inputs)
        if tied and sum(topo.nbytes[s] for s in read) < sum(topo.nbytes[s] for s in tied):
            moved[k] = first_unit[tied[0]]
    pulled = {k for k in moved if moved[k] != unit_of_anchor[k]}
    made_by_pulled: dict[int, int] = {}
    for k in order:
        if k not in unit_of_anchor:
            continue
        if k not in pulled:
            sources = {made_by_pulled[s] for s in topo.op_storages[k] if s in made_by_pulled}
            same_unit = sorted(p for p in sources if unit_of_anchor[p] == unit_of_anchor[k])
            if not same_unit:
                continue
            moved[k] = moved[same_unit[0]]
            pulled.add(k)
        for t in topo.op_outputs[k]:  # only pulled ops get here
            made_by_pulled[topo.storage_of[t]] = k
    return moved


@dataclass(frozen=True)
class _Staging:
    """Units (with their op mapping) cut into contiguous stages, one per device, scored exactly."""

    graph: Graph
    order: Sequence[int]
    unit_of_op: tuple[int, ...]
    num_units: int
    capacities: Mapping[str, int]
    starts: tuple[int, ...]

    @classmethod
    def by_dp(
        cls, graph: Graph, order: Sequence[int], unit_of_anchor: Mapping[int, int], num_units: int,
        capacities: Mapping[str, int],
    ) -> _Staging:
        """The DP's stages over these units, scored by ``SegmentCost``."""
        labels = complete(graph, order, {k: str(u) for k, u in unit_of_anchor.items()})
        unit_of_op = tuple(int(x) for x in labels)
        coster = SegmentCost(graph, order, unit_of_op, num_units)
        starts = partition(num_units, list(capacities.values()), coster)
        return cls(graph, order, unit_of_op, num_units, capacities, starts)

    def placement(self, starts: Sequence[int]) -> tuple[str, ...]:
        devices = list(self.capacities)
        bounds = [0, *starts, self.num_units]
        stage_of_unit = [0] * self.num_units
        for stage in range(len(bounds) - 1):
            for u in range(bounds[stage], bounds[stage + 1]):
                stage_of_unit[u] = stage
        return tuple(devices[stage_of_unit[u]] for u in self.unit_of_op)

    def score(self, starts: Sequence[int]) -> tuple[float, int]:
        """(worst peak / capacity, cross-device bytes), exactly after copies."""
        load = device_loads(self.graph, self.order, self.placement(starts), list(self.capacities))
        return worst_ratio(load, self.capacities), load.placed.cross_device_bytes

    def refined(self, max_steps: int, score: tuple[float, int]) -> tuple[str, ...]:
        """Move one boundary by one unit at a time while the exact score (``score``: of ``starts``) improves."""
        starts = list(self.starts)
        best = score
        for _ in range(max_steps):
            improved = False
            for b in range(len(starts)):
                for delta in (-1, 1):
                    cand = list(starts)
                    cand[b] += delta
                    lo = cand[b - 1] if b else 0
                    hi = cand[b + 1] if b + 1 < len(cand) else self.num_units
                    if not lo < cand[b] < hi:
                        continue
                    s = self.score(cand)
                    if s < best:
                        best, starts, improved = s, cand, True
            if not improved:
                break
        return self.placement(starts)

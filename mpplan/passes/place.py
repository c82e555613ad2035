"""Placement: which device runs each op.

* ``single``: everything on the first device (the baseline every report shows).
* ``manual``: ``device_map`` (module path prefix -> device, accelerate's format), or
  the ops' own ``device`` fields in graph files.
* ``pipeline``: a contiguous partition of the forward ops (in schedule order) into
  one stage per device, by an exact DP minimising the largest predicted
  ``peak / capacity``, then cross-device bytes.
* ``shift``: Caffe2's ShiftActivationDevices, generalised (see ``shift``).

Only *anchor* ops are placed directly (forward ops); ``complete`` derives the rest:
a backward op runs where its forward op ran, a recompute where its original ran
(so recomputing never adds cross-device traffic of its own), an op that updates a parameter or
optimizer state in place runs where that tensor is used, and any other op follows
the producer of its inputs.  Pure view ops stay with their base.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from mpplan import sim
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph, Kind
from mpplan.passes.copies import Placed, inject_copies, legalize
from mpplan.passes.liveness import live_ranges


# --- completing a partial placement ------------------------------------------------------------


def complete(graph: Graph, order: Sequence[int], anchors: Mapping[int, str]) -> tuple[str, ...]:
    """Extend ``anchors`` (op id -> label) to every op by the rules in the module docstring."""
    topo = graph.topology
    label: dict[int, str] = dict(anchors)
    by_name = topo.op_index
    for k, op in enumerate(graph.ops):
        origin = op.backward_of if op.backward_of is not None else op.recompute_of
        if k not in label and origin in by_name and by_name[origin] in label:
            label[k] = label[by_name[origin]]
    user_label: dict[int, str] = {}  # storage -> label of its first placed reader that does not write it
    for k in order:
        if k in label:
            written = {topo.storage_of[topo.tensor_index[t]] for t in graph.ops[k].in_place}
            for s in topo.op_storages[k]:
                if s not in written:
                    user_label.setdefault(s, label[k])
    for k in order:
        if k in label:
            continue
        for name in graph.ops[k].in_place:
            s = topo.storage_of[topo.tensor_index[name]]
            if topo.producer[s] < 0 and s in user_label:
                label[k] = user_label[s]
                break
    default = label[order[0]] if order and order[0] in label else next(iter(anchors.values()), "")
    for k in order:
        if k in label:
            continue
        label[k] = _follow(graph, k, label) or default
    for k, op in enumerate(graph.ops):
        ins = topo.op_inputs[k]
        if op.outputs and ins and all(graph.tensor(t).alias_of is not None and t not in op.inputs for t in op.outputs):
            producer = topo.producer[topo.storage_of[ins[0]]]
            if producer >= 0:
                label[k] = label[producer]
    return tuple(label[k] for k in range(len(graph.ops)))


def _follow(graph: Graph, k: int, label: dict[int, str]) -> str | None:
    topo = graph.topology
    for t in topo.op_inputs[k]:
        p = topo.producer[topo.storage_of[t]]
        if p >= 0 and p in label:
            return label[p]
    for t in topo.op_outputs[k]:
        for c in topo.consumers[t]:
            if c in label:
                return label[c]
    return None


# --- anchors: the forward ops a partition places ----------------------------------------------


def forward_ops(graph: Graph, order: Sequence[int]) -> list[int]:
    """Ops in ``order`` that are neither backward ops, recomputes nor in-place updates of pre-existing state."""
    topo = graph.topology
    forward = []
    for k in order:
        op = graph.ops[k]
        if op.backward_of is not None or op.recompute_of is not None:
            continue
        updates_state = any(topo.producer[topo.storage_of[topo.tensor_index[t]]] < 0 for t in op.in_place)
        if not updates_state:
            forward.append(k)
    return forward


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


# --- the exact contiguous-partition DP -------------------------------------------------------


def partition(num_units: int, capacities: Sequence[int], cost: Callable[[int, int], tuple[int, int]]) -> tuple[int, ...]:
    """Split units ``0..num_units-1`` into ``len(capacities)`` contiguous non-empty stages.

    ``cost(i, j)`` gives (peak bytes, incoming copy bytes) of a stage holding
    units ``i..j`` inclusive.  Minimises the largest ``peak / capacity``, then the
    total copy bytes, then uneven stages; returns the first unit of every stage after the first.
    Exact over all contiguous splits (a DP over (stage, last unit)).
    """
    stages = min(len(capacities), num_units)
    inf = (float("inf"), float("inf"), float("inf"))
    # best[d][j]: (max ratio, copy bytes, sum of squared ratios) placing units 0..j on devices 0..d;
    # the squares only break ties, towards even stages.
    best = [[inf] * num_units for _ in range(stages)]
    cut = [[-1] * num_units for _ in range(stages)]
    for j in range(num_units):
        peak, copied = cost(0, j)
        ratio = peak / capacities[0]
        best[0][j] = (ratio, copied, ratio * ratio)
    for d in range(1, stages):
        for j in range(d, num_units):
            for i in range(d, j + 1):
                prev = best[d - 1][i - 1]
                if prev[0] == float("inf"):
                    continue
                peak, copied = cost(i, j)
                ratio = peak / capacities[d]
                cand = (max(prev[0], ratio), prev[1] + copied, prev[2] + ratio * ratio)
                if cand < best[d][j]:
                    best[d][j], cut[d][j] = cand, i
    starts, j = [], num_units - 1
    for d in range(stages - 1, 0, -1):
        i = cut[d][j]
        starts.append(i)
        j = i - 1
    return tuple(reversed(starts))


class SegmentCost:
    """Predicted (peak, incoming copy bytes) of a device running a contiguous run of units.

    Estimates what ``inject_copies`` + liveness would give for that device: its
    own storages live from their birth to their last local use or their first use
    elsewhere (when the copy out runs); storages from elsewhere arrive as copies
    live over their local uses.  The final plan is computed exactly.

    Storages used by one unit only are summed once per unit into a live profile
    over the schedule, and the profiles are prefix-summed over units, so a stage's
    profile is one vector difference; only storages crossing units are walked.
    """

    def __init__(self, graph: Graph, order: Sequence[int], unit_of_op: Sequence[int], num_units: int) -> None:
        topo = graph.topology
        steps = len(order)
        spans: dict[int, dict[int, tuple[int, int]]] = {}
        for step, k in enumerate(order):
            u = unit_of_op[k]
            for s in topo.op_storages[k]:
                uses = spans.setdefault(s, {})
                uses[u] = (uses[u][0], step) if u in uses else (step, step)
        delta = np.zeros((num_units, steps + 1), dtype=np.int64)
        static = np.zeros(num_units + 1, dtype=np.int64)
        self._crossing: list[tuple[int, int, bool, int, dict[int, tuple[int, int]]]] = []
        self._crossing_of_unit: list[list[int]] = [[] for _ in range(num_units)]
        for s, uses in spans.items():
            size = topo.nbytes[s]
            home = unit_of_op[topo.producer[s]] if topo.producer[s] >= 0 else min(uses, key=lambda u: uses[u][0])
            if len(uses) == 1:
                first, last = uses[home]
                if topo.is_static[s]:
                    static[home + 1] += size
                else:
                    last = steps - 1 if s in topo.output_storages else last
                    delta[home, first] += size
                    delta[home, last + 1] -= size
                continue
            index = len(self._crossing)
            self._crossing.append((size, home, topo.is_static[s], int(s in topo.output_storages), uses))
            for u in uses:
                self._crossing_of_unit[u].append(index)
        profiles = np.cumsum(delta[:, :steps], axis=1)
        self._cum = np.vstack([np.zeros((1, steps), dtype=np.int64), np.cumsum(profiles, axis=0)])
        self._static = np.cumsum(static)
        self._end = steps - 1
        self._memo: dict[tuple[int, int], tuple[int, int]] = {}

    def __call__(self, i: int, j: int) -> tuple[int, int]:
        key = (i, j)
        if key not in self._memo:
            self._memo[key] = self._evaluate(i, j)
        return self._memo[key]

    def _evaluate(self, i: int, j: int) -> tuple[int, int]:
        profile = self._cum[j + 1] - self._cum[i]
        static = int(self._static[j + 1] - self._static[i])
        copied = 0
        crossing = {c for u in range(i, j + 1) for c in self._crossing_of_unit[u]}
        for c in sorted(crossing):
            size, home, is_static, is_output, uses = self._crossing[c]
            inside = [use for u, use in uses.items() if i <= u <= j]
            first = min(use[0] for use in inside)
            last = max(use[1] for use in inside)
            if i <= home <= j:
                if is_static:
                    static += size
                    continue
                later = [use[0] for u, use in uses.items() if not i <= u <= j and use[0] > first]
                if later:
                    last = max(last, min(later))
                if is_output:
                    last = self._end
            else:
                copied += size
            profile[first : last + 1] += size
        return static + int(profile.max(initial=0)), copied


# --- evaluating a full placement exactly -----------------------------------------------------


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


# --- the placement strategies -----------------------------------------------------------------


def place_single(graph: Graph, device: str) -> tuple[str, ...]:
    return tuple(device for _ in graph.ops)


def place_manual(
    graph: Graph, order: Sequence[int], devices: Sequence[str], device_map: Mapping[str, str] | None
) -> tuple[str, ...]:
    """Anchors from ``device_map`` (longest module-path prefix wins; "" matches all) or ``Op.device``."""
    anchors: dict[int, str] = {}
    if device_map:
        prefixes = sorted(device_map, key=len, reverse=True)
        for k in forward_ops(graph, order):
            module = graph.ops[k].module or ""
            for prefix in prefixes:
                if prefix == "" or module == prefix or module.startswith(prefix + "."):
                    anchors[k] = device_map[prefix]
                    break
    else:
        anchors = {k: op.device for k, op in enumerate(graph.ops) if op.device is not None}
    unknown = sorted({d for d in anchors.values() if d not in devices})
    if unknown:
        raise InfeasibleError(f"placement names unknown device {unknown[0]!r}; devices are {', '.join(devices)}")
    if not anchors:
        anchors = {order[0]: devices[0]}
    return complete(graph, order, anchors)


def place_pipeline(
    graph: Graph,
    order: Sequence[int],
    capacities: Mapping[str, int],
    *,
    max_units: int = 48,
    no_split: Sequence[str] = (),
    refine_steps: int = 64,
) -> tuple[str, ...]:
    """Contiguous stages over the forward ops by the exact DP, then boundary refinement.

    The DP scores stages with ``SegmentCost``; refinement moves one boundary by one
    unit at a time while the exact post-copy peaks improve.
    """
    devices = list(capacities)
    units = make_units(graph, forward_ops(graph, order), max(max_units, len(devices)), no_split)
    if len(devices) == 1 or len(units) <= 1:
        return place_single(graph, devices[0])
    unit_anchor = {k: str(u) for u, run in enumerate(units) for k in run}
    unit_of_op = [int(x) for x in complete(graph, order, unit_anchor)]
    coster = SegmentCost(graph, order, unit_of_op, len(units))
    starts = list(partition(len(units), [capacities[d] for d in devices], coster))

    def placement_for(cuts: Sequence[int]) -> tuple[str, ...]:
        bounds = [0, *cuts, len(units)]
        stage_of_unit = [0] * len(units)
        for stage in range(len(bounds) - 1):
            for u in range(bounds[stage], bounds[stage + 1]):
                stage_of_unit[u] = stage
        return tuple(devices[stage_of_unit[u]] for u in unit_of_op)

    def score(cuts: Sequence[int]) -> tuple[float, int]:
        load = device_loads(graph, order, placement_for(cuts), devices)
        return worst_ratio(load, capacities), load.placed.cross_device_bytes

    best = score(starts)
    for _ in range(refine_steps):
        improved = False
        for b in range(len(starts)):
            for delta in (-1, 1):
                cand = list(starts)
                cand[b] += delta
                lo = cand[b - 1] if b else 0
                hi = cand[b + 1] if b + 1 < len(cand) else len(units)
                if not lo < cand[b] < hi:
                    continue
                s = score(cand)
                if s < best:
                    best, starts, improved = s, cand, True
        if not improved:
            break
    return placement_for(starts)


def shift(
    graph: Graph,
    order: Sequence[int],
    op_device: Sequence[str],
    activations: Sequence[str],
    src: str,
    dst: str,
) -> tuple[str, ...]:
    """Caffe2's ShiftActivationDevices on the IR: move ``activations`` from ``src`` to ``dst``.

    Label propagation over the ops on ``src`` in schedule order: the named
    activations are labelled ``dst``, every other activation ``src``; an op takes
    the label of the last activation among its inputs and outputs (outputs come
    last, so they decide), else of any labelled tensor, else keeps its device; its
    unlabelled tensors then inherit the op's label.  Forward ops producing a named
    activation and backward ops consuming it therefore move together.
    """
    topo = graph.topology
    index = topo.tensor_index
    missing = [a for a in activations if a not in index]
    if missing:
        raise InfeasibleError(f"shift: unknown tensor {missing[0]!r}")
    chosen = {index[a] for a in activations}
    label: dict[int, str] = {}
    for t, tensor in enumerate(graph.tensors):
        if tensor.kind is Kind.ACTIVATION and not topo.is_static[topo.storage_of[t]]:
            label[t] = dst if t in chosen else src
    result = list(op_device)
    for k in order:
        if op_device[k] != src:
            continue
        tensors = [*topo.op_inputs[k], *topo.op_outputs[k]]
        device = None
        for t in tensors:
            if t in label and (graph.tensors[t].kind is Kind.ACTIVATION or device is None):
                device = label[t]
        device = device or op_device[k]
        for t in tensors:
            label.setdefault(t, device)
        result[k] = device
    return tuple(result)

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
import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from mpplan import sim
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph, Kind, is_pure_view
from mpplan.passes.copies import Placed, inject_copies, legalize
from mpplan.liveness import live_ranges


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
    _follow_state(graph, order, label, user_label)
    default = label[order[0]] if order and order[0] in label else next(iter(anchors.values()), "")
    for k in order:
        if k in label:
            continue
        label[k] = _follow(graph, k, label) or default
    for k in range(len(graph.ops)):
        if is_pure_view(graph, k):
            producer = topo.producer[topo.storage_of[topo.op_inputs[k][0]]]
            if producer >= 0:
                label[k] = label[producer]
    return tuple(label[k] for k in range(len(graph.ops)))


def _follow_state(graph: Graph, order: Sequence[int], label: dict[int, str], state_label: dict[int, str]) -> None:
    """Label the optimizer's ops where the gradients they read were made, and keep each
    piece of pre-existing state (Adam's moments) with the ops that update it.

    Propagates to a fixpoint: ``exp_avg_sq.mul_(beta2)`` learns its device only from the
    later ``exp_avg_sq.addcmul_(grad, grad)``, whose gradient's producer is placed.
    """
    topo = graph.topology
    pending = [k for k in order if k not in label]
    changed = True
    while changed and pending:
        changed = False
        for k in pending:
            found = None
            for s in topo.op_storages[k]:
                p = topo.producer[s]
                found = label.get(p) if p >= 0 else state_label.get(s)
                if found is not None:
                    break
            if found is None:
                continue
            label[k], changed = found, True
            for s in topo.op_storages[k]:
                if topo.producer[s] < 0:
                    state_label.setdefault(s, found)
        pending = [k for k in pending if k not in label]


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
    """Ops in ``order`` that belong to the forward pass: the anchors a partition places.

    After the forward pass: backward ops, recomputes, ops that read gradients or
    optimizer state (the optimizer's arithmetic), and every op that reads what one of
    those made.  Not anchors either: in-place updates of pre-existing state (a batch
    norm's running stats: the op follows its tensor) and views of weights (they touch
    no dynamic storage, and must run with their reader, or a view decides the weight's home).
    """
    topo = graph.topology
    state_kinds = (Kind.GRAD, Kind.OPTIMIZER_STATE)
    made_after_forward: set[int] = set()
    forward = []
    for k in order:
        op = graph.ops[k]
        storages = topo.op_storages[k]
        if (
            op.backward_of is not None
            or op.recompute_of is not None
            or any(graph.tensors[s].kind in state_kinds or s in made_after_forward for s in storages)
        ):
            outputs = topo.op_outputs[k]  # new storages only: a view of a weight or an in-place update makes none
            made_after_forward.update(t for t in outputs if topo.storage_of[t] == t and t not in topo.op_inputs[k])
            continue
        updates_state = any(topo.producer[topo.storage_of[topo.tensor_index[t]]] < 0 for t in op.in_place)
        if not updates_state and any(not topo.is_static[s] for s in storages):
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
    units ``i..j`` inclusive.  Minimises the largest ``peak / capacity`` (exactly), then
    uneven stages (the sum of squared ratios), then the total copy bytes; returns the first
    unit of every stage after the first.  Balance comes before copies so that a stage
    whose peak is forced (one large unit) does not leave the other devices nearly empty.
    Exact over all contiguous splits (a DP over (stage, last unit)).
    """
    stages = min(len(capacities), num_units)
    inf = (float("inf"), float("inf"), float("inf"))
    # best[d][j]: (max ratio, sum of squared ratios, copy bytes) placing units 0..j on devices 0..d.
    best = [[inf] * num_units for _ in range(stages)]
    cut = [[-1] * num_units for _ in range(stages)]
    for j in range(num_units):
        peak, copied = cost(0, j)
        ratio = peak / capacities[0]
        best[0][j] = (ratio, ratio * ratio, copied)
    for d in range(1, stages):
        for j in range(d, num_units):
            for i in range(d, j + 1):
                prev = best[d - 1][i - 1]
                if prev[0] == float("inf"):
                    continue
                peak, copied = cost(i, j)
                ratio = peak / capacities[d]
                cand = (max(prev[0], ratio), prev[1] + ratio * ratio, prev[2] + copied)
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

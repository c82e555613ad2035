"""The independent verifier: re-derive everything a plan claims from the graph alone.

It deliberately shares no code with the planner's decisions (no ``Topology``,
no liveness pass, no simulator): dependencies, in-place versions, aliases,
lifetimes, overlaps and peaks are recomputed here from tensor and op names, so a
bug in a pass cannot hide itself.  The first violation raises
``VerificationError`` with a message naming the op, tensor or device.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind
from mpplan.plan import Plan

_ALWAYS_STATIC = (Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What was checked, for the CLI's one-line summary."""

    ops: int
    buffers: int
    devices: int


def verify(graph: Graph, plan: Plan, *, check_capacity: bool = True) -> VerifyReport:
    """Check ``plan`` against ``graph``; raise ``VerificationError`` on the first violation.

    ``check_capacity=False`` checks correctness only, for plans known not to fit.
    """
    if plan.graph_hash != graph.content_hash:
        _fail(f"plan is for graph hash {plan.graph_hash}, the graph given has {graph.content_hash}")
    tensors = {t.name: t for t in graph.tensors}
    root = _roots(graph)
    ops = {o.name: o for o in graph.ops}
    _check_schedule_names(graph, plan)
    device_of_op = _check_placement(graph, plan)
    expected_version = _as_given_versions(graph, root)
    _replay(graph, plan, root, expected_version)
    first, last = _lifetimes(graph, plan, root)
    device_of_storage = _storage_devices(plan, ops, root, device_of_op)
    static = {s for s in first if _is_static(tensors, tensors[s])}
    dynamic = {s for s in first if s not in static}
    alignment = int(plan.settings.get("alignment", 1) or 1)
    _check_buffers(plan, tensors, dynamic, device_of_storage, alignment)
    for device in plan.devices:
        mine = [s for s in dynamic if device_of_storage[s] == device.name]
        _check_no_overlap(plan, device.name, mine, first, last)
        _check_peaks(plan, device, tensors, static, mine, first, last, device_of_storage)
        if check_capacity and device.peak_bytes > device.capacity_bytes:
            _fail(f"device {device.name}: peak {device.peak_bytes} exceeds capacity {device.capacity_bytes}")
    if plan.settings.get("parallel_safe"):
        _check_parallel_safe(graph, plan, root, dynamic)
    claimed = max((d.peak_bytes for d in plan.devices), default=0)
    if plan.max_peak_bytes != claimed:
        _fail(f"predicted.max_peak_bytes is {plan.max_peak_bytes}, the devices' peaks give {claimed}")
    return VerifyReport(ops=len(plan.schedule), buffers=len(plan.buffers), devices=len(plan.devices))


def _fail(message: str) -> None:
    raise VerificationError(message)


def _roots(graph: Graph) -> dict[str, str]:
    bases = {t.name: t.alias_of for t in graph.tensors}
    roots: dict[str, str] = {}
    for name in bases:
        seen, cur = set(), name
        while bases[cur] is not None:
            if cur in seen:
                _fail(f"tensor {name!r}: alias cycle")
            seen.add(cur)
            cur = bases[cur]  # type: ignore[assignment]
        roots[name] = cur
    return roots


def _is_static(tensors: dict, tensor) -> bool:
    if tensor.kind in _ALWAYS_STATIC:
        return True
    return tensor.kind is Kind.GRAD and tensor.grad_of is not None and tensors[tensor.grad_of].kind is Kind.PARAM


def _check_schedule_names(graph: Graph, plan: Plan) -> None:
    known = {o.name for o in graph.ops}
    seen: set[str] = set()
    for step, name in enumerate(plan.schedule):
        if name not in known:
            _fail(f"schedule step {step}: unknown op {name!r}")
        if name in seen:
            _fail(f"schedule step {step}: op {name!r} scheduled twice")
        seen.add(name)
    missing = [o.name for o in graph.ops if o.name not in seen]
    if missing:
        _fail(f"schedule: op {missing[0]!r} is never scheduled ({len(missing)} missing)")


def _check_placement(graph: Graph, plan: Plan) -> dict[str, str]:
    names = {d.name for d in plan.devices}
    if not names:
        _fail("plan lists no devices")
    placement: dict[str, str] = {}
    for op in graph.ops:
        device = plan.placement.get(op.name)
        if device is None:
            if len(names) > 1:
                _fail(f"op {op.name!r}: no device in placement")
            device = next(iter(names))
        if device not in names:
            _fail(f"op {op.name!r}: placed on unknown device {device!r}")
        placement[op.name] = device
    return placement


def _as_given_versions(graph: Graph, root: dict[str, str]) -> dict[tuple[str, str], int]:
    """The storage version each (op, input tensor) reads in the graph's own order."""
    version: dict[str, int] = {}
    expected: dict[tuple[str, str], int] = {}
    for op in graph.ops:
        for t in op.inputs:
            expected[(op.name, t)] = version.get(root[t], 0)
        for t in op.outputs:
            if t in op.inputs:
                version[root[t]] = version.get(root[t], 0) + 1
    return expected


def _replay(graph: Graph, plan: Plan, root: dict[str, str], expected: dict[tuple[str, str], int]) -> None:
    """Run the schedule symbolically: every read sees the version the graph's order gives it."""
    ops = {o.name: o for o in graph.ops}
    exists = {t.name for t in graph.tensors if t.kind in _ALWAYS_STATIC}
    producers = {t for o in graph.ops for t in o.outputs if t not in o.inputs}
    exists |= {t.name for t in graph.tensors if t.alias_of is not None and t.name not in producers}
    version: dict[str, int] = {}
    for step, name in enumerate(plan.schedule):
        op = ops[name]
        for t in op.inputs:
            if t not in exists and root[t] == t:
                _fail(f"schedule step {step}: op {name!r} reads tensor {t!r} before it is produced")
            if t not in exists:
                _fail(f"schedule step {step}: op {name!r} reads view {t!r} before it is created")
            if version.get(root[t], 0) != expected[(name, t)]:
                _fail(
                    f"schedule step {step}: op {name!r} reads tensor {t!r} at version {version.get(root[t], 0)}, "
                    f"the graph's order has it read version {expected[(name, t)]} (an in-place write moved)"
                )
        for t in op.outputs:
            if t in op.inputs:
                version[root[t]] = version.get(root[t], 0) + 1
            else:
                exists.add(t)


def _lifetimes(graph: Graph, plan: Plan, root: dict[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    ops = {o.name: o for o in graph.ops}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for step, name in enumerate(plan.schedule):
        op = ops[name]
        for t in (*op.inputs, *op.outputs):
            first.setdefault(root[t], step)
            last[root[t]] = step
    end = len(plan.schedule) - 1
    outputs = set(graph.outputs) | {t.name for t in graph.tensors if t.kind is Kind.OUTPUT}
    for t in outputs:
        if root[t] in last:
            last[root[t]] = end
    return first, last


def _storage_devices(plan: Plan, ops: dict, root: dict[str, str], device_of_op: dict[str, str]) -> dict[str, str]:
    """Each storage lives on the device of the first scheduled op that touches it."""
    device: dict[str, str] = {}
    for name in plan.schedule:
        op = ops[name]
        for t in (*op.outputs, *op.inputs):
            device.setdefault(root[t], device_of_op[name])
    for name in plan.schedule:
        op = ops[name]
        for t in (*op.inputs, *op.outputs):
            if device[root[t]] != device_of_op[name]:
                _fail(
                    f"op {name!r} on {device_of_op[name]} touches tensor {t!r} that lives on "
                    f"{device[root[t]]} without a copy"
                )
    return device


def _check_buffers(plan: Plan, tensors: dict, dynamic: set[str], device_of: dict[str, str], alignment: int) -> None:
    for name in plan.buffers:
        if name not in dynamic:
            _fail(f"buffer {name!r}: not a dynamic storage of the graph")
    arena = {d.name: d.arena_bytes for d in plan.devices}
    for s in sorted(dynamic):
        buf = plan.buffers.get(s)
        if buf is None:
            _fail(f"tensor {s!r}: dynamic storage without a buffer")
        if buf.device != device_of[s]:
            _fail(f"tensor {s!r}: buffer on {buf.device}, but the tensor lives on {device_of[s]}")
        if buf.bytes < tensors[s].nbytes:
            _fail(f"tensor {s!r}: buffer of {buf.bytes} bytes holds a tensor of {tensors[s].nbytes}")
        if buf.offset < 0 or buf.offset % alignment or buf.bytes % alignment:
            _fail(f"tensor {s!r}: offset {buf.offset} / size {buf.bytes} not aligned to {alignment} bytes")
        if buf.offset + buf.bytes > arena[buf.device]:
            _fail(
                f"tensor {s!r}: buffer [{buf.offset}, {buf.offset + buf.bytes}) overruns the "
                f"{arena[buf.device]}-byte arena of {buf.device}"
            )


def _check_no_overlap(plan: Plan, device: str, storages: list[str], first: dict[str, int], last: dict[str, int]) -> None:
    """Sweep over steps; among buffers live together, neighbours by offset must not intersect."""
    sized = [s for s in storages if plan.buffers[s].bytes]
    starts = sorted(sized, key=lambda s: (first[s], s))
    ends = sorted(sized, key=lambda s: (last[s], s))
    active: list[tuple[int, int, str]] = []  # (offset, end, name) sorted by offset
    j = 0
    for s in starts:
        step = first[s]
        while j < len(ends) and last[ends[j]] < step:
            gone = ends[j]
            buf = plan.buffers[gone]
            active.pop(bisect.bisect_left(active, (buf.offset, buf.offset + buf.bytes, gone)))
            j += 1
        buf = plan.buffers[s]
        item = (buf.offset, buf.offset + buf.bytes, s)
        pos = bisect.bisect_left(active, item)
        for other in active[max(0, pos - 1) : pos + 1]:
            if other[0] < item[1] and item[0] < other[1]:
                _fail(
                    f"device {device}: tensors {other[2]!r} and {s!r} are live together (steps "
                    f"{first[other[2]]}..{last[other[2]]} and {first[s]}..{last[s]}) but their buffers overlap "
                    f"([{other[0]}, {other[1]}) and [{item[0]}, {item[1]}))"
                )
        active.insert(pos, item)


def _check_peaks(plan, device, tensors, static, dynamic, first, last, device_of) -> None:
    static_bytes = sum(tensors[s].nbytes for s in static if device_of[s] == device.name)
    if device.static_bytes != static_bytes:
        _fail(f"device {device.name}: static_bytes claimed {device.static_bytes}, the graph gives {static_bytes}")
    used = max((plan.buffers[s].offset + plan.buffers[s].bytes for s in dynamic), default=0)
    if device.arena_bytes < used:
        _fail(f"device {device.name}: arena_bytes {device.arena_bytes} is below the buffers' extent {used}")
    if device.peak_bytes != device.static_bytes + device.arena_bytes:
        _fail(f"device {device.name}: peak_bytes {device.peak_bytes} != static {device.static_bytes} + arena {device.arena_bytes}")
    events: dict[int, int] = {}
    for s in dynamic:
        events[first[s]] = events.get(first[s], 0) + tensors[s].nbytes
        events[last[s] + 1] = events.get(last[s] + 1, 0) - tensors[s].nbytes
    live = load = 0
    for step in sorted(events):
        live += events[step]
        load = max(load, live)
    if device.lower_bound_bytes != static_bytes + load:
        _fail(
            f"device {device.name}: lower_bound_bytes {device.lower_bound_bytes} != static {static_bytes} + LOAD {load}"
        )


def _check_parallel_safe(graph: Graph, plan: Plan, root: dict[str, str], dynamic: set[str]) -> None:
    """Buffers that share memory must be ordered by the DAG: every use of one precedes the other's birth."""
    producer: dict[str, int] = {}
    writer: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    ancestors = [0] * len(graph.ops)
    users: dict[str, list[int]] = {}
    for i, op in enumerate(graph.ops):
        deps = 0
        for t in op.inputs:
            for p in (producer.get(t), writer.get(root[t])):
                if p is not None:
                    deps |= ancestors[p] | (1 << p)
        for t in op.outputs:
            if t in op.inputs:
                for r in readers.get(root[t], ()):
                    if r != i:
                        deps |= ancestors[r] | (1 << r)
        ancestors[i] = deps
        for t in op.inputs:
            readers.setdefault(root[t], []).append(i)
        for t in op.outputs:
            if t in op.inputs:
                readers[root[t]] = []
                writer[root[t]] = i
            else:
                producer[t] = i
                if root[t] == t:
                    writer[t] = i
        for t in (*op.inputs, *op.outputs):
            users.setdefault(root[t], []).append(i)
    ordered = sorted(dynamic, key=lambda s: (plan.buffers[s].device, plan.buffers[s].offset, s))

    def before(a: str, b: str) -> bool:
        birth = min(users[b])
        return all(ancestors[birth] >> u & 1 for u in users[a])

    for i, a in enumerate(ordered):
        ba = plan.buffers[a]
        for b in ordered[i + 1 :]:
            bb = plan.buffers[b]
            if bb.device != ba.device or bb.offset >= ba.offset + ba.bytes:
                break
            if ba.bytes and bb.bytes and not (before(a, b) or before(b, a)):
                _fail(f"parallel_safe: tensors {a!r} and {b!r} share memory but may run concurrently")

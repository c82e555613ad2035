"""The independent verifier: re-derive everything a plan claims from the graph alone.

It deliberately shares no code with the planner's decisions (no ``Topology``,
no liveness pass, no simulator, no copy pass): dependencies, in-place versions,
aliases, copies, lifetimes, overlaps and peaks are recomputed here from tensor
and op names, so a bug in a pass cannot hide itself.  The first violation raises
``VerificationError`` with a message naming the op, tensor or device.

The plan's copies are replayed as ops: a copy reads its tensor on ``src`` and
writes a new tensor named like the copy on ``dst``; from then on, ops on ``dst``
read the copy instead of the tensor.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from mpplan.errors import ConfigError, VerificationError
from mpplan.graph import Graph, Kind, Tensor
from mpplan.passes.remat import apply_recompute
from mpplan.plan import Copy, Plan

_ALWAYS_STATIC = (Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE)


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What was checked, for the CLI's one-line summary."""

    ops: int
    buffers: int
    devices: int
    copies: int


@dataclass(frozen=True, slots=True)
class _Touch:
    """Op at ``step`` on ``device`` reads or writes storage ``storage``."""

    step: int
    device: str


def verify(graph: Graph, plan: Plan, *, check_capacity: bool = True) -> VerifyReport:
    """Check ``plan`` against ``graph``; raise ``VerificationError`` on the first violation.

    ``check_capacity=False`` checks correctness only, for plans known not to fit.
    """
    if plan.graph_hash != graph.content_hash:
        _fail(f"plan is for graph hash {plan.graph_hash}, the graph given has {graph.content_hash}")
    graph = _with_recomputes(graph, plan)
    tensors = {t.name: t for t in graph.tensors}
    copies = _check_copies(plan, tensors)
    for c in copies.values():
        tensors[c.name] = Tensor(c.name, c.bytes, Kind.ACTIVATION)
    root = _roots(tensors)
    _check_schedule_names(graph, plan, copies)
    device_of_op = _check_placement(graph, plan, copies)
    touches = _replay(graph, plan, root, copies, device_of_op)
    home = _homes(touches)
    grads_dynamic = plan.settings.get("grads", "static") == "dynamic"
    static = {s for s in touches if _is_static(tensors, tensors[s], grads_dynamic)}
    dynamic = {s for s in touches if s not in static}
    first = {s: t[0].step for s, t in touches.items()}
    last = {s: t[-1].step for s, t in touches.items()}
    end = len(plan.schedule) - 1
    held_to_end = set(graph.outputs) | {t.name for t in graph.tensors if t.kind is Kind.OUTPUT}
    if grads_dynamic:  # eager's .grad: made by backward, held to the end of the step
        held_to_end |= {t.name for t in graph.tensors if _is_param_grad(tensors, t)}
    for name in held_to_end:
        if root[name] in last:
            last[root[name]] = end
    alignment = int(plan.settings.get("alignment", 1) or 1)
    _check_buffers(plan, tensors, dynamic, home, alignment)
    for device in plan.devices:
        mine = [s for s in dynamic if home[s] == device.name]
        _check_no_overlap(plan, device.name, mine, first, last)
        _check_peaks(plan, device, tensors, [s for s in static if home[s] == device.name], mine, first, last)
        if check_capacity and device.peak_bytes > device.capacity_bytes:
            _fail(f"device {device.name}: peak {device.peak_bytes} exceeds capacity {device.capacity_bytes}")
    if plan.settings.get("parallel_safe"):
        _check_parallel_safe(graph, plan, root, dynamic)
    claimed = max((d.peak_bytes for d in plan.devices), default=0)
    if plan.max_peak_bytes != claimed:
        _fail(f"predicted.max_peak_bytes is {plan.max_peak_bytes}, the devices' peaks give {claimed}")
    moved = sum(c.bytes for c in copies.values())
    if plan.cross_device_bytes != moved:
        _fail(f"predicted.cross_device_bytes is {plan.cross_device_bytes}, the copies move {moved}")
    return VerifyReport(ops=len(plan.schedule), buffers=len(plan.buffers), devices=len(plan.devices), copies=len(copies))


def _fail(message: str) -> None:
    raise VerificationError(message)


def _roots(tensors: dict[str, Tensor]) -> dict[str, str]:
    roots: dict[str, str] = {}
    for name in tensors:
        seen, cur = set(), name
        while tensors[cur].alias_of is not None:
            if cur in seen:
                _fail(f"tensor {name!r}: alias cycle")
            seen.add(cur)
            cur = tensors[cur].alias_of  # type: ignore[assignment]
        roots[name] = cur
    return roots


def _is_static(tensors: dict[str, Tensor], tensor: Tensor, grads_dynamic: bool) -> bool:
    if tensor.kind in _ALWAYS_STATIC:
        return True
    return not grads_dynamic and _is_param_grad(tensors, tensor)


def _is_param_grad(tensors: dict[str, Tensor], tensor: Tensor) -> bool:
    return tensor.kind is Kind.GRAD and tensor.grad_of is not None and tensors[tensor.grad_of].kind is Kind.PARAM


def _with_recomputes(graph: Graph, plan: Plan) -> Graph:
    """The graph the plan runs: ``graph`` rewritten with the recomputes ``plan.remat`` lists.

    The rewrite is the one documented contract of ``remat`` (recompute ``op`` before
    the late readers of its outputs); everything the plan then claims about the
    rewritten graph is checked like any other plan.
    """
    if not plan.remat:
        return graph
    try:
        rewritten = apply_recompute(graph, dict.fromkeys(str(r["op"]) for r in plan.remat))
    except (ConfigError, KeyError) as exc:
        _fail(f"remat: {exc}")
    ops = {op.name for op in rewritten.ops}
    tensors = {t.name: t for t in rewritten.tensors}
    for r in plan.remat:
        if r.get("recompute_op") not in ops:
            _fail(f"remat: recompute op {r.get('recompute_op')!r} of {r.get('tensor')!r} is not in the rewritten graph")
        tensor = tensors.get(str(r.get("recompute_tensor")))
        if tensor is None or tensor.nbytes != r.get("bytes"):
            _fail(f"remat: recompute tensor {r.get('recompute_tensor')!r} is missing or has other bytes than listed")
    return rewritten


def _check_copies(plan: Plan, tensors: dict[str, Tensor]) -> dict[str, Copy]:
    copies: dict[str, Copy] = {}
    devices = {d.name for d in plan.devices}
    for c in plan.copies:
        if c.name in tensors or c.name in copies:
            _fail(f"copy {c.name!r}: name clashes with a tensor or another copy")
        if c.tensor not in tensors:
            _fail(f"copy {c.name!r}: copies unknown tensor {c.tensor!r}")
        if c.src not in devices or c.dst not in devices or c.src == c.dst:
            _fail(f"copy {c.name!r}: needs two different known devices, got {c.src!r} -> {c.dst!r}")
        if c.bytes < tensors[c.tensor].nbytes:
            _fail(f"copy {c.name!r}: moves {c.bytes} bytes of a {tensors[c.tensor].nbytes}-byte tensor")
        copies[c.name] = c
    return copies


def _check_schedule_names(graph: Graph, plan: Plan, copies: dict[str, Copy]) -> None:
    known = {o.name for o in graph.ops} | set(copies)
    seen: set[str] = set()
    for step, name in enumerate(plan.schedule):
        if name not in known:
            _fail(f"schedule step {step}: unknown op {name!r}")
        if name in seen:
            _fail(f"schedule step {step}: op {name!r} scheduled twice")
        seen.add(name)
    missing = [n for n in [o.name for o in graph.ops] + list(copies) if n not in seen]
    if missing:
        _fail(f"schedule: op {missing[0]!r} is never scheduled ({len(missing)} missing)")


def _check_placement(graph: Graph, plan: Plan, copies: dict[str, Copy]) -> dict[str, str]:
    names = [d.name for d in plan.devices]
    if not names:
        _fail("plan lists no devices")
    placement: dict[str, str] = {}
    for name in [o.name for o in graph.ops] + list(copies):
        device = plan.placement.get(name)
        if device is None:
            if len(names) > 1:
                _fail(f"op {name!r}: no device in placement")
            device = names[0]
        if device not in names:
            _fail(f"op {name!r}: placed on unknown device {device!r}")
        if name in copies and device != copies[name].dst:
            _fail(f"copy {name!r}: placed on {device}, but it copies to {copies[name].dst}")
        placement[name] = device
    return placement


def _replay(
    graph: Graph, plan: Plan, root: dict[str, str], copies: dict[str, Copy], device_of: dict[str, str]
) -> dict[str, list[_Touch]]:
    """Run the schedule symbolically; return every storage's touches in step order.

    Every read must see the version the graph's own order gives it (so in-place
    writes keep their place among readers); an op reads a copy on its device
    when one has run, else the tensor itself.  A view made from a copy is a view
    of the copy: it lives where the copy does, at the version copied.
    """
    ops = {o.name: o for o in graph.ops}
    alias_of = {t.name: t.alias_of for t in graph.tensors}
    expected: dict[tuple[str, str], int] = {}
    version: dict[str, int] = {}
    for op in graph.ops:
        for t in op.inputs:
            expected[(op.name, t)] = version.get(root[t], 0)
        for t in op.in_place:
            version[root[t]] = version.get(root[t], 0) + 1
    produced = {t for o in graph.ops for t in o.outputs if t not in o.inputs}
    exists = {name for name in root if name not in produced and name not in copies}
    version = {}
    arrived: dict[tuple[str, str], tuple[str, int]] = {}  # (tensor, device) -> (copy name, version copied)
    of_copy: dict[str, tuple[str, int]] = {}  # view made from a copy -> (copy name, version copied)
    touches: dict[str, list[_Touch]] = {}

    def touch(tensor: str, step: int, device: str) -> None:
        touches.setdefault(root[tensor], []).append(_Touch(step, device))

    for step, name in enumerate(plan.schedule):
        device = device_of[name]
        if name in copies:
            c = copies[name]
            if c.tensor not in exists:
                _fail(f"schedule step {step}: copy {name!r} reads tensor {c.tensor!r} before it is produced")
            touch(c.tensor, step, c.src)
            touch(name, step, device)
            arrived[(c.tensor, c.dst)] = (name, version.get(root[c.tensor], 0))
            exists.add(name)
            continue
        op = ops[name]
        read_copy: dict[str, tuple[str, int]] = {}  # input -> (copy read in its place, version)
        for t in op.inputs:
            if t not in exists:
                _fail(f"schedule step {step}: op {name!r} reads tensor {t!r} before it is produced")
            seen = version.get(root[t], 0)
            read = t
            if t in of_copy:
                read, seen = of_copy[t]
            elif (t, device) in arrived and t not in op.outputs:
                read, seen = arrived[(t, device)]
            if seen != expected[(name, t)]:
                what = f"its copy {read!r}" if read != t else f"tensor {t!r}"
                _fail(
                    f"schedule step {step}: op {name!r} reads {what} at version {seen}, the graph's order has it "
                    f"read version {expected[(name, t)]} (an in-place write moved)"
                )
            touch(read, step, device)
            if read != t:
                read_copy[t] = (read, seen)
        for t in op.outputs:
            base = alias_of[t]
            if t in op.inputs and t in of_copy:
                _fail(f"schedule step {step}: op {name!r} writes {t!r}, a view of copy {of_copy[t][0]!r}, in place")
            if t in op.inputs:
                version[root[t]] = version.get(root[t], 0) + 1
            else:
                exists.add(t)
                if base in read_copy:
                    of_copy[t] = read_copy[base]
            touch(of_copy[t][0] if t in of_copy else t, step, device)
    return touches


def _homes(touches: dict[str, list[_Touch]]) -> dict[str, str]:
    home: dict[str, str] = {}
    for s, ts in touches.items():
        devices = sorted({t.device for t in ts})
        if len(devices) > 1:
            _fail(f"tensor {s!r} is used on devices {' and '.join(devices)} without a copy")
        home[s] = devices[0]
    return home


def _check_buffers(plan: Plan, tensors: dict[str, Tensor], dynamic: set[str], home: dict[str, str], alignment: int) -> None:
    for name in plan.buffers:
        if name not in dynamic:
            _fail(f"buffer {name!r}: not a dynamic storage of the graph")
    arena = {d.name: d.arena_bytes for d in plan.devices}
    for s in sorted(dynamic):
        buf = plan.buffers.get(s)
        if buf is None:
            _fail(f"tensor {s!r}: dynamic storage without a buffer")
        if buf.device != home[s]:
            _fail(f"tensor {s!r}: buffer on {buf.device}, but the tensor lives on {home[s]}")
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
    active: list[tuple[int, int, str]] = []  # (offset, end, name), disjoint, sorted by offset
    j = 0
    for s in starts:
        while j < len(ends) and last[ends[j]] < first[s]:
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


def _check_peaks(plan, device, tensors, static, dynamic, first, last) -> None:
    static_bytes = sum(tensors[s].nbytes for s in static)
    if device.static_bytes != static_bytes:
        _fail(f"device {device.name}: static_bytes claimed {device.static_bytes}, the graph gives {static_bytes}")
    used = max((plan.buffers[s].offset + plan.buffers[s].bytes for s in dynamic), default=0)
    if device.arena_bytes < used:
        _fail(f"device {device.name}: arena_bytes {device.arena_bytes} is below the buffers' extent {used}")
    if device.peak_bytes != device.static_bytes + device.arena_bytes:
        _fail(
            f"device {device.name}: peak_bytes {device.peak_bytes} != static {device.static_bytes} "
            f"+ arena {device.arena_bytes}"
        )
    events: dict[int, int] = {}
    for s in dynamic:
        events[first[s]] = events.get(first[s], 0) + tensors[s].nbytes
        events[last[s] + 1] = events.get(last[s] + 1, 0) - tensors[s].nbytes
    live = load = 0
    for step in sorted(events):
        live += events[step]
        load = max(load, live)
    if device.lower_bound_bytes != static_bytes + load:
        _fail(f"device {device.name}: lower_bound_bytes {device.lower_bound_bytes} != static {static_bytes} + LOAD {load}")


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
        for t in op.in_place:
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
    graph_storages = [s for s in dynamic if s in users]
    ordered = sorted(graph_storages, key=lambda s: (plan.buffers[s].device, plan.buffers[s].offset, s))

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

"""The memory a plan claims: buffers in their arenas, no two live buffers overlapping, exact peaks.

Each check is a sweep over sorted events, so a device with ``n`` dynamic storages
costs ``O(n log n)``; nothing here compares pairs of buffers.
"""

from __future__ import annotations

import bisect

from mpplan.errors import VerificationError
from mpplan.plan import Buffer, DevicePlan, Plan


def check_buffers(plan: Plan, size: dict[str, int], dynamic: set[str], home: dict[str, str], alignment: int) -> None:
    """Every dynamic storage has an aligned buffer on its device, big enough, inside the arena; nothing else has one."""
    for name in plan.buffers:
        if name not in dynamic:
            _fail(f"buffer {name!r}: not a dynamic storage of the graph")
    arena = {d.name: d.arena_bytes for d in plan.devices}
    for s in sorted(dynamic):
        buf = plan.buffers.get(s)
        if buf is None:
            _fail(f"tensor {s!r}: dynamic storage without a buffer")
            return
        if buf.device != home[s]:
            _fail(f"tensor {s!r}: buffer on {buf.device}, but the tensor lives on {home[s]}")
        if buf.bytes < size[s]:
            _fail(f"tensor {s!r}: buffer of {buf.bytes} bytes holds a tensor of {size[s]}")
        if buf.offset < 0 or buf.offset % alignment or buf.bytes % alignment:
            _fail(f"tensor {s!r}: offset {buf.offset} / size {buf.bytes} not aligned to {alignment} bytes")
        if buf.offset + buf.bytes > arena[buf.device]:
            _fail(
                f"tensor {s!r}: buffer [{buf.offset}, {buf.offset + buf.bytes}) overruns the "
                f"{arena[buf.device]}-byte arena of {buf.device}"
            )


def check_no_overlap(buffers: dict[str, Buffer], device: str, storages: list[str], first: dict[str, int],
                     last: dict[str, int]) -> None:
    """Sweep over steps; among buffers live together, neighbours by offset must not intersect.

    The live buffers are kept disjoint and sorted by offset, so a new one need only be
    compared with its two neighbours.
    """
    sized = [s for s in storages if buffers[s].bytes]  # sorted by name: the stable sorts break ties by name
    starts = sorted(sized, key=first.__getitem__)
    ends = sorted(sized, key=last.__getitem__)
    active: list[tuple[int, int, str]] = []  # (offset, end, name), disjoint, sorted by offset
    j = 0
    for s in starts:
        while j < len(ends) and last[ends[j]] < first[s]:
            gone = ends[j]
            buf = buffers[gone]
            active.pop(bisect.bisect_left(active, (buf.offset, buf.offset + buf.bytes, gone)))
            j += 1
        buf = buffers[s]
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


def check_peaks(plan: Plan, device: DevicePlan, size: dict[str, int], static: list[str], dynamic: list[str],
                first: dict[str, int], last: dict[str, int]) -> None:
    """``static_bytes`` from the graph, ``arena_bytes`` covers the buffers, ``peak = static + arena + scratch``,
    and ``lower_bound = static + LOAD`` (the largest sum of live bytes at one step)."""
    static_bytes = sum(size[s] for s in static)
    if device.static_bytes != static_bytes:
        _fail(f"device {device.name}: static_bytes claimed {device.static_bytes}, the graph gives {static_bytes}")
    used = max((plan.buffers[s].offset + plan.buffers[s].bytes for s in dynamic), default=0)
    if device.arena_bytes < used:
        _fail(f"device {device.name}: arena_bytes {device.arena_bytes} is below the buffers' extent {used}")
    if device.peak_bytes != device.static_bytes + device.arena_bytes + device.scratch_bytes:
        _fail(
            f"device {device.name}: peak_bytes {device.peak_bytes} != static {device.static_bytes} "
            f"+ arena {device.arena_bytes} + scratch {device.scratch_bytes}"
        )
    events: dict[int, int] = {}
    for s in dynamic:
        events[first[s]] = events.get(first[s], 0) + size[s]
        events[last[s] + 1] = events.get(last[s] + 1, 0) - size[s]
    live = load = 0
    for step in sorted(events):
        live += events[step]
        load = max(load, live)
    if device.lower_bound_bytes != static_bytes + load:
        _fail(
            f"device {device.name}: lower_bound_bytes {device.lower_bound_bytes} != static {static_bytes} + LOAD {load}"
        )


def check_scratch(plan: Plan, device_of: dict[str, str]) -> None:
    """Every op in ``plan.scratch`` is scheduled and holds >= 0 bytes; each device's ``scratch_bytes`` is
    the largest its ops hold (one op runs at a time, so their scratch never adds up)."""
    largest = {d.name: 0 for d in plan.devices}
    for op, nbytes in plan.scratch.items():
        if op not in device_of:
            _fail(f"scratch: {op!r} is not an op of the schedule")
        if nbytes < 0:
            _fail(f"scratch: op {op!r} holds {nbytes} bytes, expected >= 0")
        largest[device_of[op]] = max(largest[device_of[op]], nbytes)
    for d in plan.devices:
        if d.scratch_bytes != largest[d.name]:
            _fail(f"device {d.name}: scratch_bytes {d.scratch_bytes} != {largest[d.name]}, the most one of its ops "
                  "holds outside the arena")


def _fail(message: str) -> None:
    raise VerificationError(message)

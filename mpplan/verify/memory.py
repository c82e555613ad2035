"""The memory a plan claims: buffers in their arenas, no two live buffers overlapping, exact peaks.

Each check is a sweep over sorted events, so a device with ``n`` dynamic storages
costs ``O(n log n)``; nothing here compares pairs of buffers.
"""

from __future__ import annotations

import bisect
import itertools

from mpplan.errors import VerificationError
from mpplan.plan import Buffer, DevicePlan, Plan


def check_buffers(plan: Plan, size: dict[str, int], dynamic: dict[str, None], home: dict[str, str],
                  alignment: int) -> None:
    """Every dynamic storage has an aligned buffer on its device, big enough, inside the arena; nothing else has one.

    ``dynamic`` holds the dynamic storages in name order, the order in which they are checked."""
    buffers = plan.buffers
    if not buffers.keys() <= dynamic.keys():  # the common case in C; the loop names the first stray buffer
        for name in buffers:
            if name not in dynamic:
                _fail(f"buffer {name!r}: not a dynamic storage of the graph")
    arena = {d.name: d.arena_bytes for d in plan.devices}
    for s in dynamic:
        buf = buffers.get(s)
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

    The live buffers are kept disjoint and ordered by offset (``_Disjoint``), so a new one need
    only be compared with its two neighbours: the one starting below it and the one starting at
    or above it.
    """
    sized = [s for s in storages if buffers[s].bytes]  # sorted by name: the stable sorts break ties by name
    starts = sorted(sized, key=first.__getitem__)
    ends = sorted(sized, key=last.__getitem__)
    live = _Disjoint()
    j, n = 0, len(ends)
    for s in starts:
        begin = first[s]
        while j < n and last[ends[j]] < begin:
            live.remove(buffers[ends[j]].offset)
            j += 1
        buf = buffers[s]
        offset, end = buf.offset, buf.offset + buf.bytes
        for other in live.neighbours(offset):
            other_end, name = live.ends[other]
            if other < end and offset < other_end:
                _fail(
                    f"device {device}: tensors {name!r} and {s!r} are live together (steps "
                    f"{first[name]}..{last[name]} and {begin}..{last[s]}) but their buffers overlap "
                    f"([{other}, {other_end}) and [{offset}, {end}))"
                )
        live.add(offset, end, s)


#: Starts per bucket of ``_Disjoint`` after a split: a few hundred keeps both the buckets and their count short.
_BUCKET = 256


class _Disjoint:
    """Disjoint, non-empty intervals keyed by their start offset, in order.

    The starts are kept sorted in buckets of at most ``2 * _BUCKET`` (a plain sorted list
    would move every later start on each insert and removal: quadratic when tens of
    thousands of buffers are live at once); ``ends`` maps a start to (end, storage).
    """

    def __init__(self) -> None:
        self.buckets: list[list[int]] = []
        self.maxes: list[int] = []  # the last start of each bucket
        self.ends: dict[int, tuple[int, str]] = {}

    def neighbours(self, offset: int) -> list[int]:
        """The start just below ``offset`` and the first start at or above it, those that exist."""
        buckets, maxes = self.buckets, self.maxes
        i = bisect.bisect_left(maxes, offset)
        if i == len(maxes):
            return [maxes[-1]] if maxes else []
        bucket = buckets[i]
        k = bisect.bisect_left(bucket, offset)
        if k:
            return [bucket[k - 1], bucket[k]]
        return [buckets[i - 1][-1], bucket[0]] if i else [bucket[0]]

    def add(self, offset: int, end: int, name: str) -> None:
        self.ends[offset] = (end, name)
        buckets, maxes = self.buckets, self.maxes
        if not buckets:
            buckets.append([offset])
            maxes.append(offset)
            return
        i = min(bisect.bisect_left(maxes, offset), len(maxes) - 1)
        bucket = buckets[i]
        bisect.insort(bucket, offset)
        maxes[i] = bucket[-1]
        if len(bucket) > 2 * _BUCKET:
            buckets[i : i + 1] = [bucket[:_BUCKET], bucket[_BUCKET:]]
            maxes[i : i + 1] = [bucket[_BUCKET - 1], bucket[-1]]

    def remove(self, offset: int) -> None:
        del self.ends[offset]
        i = bisect.bisect_left(self.maxes, offset)
        bucket = self.buckets[i]
        del bucket[bisect.bisect_left(bucket, offset)]
        if bucket:
            self.maxes[i] = bucket[-1]
        else:
            del self.buckets[i], self.maxes[i]


def check_peaks(plan: Plan, device: DevicePlan, size: dict[str, int], static: list[str], dynamic: list[str],
                first: dict[str, int], last: dict[str, int]) -> None:
    """``static_bytes`` from the graph, ``arena_bytes`` covers the buffers, ``peak = static + arena + scratch``,
    and ``lower_bound = static + LOAD`` (the largest sum of live bytes at one step)."""
    static_bytes = sum(size[s] for s in static)
    if device.static_bytes != static_bytes:
        _fail(f"device {device.name}: static_bytes claimed {device.static_bytes}, the graph gives {static_bytes}")
    used = max((b.offset + b.bytes for b in map(plan.buffers.__getitem__, dynamic)), default=0)
    if device.arena_bytes < used:
        _fail(f"device {device.name}: arena_bytes {device.arena_bytes} is below the buffers' extent {used}")
    if plan.blocks:
        check_blocks(plan, device, size, dynamic, first, last)
    elif device.peak_bytes != device.static_bytes + device.arena_bytes + device.scratch_bytes:
        _fail(
            f"device {device.name}: peak_bytes {device.peak_bytes} != static {device.static_bytes} "
            f"+ arena {device.arena_bytes} + scratch {device.scratch_bytes}"
        )
    change = [0] * (len(plan.schedule) + 1)  # live bytes at step i: the sum of change[:i + 1]
    for s in dynamic:
        n = size[s]
        change[first[s]] += n
        change[last[s] + 1] -= n
    load = max(itertools.accumulate(change, initial=0))
    if device.lower_bound_bytes != static_bytes + load:
        _fail(
            f"device {device.name}: lower_bound_bytes {device.lower_bound_bytes} != static {static_bytes} + LOAD {load}"
        )


def check_blocks(plan: Plan, device: DevicePlan, size: dict[str, int], dynamic: list[str], first: dict[str, int],
                 last: dict[str, int]) -> None:
    """The device's arena blocks: each non-empty buffer in one block allocated through its steps (or adopted
    by a block of its own), no two blocks allocated at one step sharing offsets, and the peak the plan claims:
    static + the most the allocated blocks and the running op's scratch hold at one step."""
    steps = len(plan.schedule)
    mine = [b for b in plan.blocks if b.device == device.name]
    dynamic_set = set(dynamic)
    adopted: dict[str, int] = {}
    shared = []
    for i, b in enumerate(mine):
        if b.bytes <= 0 or b.offset < 0 or not 0 <= b.first <= b.last < steps:
            _fail(f"device {device.name}: block [{b.offset}, +{b.bytes}) in steps {b.first}..{b.last} is not a "
                  f"non-empty allocation within the {steps}-step schedule")
        if b.adopts is None:
            shared.append(b)
            continue
        s = b.adopts
        if s not in dynamic_set or s in adopted:
            _fail(f"device {device.name}: block adopts {s!r}, not a dynamic storage of the device adopted once")
        buf = plan.buffers[s]
        if (b.offset, b.bytes, b.first, b.last) != (buf.offset, size[s], first[s], last[s]):
            _fail(f"device {device.name}: block adopting {s!r} is not its buffer's bytes and steps")
        adopted[s] = i
    shared.sort(key=lambda b: b.offset)
    for s in dynamic:
        if not size[s] or s in adopted:
            continue
        buf = plan.buffers[s]
        if not any(b.offset <= buf.offset and buf.offset + size[s] <= b.offset + b.bytes
                   and b.first <= first[s] and last[s] <= b.last for b in shared):
            _fail(f"tensor {s!r}: its bytes [{buf.offset}, {buf.offset + size[s]}) in steps {first[s]}..{last[s]} "
                  f"lie in no block of {device.name}")
    for b, c in itertools.combinations(shared, 2):
        if b.first <= c.last and c.first <= b.last and b.offset < c.offset + c.bytes and c.offset < b.offset + b.bytes:
            _fail(f"device {device.name}: blocks [{b.offset}, +{b.bytes}) and [{c.offset}, +{c.bytes}) share "
                  f"offsets while both are allocated (steps {b.first}..{b.last} and {c.first}..{c.last})")
    held = [0] * (steps + 1)
    for b in mine:
        held[b.first] += b.bytes
        held[b.last + 1] -= b.bytes
    extra = [0] * steps
    for k, op in enumerate(plan.schedule):
        if plan.placement.get(op, device.name) == device.name:
            extra[k] = plan.scratch.get(op, 0)
    peak = device.static_bytes + max((h + e for h, e in zip(itertools.accumulate(held), extra)), default=0)
    if device.peak_bytes != peak:
        _fail(f"device {device.name}: peak_bytes {device.peak_bytes} != {peak}, static + the most its allocated "
              "blocks and an op's scratch hold at one step")


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

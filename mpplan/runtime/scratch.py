"""Scratch: the memory an op holds outside its device's arena in arena mode, and plans that count it.

In arena mode an op's fresh results go to their planned arena views through a real
``out=`` overload or an exact rewrite (``arena``).  An op with neither computes its
results into fresh storages first and copies them in: while it does, those storages
are memory next to the whole arena, as a CUDA allocator (and the virtual device's
meter) counts it.  How each step's results land, and so how many bytes it holds
outside, is known before anything runs, from the traced values (``landing``).

``with_scratch`` puts that into the plan: ``plan.scratch`` per op and each device's
``scratch_bytes``, the largest of its ops', added to its peak.  The arena is one
block allocated for the whole step, so at the op holding the most scratch the
device holds the full arena plus that scratch: ``peak = static + arena + scratch``,
whatever the order or the offsets.  The schedule and the assignment therefore cannot
trade scratch for arena, and the planner's passes need not see it; what lowers it is
an op landing in the arena (an ``out=`` overload or a rewrite), which moves its
result's bytes out of the scratch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.plan import Plan
from mpplan.runtime.arena import Rewrite, exact_rewrite
from mpplan.runtime.devices import DeviceMap, DevicesArg, map_devices
from mpplan.runtime.schedule import Schedule, Step, Target, compile_schedule, flatten

__all__ = ["Landing", "landing", "op_scratch", "plan_with_scratch", "with_scratch"]


@dataclass(frozen=True, slots=True)
class Landing:
    """How one step's fresh results reach planned memory on a device of one torch type.

    ``targets``: the results that go there (those the kernel makes on that device
    type).  ``use_out``: through the op's real ``out=`` overload; else ``rewrite``,
    an exact rewrite onto one; else computed and copied in, holding ``scratch``
    bytes outside the arena meanwhile.
    """

    targets: tuple[Target, ...]
    use_out: bool
    rewrite: Rewrite | None
    scratch: int


def landing(program: CapturedProgram, step: Step, device_type: str) -> Landing | None:
    """How ``step``'s results land when its device is of ``device_type``; ``None`` when none go to planned memory.

    A generated ``out=`` overload computes into a hidden temporary and copies it into
    ``out``: the same memory as computing and copying in, but hidden from the meter,
    so it counts as no overload.
    """
    targets = tuple(t for t in step.targets if t.device_type == device_type)
    if not targets:
        return None
    complete = len(targets) == len(step.targets)
    use_out = step.out is not None and not step.out.generated and complete
    rewrite = None if use_out or not complete or len(targets) != 1 else exact_rewrite(step.func, device_type)
    scratch = 0 if use_out or rewrite is not None else _result_bytes(program, step, targets)
    return Landing(targets, use_out, rewrite, scratch)


def _result_bytes(program: CapturedProgram, step: Step, targets: tuple[Target, ...]) -> int:
    """Bytes of the storages the traced kernel made for ``targets``: what computing outside the arena holds."""
    assert step.node is not None
    leaves = flatten(program.nodes[step.node].meta.get("val"))
    storages = {}
    for target in targets:
        storage = leaves[target.leaf].untyped_storage()
        storages[id(storage)] = int(storage.nbytes())
    return sum(storages.values())


def op_scratch(schedule: Schedule, device_map: DeviceMap) -> dict[str, int]:
    """Op name -> bytes it holds outside the arena when ``schedule`` runs on ``device_map`` (only ops holding some)."""
    scratch = {}
    for step in schedule.steps:
        if step.copy is not None:
            continue
        how = landing(schedule.program, step, device_map.torch_device(step.device).type)
        if how is not None and how.scratch:
            scratch[step.op] = how.scratch
    return scratch


def with_scratch(plan: Plan, scratch: Mapping[str, int]) -> Plan:
    """``plan`` holding ``scratch`` (op -> bytes outside the arena): per-device scratch and peaks follow.

    Pure: a new plan; any scratch ``plan`` had is replaced.  Each device's
    ``scratch_bytes`` is the largest scratch of an op placed on it (one op runs at a
    time) and its ``peak_bytes`` is ``static + arena + scratch``.

    >>> from mpplan.plan import DevicePlan
    >>> p = Plan("g", "h", (DevicePlan("gpu0", 100, 8, 16, 24, 24),), ("a", "b"), {"a": "gpu0", "b": "gpu0"}, {},
    ...          max_peak_bytes=24)
    >>> q = with_scratch(p, {"a": 4, "b": 6})
    >>> q.devices[0].scratch_bytes, q.devices[0].peak_bytes, q.max_peak_bytes
    (6, 30, 30)
    """
    single = plan.devices[0].name if len(plan.devices) == 1 else None
    largest = {d.name: 0 for d in plan.devices}
    kept = {}
    for op, nbytes in sorted(scratch.items()):
        if nbytes < 0:
            raise ValueError(f"with_scratch: op {op!r}: expected bytes >= 0, got {nbytes}")
        device = plan.placement.get(op, single)
        if device not in largest:
            raise ValueError(f"with_scratch: op {op!r} is not placed on a device of the plan")
        if nbytes:
            kept[op] = nbytes
            largest[device] = max(largest[device], nbytes)
    devices = tuple(
        dataclasses.replace(d, scratch_bytes=s, peak_bytes=d.static_bytes + d.arena_bytes + s)
        for d, s in ((d, largest[d.name]) for d in plan.devices)
    )
    return dataclasses.replace(plan, devices=devices, scratch=kept, max_peak_bytes=max(d.peak_bytes for d in devices))


def plan_with_scratch(program: CapturedProgram, plan: Plan, devices: DevicesArg = None) -> Plan:
    """``plan`` counting what arena mode holds outside the arena when it runs ``program`` on ``devices``.

    ``devices`` as for ``evaluate`` (see ``map_devices``): which ops compute outside
    the arena depends on the torch device type their kernels run on.
    """
    device_map = map_devices([d.name for d in plan.devices], devices)
    return with_scratch(plan, op_scratch(compile_schedule(program, plan), device_map))

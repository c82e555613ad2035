"""Scratch: the memory an op holds outside its device's arena in arena mode, and plans that count it.

In arena mode an op's fresh results go to their planned arena views through a real
``out=`` overload or an exact rewrite (``arena``).  An op with neither computes its
results into fresh storages first and copies them in: while it does, those storages
are memory next to the whole arena, as a CUDA allocator (and the virtual device's
meter) counts it.  How each step's results land, and so how many bytes it holds
outside, is known before anything runs, from the traced values (``landing``).

``with_scratch`` puts that into the plan: ``plan.scratch`` per op and each device's
``scratch_bytes``, the largest of its ops', added to its peak.  With a one-block
arena, allocated for the whole step, the device holds the full arena plus the
largest scratch: ``peak = static + arena + scratch``, whatever the order or offsets.

``plan_with_scratch`` (the default) cuts the arena into blocks instead (``blocks``,
``with_blocks``): each held only while its buffers live, and a copied-in result kept
as a block of its own where that lowers the peak (adopted: no copy, no scratch).
Its peak is static + the most the live blocks and the running op's scratch hold at
one step, which is what the run measures.  ``plan_as_run`` plans a captured program
that way: what ``mpplan plan``, ``mpplan run`` and the search (driver and actors) predict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass

from mpplan import sim
from mpplan.capture.torch_capture import CapturedProgram
from mpplan.config import Device
from mpplan.errors import InfeasibleError
from mpplan.liveness import live_ranges
from mpplan.passes.copies import Placed
from mpplan.plan import Block, Plan
from mpplan.planner import PlannerSettings, plan as plan_graph
from mpplan.runtime.arena import Rewrite, exact_rewrite
from mpplan.runtime.blocks import alone, buffer_lives, buffer_sizes, cut_blocks, own_blocks
from mpplan.runtime.devices import DeviceMap, DevicesArg, map_devices
from mpplan.runtime.schedule import Schedule, Step, Target, compile_schedule, flatten

__all__ = [
    "Landing",
    "held_by_run",
    "landing",
    "op_scratch",
    "plan_as_run",
    "plan_with_scratch",
    "with_blocks",
    "with_scratch",
]


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


def landing(program: CapturedProgram, step: Step, device_type: str,
            adopted: AbstractSet[str] = frozenset()) -> Landing | None:
    """How ``step``'s results land when its device is of ``device_type``; ``None`` when none go to planned memory.

    A generated ``out=`` overload computes into a hidden temporary and copies it into
    ``out``: the same memory as computing and copying in, but hidden from the meter,
    so it counts as no overload.  Results whose tensor is in ``adopted`` (a block of
    the plan that is the kernel's own allocation) are not targets: they stay where
    the kernel put them.
    """
    kept = tuple(t for t in step.targets if t.device_type == device_type)
    targets = tuple(t for t in kept if t.tensor not in adopted)
    if not targets:
        return None
    if len(targets) < len(kept):  # only a copied-in result is adopted: the rest of this op's are copied in too
        return Landing(targets, False, None, _result_bytes(program, step, targets))
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


def op_scratch(schedule: Schedule, device_map: DeviceMap, adopted: AbstractSet[str] = frozenset()) -> dict[str, int]:
    """Op name -> bytes it holds outside the arena when ``schedule`` runs on ``device_map`` (only ops holding some).

    ``adopted``: tensors whose kernel results are kept as their blocks (see ``landing``).
    """
    scratch = {}
    for step in schedule.steps:
        if step.copy is not None:
            continue
        how = landing(schedule.program, step, device_map.torch_device(step.device).type, adopted)
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


def plan_with_scratch(program: CapturedProgram, plan: Plan, devices: DevicesArg = None, *,
                      blocks: bool = True) -> Plan:
    """``plan`` as arena mode runs ``program`` on ``devices``: its blocks, and what it holds outside them.

    ``devices`` as for ``evaluate`` (see ``map_devices``): which ops compute outside
    the arena depends on the torch device type their kernels run on.  ``blocks``
    (the default, which measures least on every model of the peak benchmark) keeps
    every copied-in result the kernel allocates as a block of its own (adopted) and
    cuts the rest of each arena into blocks (``blocks.cut_blocks``); ``False`` keeps one block per device, the whole
    arena held all step.
    """
    device_map = map_devices([d.name for d in plan.devices], devices)
    schedule = compile_schedule(program, plan)
    if not blocks:
        return with_scratch(plan, op_scratch(schedule, device_map))
    sizes, lives = buffer_sizes(schedule.placed), buffer_lives(schedule.placed)
    candidates: set[str] = set()
    for step in schedule.steps:
        how = None if step.copy is not None else landing(program, step, device_map.torch_device(step.device).type)
        if how is not None and how.scratch:
            candidates.update(_adoptable(program, step, how.targets, sizes))
    # Adopting a buffer alone in its block only drops its scratch; adopting one that shares a block can
    # leave that block as long-lived as before while its own memory is held beside it; one block per
    # buffer holds what no-arena mode holds, in the most blocks.  The simulator decides (its peak is
    # what the run measures); on ties the fewest blocks win.
    safe = frozenset(candidates & alone(plan.buffers, sizes, lives))
    every = frozenset(candidates)
    choices = [with_blocks(plan, cut(plan.buffers, sizes, lives, adopted), op_scratch(schedule, device_map, adopted))
               for cut, adopted in ((cut_blocks, safe), (cut_blocks, every), (own_blocks, every))]
    return min(choices, key=lambda p: (p.max_peak_bytes, len(p.blocks)))


def plan_as_run(program: CapturedProgram, devices: Sequence[Device], settings: PlannerSettings,
                device_map: DevicesArg = None) -> Plan:
    """``program``'s graph planned over ``devices`` with ``settings``, as arena mode runs it on ``device_map``.

    The one way a torch model's point is planned (``mpplan plan``, ``mpplan run``, the search's driver and
    its actors), so all of them predict the same peak for it.  ``device_map`` as for ``plan_with_scratch``:
    it must match the device type ``program`` was traced for, since only results the traced kernels put on
    that type count as landing in the arena.  A remat budget nothing fits raises the remat pass's
    ``RematInfeasibleError`` with its best plan (``exc.plan``) likewise as run.
    """
    try:
        made = plan_graph(program.graph, devices, settings)
    except InfeasibleError as exc:
        from mpplan.passes.remat import RematInfeasibleError  # loaded by a plan that recomputes

        if isinstance(exc, RematInfeasibleError) and exc.plan is not None:
            exc.plan = plan_with_scratch(program, exc.plan, device_map)
        raise
    return plan_with_scratch(program, made, device_map)


def _adoptable(program: CapturedProgram, step: Step, targets: tuple[Target, ...],
               sizes: Mapping[str, int]) -> list[str]:
    """The copied-in results of ``step`` the kernel's own storage can be kept as: dynamic, each in a
    storage of its own of exactly the buffer's bytes, starting at its first element."""
    assert step.node is not None
    leaves = flatten(program.nodes[step.node].meta.get("val"))
    storages = [id(leaves[t.leaf].untyped_storage()) for t in targets]
    found = []
    for target, storage in zip(targets, storages):
        leaf = leaves[target.leaf]
        if target.static or storages.count(storage) > 1:
            continue
        if leaf.storage_offset() == 0 and int(leaf.untyped_storage().nbytes()) == sizes[target.tensor]:
            found.append(target.tensor)
    return found


def with_blocks(plan: Plan, blocks: tuple[Block, ...], scratch: Mapping[str, int]) -> Plan:
    """``plan`` with its arenas cut into ``blocks`` and holding ``scratch`` (op -> bytes).

    Pure.  Each device's peak is static + the most its allocated blocks and the
    running op's scratch hold at one step (``sim.held_peak``); ``scratch_bytes`` is
    its ops' largest scratch, as for ``with_scratch``.
    """
    counted = with_scratch(plan, scratch)
    step_of = {op: k for k, op in enumerate(plan.schedule)}
    devices = []
    for d in counted.devices:
        extra = [0] * len(plan.schedule)
        for op, nbytes in counted.scratch.items():
            if counted.placement.get(op, d.name) == d.name:
                extra[step_of[op]] = nbytes
        mine = [(b.first, b.last, b.bytes) for b in blocks if b.device == d.name]
        devices.append(dataclasses.replace(d, peak_bytes=d.static_bytes + sim.held_peak(mine, extra)))
    return dataclasses.replace(counted, devices=tuple(devices), blocks=blocks,
                               max_peak_bytes=max(d.peak_bytes for d in devices))


def held_by_run(plan: Plan, scratch: Mapping[str, int], workspaces: Mapping[str, int]) -> Plan:
    """``plan`` as a run in arena mode holds it: each op's ``scratch`` (op -> bytes of results copied in, as
    the executor lands them) and its kernels' ``workspaces`` (op -> bytes, ``workspace.WorkspaceProbe``)
    beside the blocks (or the whole arena) live at its step.

    Pure.  An op's scratch is the larger of the plan's own and ``scratch`` (a plan made without
    ``plan_with_scratch`` has none); its workspace comes on top, since the kernel holds both at once.
    """
    ops = set(plan.scratch) | set(scratch) | set(workspaces)
    held = {op: max(plan.scratch.get(op, 0), scratch.get(op, 0)) + workspaces.get(op, 0) for op in ops}
    return with_blocks(plan, plan.blocks, held) if plan.blocks else with_scratch(plan, held)


def held_without_arena(placed: Placed, plan: Plan, workspaces: Mapping[str, int],
                       allocation: Callable[[int], int] | None = None) -> dict[str, int]:
    """Device name -> the most a run without an arena holds at one step: static, every dynamic storage as its
    own allocation over its live steps, and the running op's kernel workspace (op -> bytes) beside them.

    Pure.  With no workspace this is each device's ``lower_bound_bytes`` (static + LOAD), which is what the
    storages alone hold; the CUDA allocator also counts the workspaces, and each storage as ``allocation``
    (bytes -> bytes counted; ``allocation.cuda_block_bytes``) rounds it, with ``plan``'s static likewise.
    """
    num_steps = len(placed.graph.ops)
    spans: dict[str, list[tuple[int, int, int]]] = {d.name: [] for d in plan.devices}
    for r in live_ranges(placed.graph, range(num_steps)).ranges:
        nbytes = r.nbytes if allocation is None else allocation(r.nbytes)
        spans[placed.storage_device[r.storage]].append((r.first, r.last, nbytes))
    extra: dict[str, list[int]] = {d.name: [0] * num_steps for d in plan.devices}
    for step, (op, device) in enumerate(zip(placed.graph.ops, placed.op_device)):
        extra[device][step] = workspaces.get(op.name, 0)
    return {d.name: d.static_bytes + sim.held_peak(spans[d.name], extra[d.name]) for d in plan.devices}

"""The independent verifier: re-derive everything a plan claims from the graph alone.

It deliberately shares no code with the planner (no ``Topology``, no pass, no
simulator): dependencies, in-place versions, aliases, copies, recomputes,
lifetimes, overlaps and peaks are recomputed here from tensor and op names, so a
bug in a pass cannot hide itself.  It imports only the IR, the plan record and the
config loader.  The first violation raises ``VerificationError`` with a message
naming the op, tensor, device or plan field.

What the plan is checked against (device names, capacities, alignment,
``parallel_safe``, ``grads``) comes from a ``Truth``: from the run config
(``truth_from_config``), or, when none is given, from the plan itself on trust
(``VerifyReport.trusted`` lists those fields).

>>> from mpplan.graph import Graph, Kind, Op, Tensor
>>> from mpplan.plan import Buffer, DevicePlan, Plan
>>> g = Graph("g", (Tensor("x", 8, Kind.INPUT), Tensor("y", 8)), (Op("f", "f", ("x",), ("y",)),), ("y",))
>>> p = Plan("g", g.content_hash, (DevicePlan("gpu0", 64, 8, 8, 16, 16),), ("f",), {"f": "gpu0"},
...          {"y": Buffer("gpu0", 0, 8)}, max_peak_bytes=16)
>>> verify(g, p).ops
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import filterfalse
from operator import attrgetter

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Tensor
from mpplan.graph_hash import graph_hash_like, hash_matches
from mpplan.plan import Copy, DevicePlan, Plan
from mpplan.verify.memory import check_buffers, check_no_overlap, check_peaks, check_scratch
from mpplan.verify.parallel import check_parallel_safe
from mpplan.verify.recompute import with_recomputes
from mpplan.verify.replay import Replay, replay
from mpplan.verify.truth import TRUSTED_FIELDS, Truth, check_agrees, truth_from_config, truth_from_plan

__all__ = ["TRUSTED_FIELDS", "Truth", "VerifyReport", "truth_from_config", "truth_from_plan", "verify"]

_ALWAYS_STATIC = (Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE)
_NAME, _NBYTES = attrgetter("name"), attrgetter("nbytes")


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What was checked, for the CLI's summary; ``trusted`` names the facts taken from the plan itself."""

    ops: int
    buffers: int
    devices: int
    copies: int
    trusted: tuple[str, ...] = ()


def memory_holds(plan: Plan, first: Sequence[int], last: Sequence[int], home: Sequence[int], size: Sequence[int],
                 static: Sequence[int], alignment: int, index: dict[str, int]) -> bool:
    """``arrays.memory_holds``, with numpy loaded when a plan is first verified rather than when the CLI starts."""
    from mpplan.verify import arrays

    return arrays.memory_holds(plan, first, last, home, size, static, alignment, index)


def verify(graph: Graph, plan: Plan, *, check_capacity: bool = True, truth: Truth | None = None) -> VerifyReport:
    """Check ``plan`` against ``graph`` (and ``truth``); raise ``VerificationError`` on the first violation.

    ``check_capacity=False`` checks correctness only, for plans known not to fit.
    Without ``truth`` the plan's own devices and settings are taken on trust.
    """
    if not hash_matches(plan.graph_hash, graph):  # an older plan carries the older version of the hash
        _fail(f"plan is for graph hash {plan.graph_hash}, the graph given has {graph_hash_like(plan.graph_hash, graph)}")
    if truth is None:
        truth = truth_from_plan(plan)
    check_agrees(plan, truth)
    graph = with_recomputes(graph, plan)
    tensors = dict(zip(map(_NAME, graph.tensors), graph.tensors))
    copies = _check_copies(plan, tensors)
    for c in copies.values():
        tensors[c.name] = Tensor(c.name, c.bytes, Kind.ACTIVATION)
    root = _roots(tensors)
    _check_schedule_names(graph, plan, copies)
    device_of = _check_placement(graph, plan, copies)
    check_scratch(plan, device_of)
    run = replay(graph, plan, root, copies, device_of, dependencies=truth.parallel_safe)
    names, index = run.names, run.index
    grads_dynamic = truth.grads == "dynamic"
    kinds = _by_kind(graph)
    last = list(run.last)
    end = len(plan.schedule) - 1
    held_to_end = set(graph.outputs) | {t.name for t in kinds[Kind.OUTPUT]}
    if grads_dynamic:  # eager's .grad: made by backward, held to the end of the step
        params = {t.name for t in kinds[Kind.PARAM]}  # copies are activations: none is a param
        held_to_end |= {t.name for t in kinds[Kind.GRAD] if t.grad_of in params}
    for name in held_to_end:
        s = index[root[name]]
        if last[s] >= 0:
            last[s] = end
    static = [index[s] for s in _static_storages(kinds, tensors, grads_dynamic)]
    size = list(map(_NBYTES, map(tensors.__getitem__, names)))
    position = {d.name: i for i, d in enumerate(plan.devices)}
    home = [-1 if h is None else position[h] for h in run.home]
    if plan.blocks or not memory_holds(plan, run.first, last, home, size, static, truth.alignment, index):
        _check_memory_by_name(plan, run, last, size, static, check_capacity=check_capacity, alignment=truth.alignment)
    elif check_capacity:
        for device in plan.devices:
            _check_capacity(device)
    if truth.parallel_safe:
        first = {names[s]: run.first[s] for s in run.order}
        dynamic = {names[s] for s in run.order} - {names[s] for s in static}
        check_parallel_safe(plan.buffers, run, dynamic, first)
    claimed = max((d.peak_bytes for d in plan.devices), default=0)
    if plan.max_peak_bytes != claimed:
        _fail(f"predicted.max_peak_bytes is {plan.max_peak_bytes}, the devices' peaks give {claimed}")
    moved = sum(c.bytes for c in copies.values())
    if plan.cross_device_bytes != moved:
        _fail(f"predicted.cross_device_bytes is {plan.cross_device_bytes}, the copies move {moved}")
    return VerifyReport(
        ops=len(plan.schedule),
        buffers=len(plan.buffers),
        devices=len(plan.devices),
        copies=len(copies),
        trusted=TRUSTED_FIELDS if truth.trusted else (),
    )


def _check_memory_by_name(plan: Plan, run: Replay, last: list[int], size: list[int], static: list[int], *,
                          check_capacity: bool, alignment: int) -> None:
    """The memory checks by name, in name order (``memory``'s): they word the first violation.

    ``last`` is ``run.last`` with the storages held to the end of the step extended; ``size``
    and ``static`` are by storage number, as in ``arrays.memory_holds``.
    """
    names = run.names
    first = {names[s]: run.first[s] for s in run.order}
    home = {names[s]: run.home[s] for s in run.order}
    size_of = {names[s]: size[s] for s in run.order}
    last_of = {names[s]: last[s] for s in run.order}
    static_names = {names[s] for s in static} & home.keys()
    named = sorted(home)  # every check below goes in name order, so the first violation is reported
    dynamic = dict.fromkeys(filterfalse(static_names.__contains__, named))  # a set, in name order
    check_buffers(plan, size_of, dynamic, home, alignment)  # type: ignore[arg-type]  # each in ``order`` has a home
    by_device: dict[str, tuple[list[str], list[str]]] = {d.name: ([], []) for d in plan.devices}
    for s in named:
        by_device[home[s]][s in dynamic].append(s)  # type: ignore[index]
    for device in plan.devices:
        mine_static, mine = by_device[device.name]
        check_no_overlap(plan.buffers, device.name, mine, first, last_of)
        check_peaks(plan, device, size_of, mine_static, mine, first, last_of)
        if check_capacity:
            _check_capacity(device)


def _check_capacity(device: DevicePlan) -> None:
    if device.peak_bytes > device.capacity_bytes:
        _fail(f"device {device.name}: peak {device.peak_bytes} exceeds capacity {device.capacity_bytes}")


def _fail(message: str) -> None:
    raise VerificationError(message)


def _roots(tensors: dict[str, Tensor]) -> dict[str, str]:
    """Root of every alias chain, memoised so that long chains cost linear time."""
    roots = {name: name for name, t in tensors.items() if t.alias_of is None}  # most tensors: their own root
    for name in filterfalse(roots.__contains__, tensors):  # lazily: a chain below resolves later names too
        chain, cur = [], name
        while cur not in roots and tensors[cur].alias_of is not None:
            if cur in chain:
                _fail(f"tensor {name!r}: alias cycle")
            chain.append(cur)
            cur = tensors[cur].alias_of  # type: ignore[assignment]
        top = roots.get(cur, cur)
        for c in (*chain, name):
            roots[c] = top
    return roots


def _by_kind(graph: Graph) -> dict[Kind, list[Tensor]]:
    """The graph's tensors of each kind, in tensor order: one pass over 200k tensors serves every
    question below about a few kinds (static ones, outputs, parameters and their gradients)."""
    kinds: dict[Kind, list[Tensor]] = {kind: [] for kind in Kind}
    for t in graph.tensors:
        kinds[t.kind].append(t)
    return kinds


def _static_storages(kinds: dict[Kind, list[Tensor]], tensors: dict[str, Tensor], grads_dynamic: bool) -> set[str]:
    """Roots resident for the whole step: inputs, params, optimizer state, and (``grads: static``) param grads."""
    static = {t.name for kind in _ALWAYS_STATIC for t in kinds[kind] if t.alias_of is None}
    if not grads_dynamic:
        static |= {t.name for t in kinds[Kind.GRAD] if t.alias_of is None and _is_param_grad(tensors, t)}
    return static


def _is_param_grad(tensors: dict[str, Tensor], tensor: Tensor) -> bool:
    return tensor.kind is Kind.GRAD and tensor.grad_of is not None and tensors[tensor.grad_of].kind is Kind.PARAM


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
    if len(set(plan.schedule)) == len(plan.schedule) == len(known) and known.issuperset(plan.schedule):
        return  # each known op once, and as many steps as ops: the common case in C; the loop names a fault
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
    ops = [o.name for o in graph.ops] + list(copies)
    if len(names) == 1 and set(plan.placement.values()) <= {names[0]}:
        return dict.fromkeys(ops, names[0])  # one device, nothing placed elsewhere (so no copy): no loop
    placement: dict[str, str] = {}
    for name in ops:
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

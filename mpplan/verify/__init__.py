"""The independent verifier: re-derive everything a plan claims from the graph alone.

It deliberately shares no code with the planner (no pass, no simulator):
dependencies, in-place versions, aliases, copies, recomputes, lifetimes, overlaps
and peaks are recomputed here from tensor and op names, so a bug in a pass cannot
hide itself.  The graph's ``Topology`` (the planner's view) is read only as a cache
of numbers, each proven equal to what the names give before it is used.  It imports only the IR, the plan record and the
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

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, filterfalse, repeat
from operator import attrgetter, is_, is_not

from mpplan.errors import MpplanError, VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.graph_hash import graph_hash_like, hash_matches
from mpplan.plan import Copy, DevicePlan, Plan
from mpplan.units import format_size
from mpplan.verify.fields import check_fields, check_unseen
from mpplan.verify.memory import check_buffers, check_no_overlap, check_peaks, check_scratch
from mpplan.verify.parallel import check_parallel_safe
from mpplan.verify.recompute import with_recomputes
from mpplan.verify.record import Numbering, Replay, numbering
from mpplan.verify.truth import TRUSTED_FIELDS, Truth, check_agrees, truth_from_config, truth_from_plan

__all__ = ["TRUSTED_FIELDS", "Truth", "VerifyReport", "truth_from_config", "truth_from_plan", "verify"]

_ALWAYS_STATIC = (Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE)
_NAME, _NBYTES = attrgetter("name"), attrgetter("nbytes")
_ALIAS_OF, _GRAD_OF = attrgetter("alias_of"), attrgetter("grad_of")
_BACKWARD_OF, _RECOMPUTE_OF = attrgetter("backward_of"), attrgetter("recompute_of")


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


def _replay(graph: Graph, plan: Plan, numbers: Numbering, copies: dict[str, Copy], device_of: dict[str, str], *,
            dependencies: bool) -> Replay:
    """``replay.replay``, loaded (with its sweep's numpy) when a plan is first verified, as ``memory_holds`` is."""
    from mpplan.verify.replay import replay

    return replay(graph, plan, numbers, copies, device_of, dependencies=dependencies)


def verify(graph: Graph, plan: Plan, *, check_capacity: bool = True, truth: Truth | None = None) -> VerifyReport:
    """Check ``plan`` against ``graph`` (and ``truth``); raise ``VerificationError`` on the first violation.

    ``check_capacity=False`` checks correctness only, for plans known not to fit.
    Without ``truth`` the plan's own devices and settings are taken on trust.
    A field of the graph or the plan of another type than its own is a violation too, named (``fields``).
    """
    check_unseen(graph, plan)  # the wrong types no check below would notice
    try:
        return _verify(graph, plan, check_capacity=check_capacity, truth=truth)
    except MpplanError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):  # a check met a value it cannot handle
        check_fields(graph, plan)  # names the field of another type than its own; none: a bug, raised as it is
        raise


def _verify(graph: Graph, plan: Plan, *, check_capacity: bool, truth: Truth | None) -> VerifyReport:
    """``verify``, on fields whose types ``check_unseen`` has checked (and the rest as found)."""
    if not hash_matches(plan.graph_hash, graph):  # an older plan carries the older version of the hash
        given = graph_hash_like(plan.graph_hash, graph)
        _fail(f"plan is for graph hash {plan.graph_hash}, the graph given has {given}")
    if truth is None:
        truth = truth_from_plan(plan)
    check_agrees(plan, truth)
    names, index = numbering(graph)
    kinds = _check_names(graph, names, index)  # once, on the graph given: the rewrite below adds only fresh names
    if plan.remat:  # the rewrite looks the graph's tensors and ops up by name: they must hold first
        _check_before_rewrite(graph, names, index)
        graph = with_recomputes(graph, plan)
        names, index = numbering(graph)
        assert len(index) == len(names), "the rewrite names each tensor it adds afresh"
        kinds = _by_kind(graph)
    copies = _check_copies(plan, graph.tensors, index)
    names += copies
    index.update(zip(copies, range(len(graph.tensors), len(names))))
    numbers = Numbering(names, index, _root_numbers(graph, copies, names, index))
    _check_schedule_names(graph, plan, copies)
    device_of = _check_placement(graph, plan, copies)
    check_scratch(plan, device_of)
    run = _replay(graph, plan, numbers, copies, device_of, dependencies=truth.parallel_safe)
    root_of = numbers.root_of
    grads_dynamic = truth.grads == "dynamic"
    last = list(run.last)
    end = len(plan.schedule) - 1
    held_to_end = set(graph.outputs) | set(map(_NAME, kinds[Kind.OUTPUT]))
    if grads_dynamic:  # eager's .grad: made by backward, held to the end of the step
        params = set(map(_NAME, kinds[Kind.PARAM]))  # copies are activations: none is a param
        grads = kinds[Kind.GRAD]  # below: those of params, by columns in C rather than a test per tensor in Python
        held_to_end.update(compress(map(_NAME, grads), map(params.__contains__, map(_GRAD_OF, grads))))
    for s in map(root_of.__getitem__, map(index.__getitem__, held_to_end)):
        if last[s] >= 0:
            last[s] = end
    static = list(map(index.__getitem__, _static_storages(kinds, graph.tensors, index, grads_dynamic)))
    size = [*map(_NBYTES, graph.tensors), *(c.bytes for c in copies.values())]  # by number: tensors, then copies
    position: dict[str | None, int] = {None: -1}  # None: untouched
    position.update((d.name, i) for i, d in enumerate(plan.devices))
    home = list(map(position.__getitem__, run.home))  # in C: no Python frame per storage
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
    """A peak over the capacity, in bytes and human sizes, and by how much: what a user resizes by."""
    if device.peak_bytes > device.capacity_bytes:
        over = device.peak_bytes - device.capacity_bytes
        _fail(f"device {device.name}: peak {device.peak_bytes} exceeds capacity {device.capacity_bytes} by {over} "
              f"bytes ({format_size(device.peak_bytes)} > {format_size(device.capacity_bytes)}, "
              f"{format_size(over)} over)")


def _fail(message: str) -> None:
    raise VerificationError(message)


def _root_numbers(graph: Graph, copies: dict[str, Copy], names: list[str], index: dict[str, int]) -> list[int]:
    """The number of each tensor's (then each copy's) storage, the root of its alias chain.

    Only views take a Python step, most tensors being their own root.  An alias cycle or an
    unknown base leave it to ``_roots``, which walks the chains by name and words the fault as
    always.  The names are distinct (``verify`` refuses a tensor name given twice before).
    """
    alias = list(map(_ALIAS_OF, graph.tensors))
    root = list(range(len(names)))
    done = bytearray(map(is_, alias, repeat(None)))  # resolved: a tensor that is no view
    for view in compress(range(len(alias)), map(is_not, alias, repeat(None))):
        chain, cur = [], view
        while not done[cur]:
            base = index.get(alias[cur])
            if base is None or base >= len(alias) or cur in chain:  # an unknown base (or a copy's name), a cycle
                return _roots_by_name(graph, copies, names, index)
            chain.append(cur)
            cur = base
        for c in chain:
            root[c], done[c] = root[cur], 1
    return root


def _roots_by_name(graph: Graph, copies: dict[str, Copy], names: list[str], index: dict[str, int]) -> list[int]:
    """``_root_numbers`` by name, where a fault needs ``_roots``'s walk."""
    tensors = dict(zip(map(_NAME, graph.tensors), graph.tensors))
    for c in copies.values():
        tensors[c.name] = Tensor(c.name, c.bytes, Kind.ACTIVATION)
    root = _roots(tensors)
    return list(map(index.__getitem__, map(root.__getitem__, names)))


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
            if cur not in tensors:  # an unvalidated graph
                _fail(f"tensor {chain[-1]!r}: a view of unknown tensor {cur!r}")
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


def _static_storages(kinds: dict[Kind, list[Tensor]], tensors: Sequence[Tensor], index: dict[str, int],
                     grads_dynamic: bool) -> set[str]:
    """Roots resident for the whole step: inputs, params, optimizer state, and (``grads: static``) param grads.

    ``index`` numbers ``tensors`` (the graph's) and then the copies, which are activations."""
    static = {t.name for kind in _ALWAYS_STATIC for t in kinds[kind] if t.alias_of is None}
    if not grads_dynamic:
        static |= {t.name for t in kinds[Kind.GRAD] if t.alias_of is None and _is_param_grad(tensors, index, t)}
    return static


def _is_param_grad(tensors: Sequence[Tensor], index: dict[str, int], tensor: Tensor) -> bool:
    if tensor.kind is not Kind.GRAD or tensor.grad_of is None:
        return False
    of = index[tensor.grad_of]
    return of < len(tensors) and tensors[of].kind is Kind.PARAM


def _check_copies(plan: Plan, tensors: Sequence[Tensor], index: dict[str, int]) -> dict[str, Copy]:
    """The plan's copies by name, each of a known tensor, between two known devices, of all its bytes
    (``index`` numbers ``tensors``, the graph's)."""
    copies: dict[str, Copy] = {}
    devices = {d.name for d in plan.devices}
    for c in plan.copies:
        if c.name in index or c.name in copies:
            _fail(f"copy {c.name!r}: name clashes with a tensor or another copy")
        if c.tensor not in index:
            _fail(f"copy {c.name!r}: copies unknown tensor {c.tensor!r}")
        if c.src not in devices or c.dst not in devices or c.src == c.dst:
            _fail(f"copy {c.name!r}: needs two different known devices, got {c.src!r} -> {c.dst!r}")
        nbytes = tensors[index[c.tensor]].nbytes
        if c.bytes < nbytes:
            _fail(f"copy {c.name!r}: moves {c.bytes} bytes of a {nbytes}-byte tensor")
        copies[c.name] = c
    return copies


def _check_before_rewrite(graph: Graph, names: list[str], index: dict[str, int]) -> None:
    """What ``with_recomputes`` needs of an unvalidated graph beyond ``_check_names`` (its tensor names given
    once, its outputs' and gradients' tensors its own), worded as the checks after it word it: op names given
    once, each op's and view's tensor a tensor of the graph, no alias cycle."""
    from mpplan.verify.replay import check_op_tensors  # loads numpy, as ``_replay`` does

    _check_op_names(graph)
    check_op_tensors(graph.ops, index)
    _roots(dict(zip(names, graph.tensors)))


def _check_names(graph: Graph, names: list[str], index: dict[str, int]) -> dict[Kind, list[Tensor]]:
    """Each tensor name is one tensor's, the graph's outputs and the tensors its tensors are gradients of are
    tensors of it, and the ops its ops link to are ops of it (an unvalidated graph may break each); the graph's
    tensors by kind."""
    if len(index) != len(names):
        _fail(f"graph: tensor {_repeated(names)!r} is given twice")
    _check_named_tensors(graph.outputs, graph.tensors, index)
    _check_op_links(graph.ops)
    return _by_kind(graph)


def _check_named_tensors(outputs: Sequence[str], tensors: Sequence[Tensor], index: dict[str, int]) -> None:
    """The graph's outputs and the tensors its tensors are gradients of are tensors of the graph (an unvalidated
    graph may name others; op inputs and outputs are proven where they are numbered, ``replay.op_numbers``)."""
    named = set(map(_GRAD_OF, tensors))
    named.discard(None)
    named.update(outputs)
    if index.keys() >= named:  # looks up each named tensor, in C
        return
    for name in outputs:
        if name not in index:
            _fail(f"graph: output {name!r} is an unknown tensor")
    for t in tensors:
        if t.grad_of is not None and t.grad_of not in index:
            _fail(f"tensor {t.name!r}: the gradient of unknown tensor {t.grad_of!r}")


def _check_op_links(ops: Sequence[Op]) -> None:
    """Each op's ``backward_of`` and ``recompute_of`` names an op of the graph (an unvalidated graph may name
    others; the executor looks both up)."""
    known = set(map(_NAME, ops))
    links = set(map(_BACKWARD_OF, ops)) | set(map(_RECOMPUTE_OF, ops))
    links.discard(None)
    if links <= known:  # the common case in C; the loop names the first culprit
        return
    for op in ops:
        for field, name in (("backward_of", op.backward_of), ("recompute_of", op.recompute_of)):
            if name is not None and name not in known:
                _fail(f"op {op.name!r}: {field} names unknown op {name!r}")


def _repeated(names: Sequence[str]) -> str:
    """The first of ``names`` that stands in it more than once (there is one)."""
    return next(name for name, count in Counter(names).items() if count > 1)


def _check_op_names(graph: Graph) -> set[str]:
    """The graph's op names, each one op's (an unvalidated graph may repeat one)."""
    known = set(map(_NAME, graph.ops))
    if len(known) != len(graph.ops):
        _fail(f"graph: op {_repeated(list(map(_NAME, graph.ops)))!r} is given twice")
    return known


def _check_schedule_names(graph: Graph, plan: Plan, copies: dict[str, Copy]) -> None:
    known = _check_op_names(graph) | set(copies)
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
    ops = [*map(_NAME, graph.ops), *copies]
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

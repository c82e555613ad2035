"""Run a plan's schedule symbolically: who touches which storage, where, and when.

The plan's copies are replayed as ops: a copy reads its tensor on ``src`` and
writes a new storage named like the copy on ``dst``; from then on, ops on ``dst``
read the copy instead of the tensor.  A view made from a copy is a view of the
copy: it lives where the copy does, at the version copied.

Every read must see the version the graph's own order gives it (so in-place
writes keep their place among readers).  One pass over the schedule, with
constant work per tensor reference, so verification grows linearly with the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from operator import attrgetter

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Op
from mpplan.plan import Copy, Plan
from mpplan.verify import sweep as columns
from mpplan.verify.record import Numbering, Replay, is_numbering

_NAME = attrgetter("name")


def replay(
    graph: Graph,
    plan: Plan,
    numbers: Numbering,
    copies: dict[str, Copy],
    device_of: dict[str, str],
    *,
    dependencies: bool = False,
) -> Replay:
    """Replay ``plan.schedule``; raise ``VerificationError`` on the first read of a missing or stale value.

    The sweep indexes lists by tensor and copy numbers (``numbers``, see ``record.numbering``) rather
    than hashing names per reference; names come back only for messages.
    """
    names, index, root_of = numbers.names, numbers.index, numbers.root_of
    op_index, inputs, outputs = op_numbers(graph, names, index)
    if not copies and not dependencies and len(op_index) == len(inputs):  # numpy's columns answer for most
        known = [d.name for d in plan.devices]  # plans; the loop below words faults (and takes op names given twice)
        position = {d: i for i, d in enumerate(known)}
        fast = columns.sweep(names, index, inputs, outputs, list(map(op_index.__getitem__, plan.schedule)), root_of,
                             list(map(position.__getitem__, map(device_of.__getitem__, plan.schedule))), known)
        if fast is not None:
            return fast
    io = dict(zip(map(_NAME, graph.ops), zip(inputs, outputs)))
    alias_of = [index[t.alias_of] if t.alias_of in index else -1 for t in graph.tensors]
    written = bytearray(len(names))  # storages updated in place somewhere
    exists = bytearray(b"\x01") * len(names)
    for ins, outs in io.values():
        for t in outs:
            if t in ins:
                written[root_of[t]] = 1
            else:
                exists[t] = 0
    for name in copies:
        exists[index[name]] = 0
    expected = _expected_versions(io, root_of, written)
    version = [0] * len(names)
    arrived: dict[tuple[int, str], tuple[int, int]] = {}  # (tensor, device) -> (copy, version copied)
    of_copy: dict[int, tuple[int, int]] = {}  # view made from a copy -> (copy, version copied)
    is_copy = bytearray(len(names))
    for name in copies:
        is_copy[index[name]] = 1
    first = [-1] * len(names)
    last = [-1] * len(names)
    home: list[str | None] = [None] * len(names)
    order: list[int] = []  # storages in the order first touched: the result's dicts keep it
    deps = _Dependencies() if dependencies else None

    def touch(storage: int, step: int, device: str) -> None:
        where = home[storage]
        if where is None:
            home[storage], first[storage] = device, step
            order.append(storage)
        elif where != device:
            _fail(
                f"tensor {names[storage]!r} is used on devices {' and '.join(sorted((where, device)))} without a copy"
            )
        last[storage] = step

    for step, name in enumerate(plan.schedule):
        device = device_of[name]
        step_deps: dict[int, None] = {}
        copy = copies.get(name)
        if copy is not None:
            t = index[copy.tensor]
            if not exists[t]:
                _fail(f"schedule step {step}: copy {name!r} reads tensor {copy.tensor!r} before it is produced")
            source = of_copy[t][0] if t in of_copy else root_of[t]
            me = index[name]
            touch(source, step, copy.src)
            touch(me, step, device)
            seen = of_copy[t][1] if t in of_copy else version[root_of[t]]
            arrived[(t, copy.dst)] = (me, seen)
            exists[me] = 1
            if deps is not None:
                deps.read(names[source], copy.tensor, step, step_deps)
                deps.create(name, name, step)
                deps.users(step, names[source], name)
                deps.preds.append(list(step_deps))
            continue
        ins, outs = io[name]
        read_copy: dict[int, tuple[int, int]] = {}  # input -> (copy read in its place, version)
        touched: list[str] = []
        for t in ins:
            if not exists[t]:
                _fail(f"schedule step {step}: op {name!r} reads tensor {names[t]!r} before it is produced")
            storage = root_of[t]
            if written[storage]:  # ``expected`` has entries for these storages only
                seen, want = version[storage], expected.get((name, t), 0)
            else:
                seen = want = 0
            if of_copy and t in of_copy:
                storage, seen = of_copy[t]
            elif arrived and (t, device) in arrived and t not in outs:
                storage, seen = arrived[(t, device)]
            if seen != want:
                what = f"its copy {names[storage]!r}" if is_copy[storage] else f"tensor {names[t]!r}"
                _fail(
                    f"schedule step {step}: op {name!r} reads {what} at version {seen}, the graph's order has it "
                    f"read version {want} (an in-place write moved)"
                )
            where = home[storage]
            if where == device:  # the common cases, without a call
                last[storage] = step
            elif where is None:
                home[storage], first[storage], last[storage] = device, step, step
                order.append(storage)
            else:
                touch(storage, step, device)
            if is_copy[storage]:
                read_copy[t] = (storage, seen)
            if deps is not None:
                touched.append(names[storage])
                deps.read(names[storage], names[t], step, step_deps)
        for t in outs:
            if t in ins:
                if of_copy and t in of_copy:
                    _fail(
                        f"schedule step {step}: op {name!r} writes {names[t]!r}, a view of copy "
                        f"{names[of_copy[t][0]]!r}, in place"
                    )
                storage = root_of[t]
                version[storage] += 1
                if deps is not None:
                    deps.write(names[storage], step, step_deps)
            else:
                if exists[t]:  # the fast sweep leaves this to the walk, which words it
                    _fail(f"schedule step {step}: op {name!r} makes tensor {names[t]!r}, which another op made")
                exists[t] = 1
                if read_copy and alias_of[t] in read_copy:
                    of_copy[t] = read_copy[alias_of[t]]
                storage = of_copy[t][0] if of_copy and t in of_copy else root_of[t]
                if deps is not None:
                    deps.create(names[storage] if storage == t else None, names[t], step)
            where = home[storage]
            if where == device:
                last[storage] = step
            elif where is None:
                home[storage], first[storage], last[storage] = device, step, step
                order.append(storage)
            else:
                touch(storage, step, device)
            if deps is not None:
                touched.append(names[storage])
        if deps is not None:
            deps.users(step, *touched)
            deps.preds.append(list(step_deps))
    empty: _Dependencies = deps or _Dependencies()
    return Replay(names, index, order, first, last, home, empty.used, empty.preds)


def op_numbers(graph: Graph, names: list[str], index: dict[str, int]) -> tuple[
        Mapping[str, int], Sequence[tuple[int, ...]], Sequence[tuple[int, ...]]]:
    """Each op's number (its place in the graph's order), and by op number its inputs and outputs by tensor
    number (``record.numbering``'s ``names`` and ``index``), as the op lists them (a name listed twice stays twice).

    A validated graph has them already (``graph.topology``, the planner's view of the graph):
    they are used only once proven to list, op by op, exactly the names the ops list (which fails
    where an op lists a tensor twice and the topology once), at about half the cost of building them.
    """
    topology = vars(graph).get("topology")
    ops = graph.ops
    if (
        topology is not None
        and is_numbering(topology.op_index, list(map(attrgetter("name"), ops)))
        and _lists_the_same(topology.op_inputs, map(attrgetter("inputs"), ops), names)
        and _lists_the_same(topology.op_outputs, map(attrgetter("outputs"), ops), names)
    ):
        return topology.op_index, topology.op_inputs, topology.op_outputs
    number = index.__getitem__
    try:
        return ({o.name: k for k, o in enumerate(ops)}, [tuple(map(number, o.inputs)) for o in ops],
                [tuple(map(number, o.outputs)) for o in ops])
    except KeyError:  # an unvalidated graph: name the op and the tensor
        check_op_tensors(ops, index)
        raise


def check_op_tensors(ops: Sequence[Op], index: Mapping[str, int]) -> None:
    """Each op's inputs and outputs are tensors ``index`` numbers (an unvalidated graph may name others):
    the first that is not, named with its op."""
    for o in ops:
        for what, listed in (("reads", o.inputs), ("writes", o.outputs)):
            for t in listed:
                if t not in index:
                    _fail(f"op {o.name!r}: {what} unknown tensor {t!r}")


def _lists_the_same(numbered: Sequence[tuple[int, ...]], listed: Iterable[tuple[str, ...]], names: list[str]) -> bool:
    """Whether ``numbered`` (tensor numbers, per op) names, op by op, exactly what ``listed`` does."""
    listed = list(listed)
    if list(map(len, numbered)) != list(map(len, listed)):
        return False
    flat = list(chain.from_iterable(numbered))
    if flat and (min(flat) < 0 or max(flat) >= len(names)):  # a negative number would name a tensor from the end
        return False
    return list(map(names.__getitem__, flat)) == list(chain.from_iterable(listed))


def _expected_versions(
    io: dict[str, tuple[tuple[int, ...], tuple[int, ...]]], root_of: list[int], written: bytearray
) -> dict[tuple[str, int], int]:
    """(op, input) -> the version of the input's storage that op reads in the graph's own order (``io``'s).

    Only storages in ``written`` (updated in place somewhere) get entries: the others are
    always read at version 0.
    """
    expected: dict[tuple[str, int], int] = {}
    version = [0] * len(root_of)
    for name, (ins, outs) in io.items():
        for t in ins:
            if written[root_of[t]]:
                expected[(name, t)] = version[root_of[t]]
        for t in outs:
            if t in ins:
                version[root_of[t]] += 1
    return expected


class _Dependencies:
    """The executed DAG, built during the replay: a read waits for the tensor's maker and the
    storage's last writer; an in-place write also waits for the readers of the previous version."""

    def __init__(self) -> None:
        self.made: dict[str, int] = {}  # tensor or copy -> step that made it
        self.writer: dict[str, int] = {}  # storage -> step that wrote its current version
        self.readers: dict[str, list[int]] = {}  # storage -> steps that read its current version
        self.used: dict[str, list[int]] = {}
        self.preds: list[list[int]] = []

    def read(self, storage: str, tensor: str, step: int, into: dict[int, None]) -> None:
        for p in (self.made.get(tensor), self.writer.get(storage)):
            if p is not None and p != step:
                into[p] = None
        self.readers.setdefault(storage, []).append(step)

    def write(self, storage: str, step: int, into: dict[int, None]) -> None:
        for r in self.readers.get(storage, ()):
            if r != step:
                into[r] = None
        self.readers[storage] = []
        self.writer[storage] = step

    def create(self, storage: str | None, tensor: str, step: int) -> None:
        self.made[tensor] = step
        if storage is not None:
            self.writer[storage] = step

    def users(self, step: int, *storages: str) -> None:
        for s in dict.fromkeys(storages):
            self.used.setdefault(s, []).append(step)


def _fail(message: str) -> None:
    raise VerificationError(message)

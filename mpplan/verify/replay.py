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

from dataclasses import dataclass

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Op
from mpplan.plan import Copy, Plan


@dataclass(frozen=True, slots=True)
class Replay:
    """Per storage (root tensor or copy name): its first and last step, and its one device.

    With ``dependencies``: ``users[s]`` are the steps that touch ``s`` on its device,
    and ``preds[i]`` the steps that step ``i`` must wait for in the executed DAG (data,
    copies, and the in-place version order), for the parallel-safety check.
    """

    first: dict[str, int]
    last: dict[str, int]
    home: dict[str, str]
    users: dict[str, list[int]]
    preds: list[list[int]]


def replay(
    graph: Graph,
    plan: Plan,
    root: dict[str, str],
    copies: dict[str, Copy],
    device_of: dict[str, str],
    *,
    dependencies: bool = False,
) -> Replay:
    """Replay ``plan.schedule``; raise ``VerificationError`` on the first read of a missing or stale value."""
    ops = {o.name: o for o in graph.ops}
    alias_of = {t.name: t.alias_of for t in graph.tensors}
    written = {root[t] for o in graph.ops for t in o.outputs if t in o.inputs}
    expected = _expected_versions(graph, root, written)
    produced = {t for o in graph.ops for t in o.outputs if t not in o.inputs}
    exists = {name for name in root if name not in produced and name not in copies}
    version: dict[str, int] = {}
    arrived: dict[tuple[str, str], tuple[str, int]] = {}  # (tensor, device) -> (copy name, version copied)
    of_copy: dict[str, tuple[str, int]] = {}  # view made from a copy -> (copy name, version copied)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    home: dict[str, str] = {}
    deps = _Dependencies() if dependencies else None

    def touch(storage: str, step: int, device: str) -> None:
        where = home.get(storage)
        if where is None:
            home[storage], first[storage] = device, step
        elif where != device:
            _fail(f"tensor {storage!r} is used on devices {' and '.join(sorted((where, device)))} without a copy")
        last[storage] = step

    for step, name in enumerate(plan.schedule):
        device = device_of[name]
        step_deps: dict[int, None] = {}
        copy = copies.get(name)
        if copy is not None:
            if copy.tensor not in exists:
                _fail(f"schedule step {step}: copy {name!r} reads tensor {copy.tensor!r} before it is produced")
            source = of_copy[copy.tensor][0] if copy.tensor in of_copy else root[copy.tensor]
            touch(source, step, copy.src)
            touch(name, step, device)
            seen = of_copy[copy.tensor][1] if copy.tensor in of_copy else version.get(root[copy.tensor], 0)
            arrived[(copy.tensor, copy.dst)] = (name, seen)
            exists.add(name)
            if deps is not None:
                deps.read(source, copy.tensor, step, step_deps)
                deps.create(name, name, step)
                deps.users(step, source, name)
                deps.preds.append(list(step_deps))
            continue
        op = ops[name]
        read_copy: dict[str, tuple[str, int]] = {}  # input -> (copy read in its place, version)
        touched: list[str] = []
        for t in op.inputs:
            if t not in exists:
                _fail(f"schedule step {step}: op {name!r} reads tensor {t!r} before it is produced")
            storage = root[t]
            if storage in written:  # ``expected`` has entries for these storages only
                seen, want = version.get(storage, 0), expected.get((name, t), 0)
            else:
                seen = want = 0
            if t in of_copy:
                storage, seen = of_copy[t]
            elif arrived and (t, device) in arrived and t not in op.outputs:
                storage, seen = arrived[(t, device)]
            if seen != want:
                what = f"its copy {storage!r}" if storage in copies else f"tensor {t!r}"
                _fail(
                    f"schedule step {step}: op {name!r} reads {what} at version {seen}, the graph's order has it "
                    f"read version {want} (an in-place write moved)"
                )
            where = home.get(storage)
            if where == device:  # the common cases, without a call
                last[storage] = step
            elif where is None:
                home[storage], first[storage], last[storage] = device, step, step
            else:
                touch(storage, step, device)
            if copies and storage in copies:
                read_copy[t] = (storage, seen)
            if deps is not None:
                touched.append(storage)
                deps.read(storage, t, step, step_deps)
        for t in op.outputs:
            if t in op.inputs:
                if t in of_copy:
                    _fail(f"schedule step {step}: op {name!r} writes {t!r}, a view of copy {of_copy[t][0]!r}, in place")
                version[root[t]] = version.get(root[t], 0) + 1
                storage = root[t]
                if deps is not None:
                    deps.write(storage, step, step_deps)
            else:
                exists.add(t)
                base = alias_of[t]
                if base in read_copy:
                    of_copy[t] = read_copy[base]
                storage = of_copy[t][0] if t in of_copy else root[t]
                if deps is not None:
                    deps.create(storage if storage == t else None, t, step)
            where = home.get(storage)
            if where == device:
                last[storage] = step
            elif where is None:
                home[storage], first[storage], last[storage] = device, step, step
            else:
                touch(storage, step, device)
            if deps is not None:
                touched.append(storage)
        if deps is not None:
            deps.users(step, *touched)
            deps.preds.append(list(step_deps))
    empty: _Dependencies = deps or _Dependencies()
    return Replay(first, last, home, empty.used, empty.preds)


def _expected_versions(graph: Graph, root: dict[str, str], written: set[str]) -> dict[tuple[str, str], int]:
    """(op, input) -> the version of the input's storage that op reads in the graph's own order.

    Only storages in ``written`` (updated in place somewhere) get entries: the others are
    always read at version 0.
    """
    expected: dict[tuple[str, str], int] = {}
    version: dict[str, int] = {}
    op: Op
    for op in graph.ops:
        for t in op.inputs:
            if root[t] in written:
                expected[(op.name, t)] = version.get(root[t], 0)
        for t in op.outputs:
            if t in op.inputs:
                version[root[t]] = version.get(root[t], 0) + 1
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

"""Cross-device copy injection: make every read local.

Each storage lives on one *home* device: the device of its producer, or, for
tensors that exist before the step (params, inputs, optimizer state), of the op
that updates it in place, else of its first user.  An op that reads a tensor
whose home is elsewhere reads a copy instead: one copy op per (tensor,
destination) named ``<tensor>@<device>``, run on the destination right before
its first consumer there.  The copy's output is a new dynamic tensor on the
destination; the source stays live until the copy has run (it is the copy's
input).  A pure view op runs on its base's home, whatever the placement says,
so readers elsewhere copy the view, not the whole base; except when the view
is read on one other device only, where its input is copied anyway: it then
runs there, on that copy, and its output is a view of the copy (a transpose of
a gradient copied for one matmul is not copied a second time).
A tensor read on a device again after it changed in place is copied again
(``<tensor>@<device>~v<version>``).  ``legalize`` makes any placement acceptable.  A parameter read on several devices
(tied embeddings) is copied once per step to each extra device.

The result is a new graph whose op list *is* the planned order (copies
included), plus the device of every op and storage of that graph.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace
from typing import Sequence

from mpplan.errors import GraphError
from mpplan.graph import Graph, Kind, Op, Tensor, is_pure_view, reordered
from mpplan.plan import Copy
from mpplan.units import dtype_bytes


@dataclass(frozen=True, slots=True)
class Placed:
    """A graph with copies inserted, listed in execution order, and where everything lives.

    ``op_device[k]`` is the device of op ``k`` of ``graph``; ``storage_device[s]``
    the home of storage ``s`` (a tensor id of ``graph``), for every storage.
    """

    graph: Graph
    op_device: tuple[str, ...]
    storage_device: tuple[str, ...]
    copies: tuple[Copy, ...]

    @property
    def cross_device_bytes(self) -> int:
        return sum(c.bytes for c in self.copies)


@dataclass(frozen=True, slots=True)
class Listing:
    """What runs where and when: step ``i`` runs op ``order[i]`` of ``graph`` on ``op_device[i]``.

    What the planner needs of a ``Placed`` graph (``storage_device`` and ``copies`` as
    there), without always making one: on one device there is no copy, so ``graph`` run in
    ``order`` is what ``inject_copies`` would list, and relisting 100k ops only to mark
    their device costs a second (``listing``).
    """

    graph: Graph
    order: Sequence[int]
    op_device: tuple[str, ...]
    storage_device: tuple[str, ...]
    copies: tuple[Copy, ...]

    @property
    def cross_device_bytes(self) -> int:
        return sum(c.bytes for c in self.copies)


def listing(graph: Graph, order: Sequence[int], op_device: Sequence[str], *, relist: bool) -> Listing:
    """The copies ``order`` needs under ``op_device`` (one device name per op id), as a ``Listing``.

    On one device, unless ``relist`` asks for the graph listed in ``order`` (a pass that
    reads the op DAG by listing position, as ``parallel_safe`` assignment does), the graph
    stays as it is; otherwise it is ``inject_copies``'s graph, run in its own listing.
    """
    if not relist and len(set(op_device)) == 1:
        device = op_device[0]
        return Listing(graph, tuple(order), (device,) * len(order), (device,) * len(graph.tensors), ())
    placed = inject_copies(graph, order, op_device)
    steps = range(len(placed.graph.ops))
    return Listing(placed.graph, steps, placed.op_device, placed.storage_device, placed.copies)


def inject_copies(graph: Graph, order: Sequence[int], op_device: Sequence[str]) -> Placed:
    """Insert the copies ``order`` needs under ``op_device`` (one device name per op id)."""
    if len(set(op_device)) == 1:
        return _on_one_device(graph, order, op_device[0])
    return _with_copies(graph, order, op_device)


def _on_one_device(graph: Graph, order: Sequence[int], device: str) -> Placed:
    """Everything on ``device``: every storage's home, so no copy and no relocated view; the
    graph is only listed in ``order``, each op marked with the device (what ``_with_copies``
    returns then, without its per-op bookkeeping or a rebuilt topology)."""
    ops = [graph.ops[k] for k in order]
    marked = [
        op if op.device == device else Op(op.name, op.type, op.inputs, op.outputs, op.cost, device, op.backward_of,
                                          op.module, op.stage, op.recompute_of)
        for op in ops
    ]
    return Placed(reordered(graph, order, marked), (device,) * len(order), (device,) * len(graph.tensors), ())


def _with_copies(graph: Graph, order: Sequence[int], op_device: Sequence[str]) -> Placed:
    topo = graph.topology
    home = _home_devices(graph, order, op_device)
    relocated = _relocated_views(graph, order, op_device, home)
    local_on: dict[int, str] = {}  # outputs of relocated views -> the device whose copy they view
    names = {t.name for t in graph.tensors}
    copy_of: dict[tuple[int, str], str] = {}  # (tensor id, device) -> copy tensor name
    copied_version: dict[tuple[int, str], int] = {}
    version = [0] * len(graph.tensors)
    new_tensors = list(graph.tensors)
    new_ops: list[Op] = []
    new_devices: list[str] = []
    copies: list[Copy] = []
    for k in order:
        op = graph.ops[k]
        device = relocated.get(k) or _device_of(graph, k, op_device, home)
        renamed: dict[str, str] = {}
        for t in topo.op_inputs[k]:
            s = topo.storage_of[t]
            if local_on.get(t, home[s]) == device:
                continue
            tensor = graph.tensors[t]
            if tensor.name in op.outputs:
                raise GraphError(
                    f"op {op.name!r} on {device} writes tensor {tensor.name!r} in place, but it lives on "
                    f"{home[s]}: in-place ops across devices are not allowed; place them together"
                )
            key = (t, device)
            if key not in copy_of or copied_version[key] != version[s]:
                # a first read there, or the tensor changed in place since its last copy
                suffix = "" if key not in copy_of else f"~v{version[s]}"
                name = _fresh(f"{tensor.name}@{device}{suffix}", names)
                nbytes = copy_bytes(tensor, topo.nbytes[s])
                new_tensors.append(Tensor(name, nbytes, Kind.ACTIVATION, tensor.shape, tensor.dtype))
                new_ops.append(Op(name, "copy", (tensor.name,), (name,), cost=0.0, device=device, module=op.module))
                new_devices.append(device)
                copies.append(Copy(name=name, tensor=tensor.name, src=home[s], dst=device, bytes=nbytes))
                copy_of[key] = name
                copied_version[key] = version[s]
            renamed[tensor.name] = copy_of[key]
        new_ops.append(_renamed(op, renamed, device))
        new_devices.append(device)
        if k in relocated:
            for t in topo.op_outputs[k]:
                base = new_tensors[t].alias_of
                new_tensors[t] = replace(new_tensors[t], alias_of=None if base is None else renamed.get(base, base))
                local_on[t] = device
        for name in op.in_place:
            version[topo.storage_of[topo.tensor_index[name]]] += 1
    placed = Graph(graph.name, tuple(new_tensors), tuple(new_ops), graph.outputs).validate()
    new_topo = placed.topology
    storage_device = [""] * len(new_tensors)
    for t in range(len(graph.tensors)):
        storage_device[t] = home[topo.storage_of[t]]
    for c in copies:
        storage_device[new_topo.tensor_index[c.name]] = c.dst
    return Placed(placed, tuple(new_devices), tuple(storage_device), tuple(copies))


def copy_bytes(tensor: Tensor, storage_bytes: int) -> int:
    """Bytes a copy of ``tensor`` moves and holds: its own elements when it is a view of
    known shape and dtype (a slice of a fused QKV output copies its third, not the whole),
    else its storage's (``storage_bytes``)."""
    if tensor.alias_of is None or tensor.nbytes:
        return tensor.nbytes
    if tensor.shape is None or tensor.dtype is None:
        return storage_bytes
    try:
        return min(storage_bytes, math.prod(tensor.shape) * dtype_bytes(tensor.dtype))
    except ValueError:  # a dtype the graph file names but mpplan does not know
        return storage_bytes


def legalize(graph: Graph, order: Sequence[int], op_device: Sequence[str]) -> tuple[str, ...]:
    """Move every in-place op onto the home of the storage it writes, and every pure
    view op onto its base's home, so ``inject_copies`` accepts the placement.

    Placement strategies reason about modules and activations; ATen's in-place ops
    (``relu_``, optimizer updates) must follow their tensor, wherever a partition cut.
    """
    if len(set(op_device)) == 1:
        return tuple(op_device)  # one device: every op already runs where its tensors live
    topo = graph.topology
    devices = list(op_device)
    for _ in range(len(graph.ops) + 1):
        home = _home_devices(graph, order, devices)
        moved = False
        for k in order:
            target = _device_of(graph, k, devices, home)
            for name in graph.ops[k].in_place:
                target = home[topo.storage_of[topo.tensor_index[name]]]
            if target != devices[k]:
                devices[k], moved = target, True
        if not moved:
            return tuple(devices)
    raise AssertionError("legalize did not converge")


def _home_devices(graph: Graph, order: Sequence[int], op_device: Sequence[str]) -> list[str]:
    """Home device per storage: producer, else in-place updater, else first user in ``order``
    that is not a pure view (a view runs where its base lives, so it cannot decide that),
    else its first user."""
    topo = graph.topology
    home = [""] * len(graph.tensors)
    for s in topo.storages:
        if topo.producer[s] >= 0:
            home[s] = op_device[topo.producer[s]]
    for k in order:
        for name in graph.ops[k].in_place:
            s = topo.storage_of[topo.tensor_index[name]]
            if topo.producer[s] < 0 and not home[s]:
                home[s] = op_device[k]
    for views_too in (False, True):
        for k in order:
            if views_too or not is_pure_view(graph, k):
                for s in topo.op_storages[k]:
                    if not home[s]:
                        home[s] = op_device[k]
    fallback = op_device[order[0]] if len(order) else ""
    return [h or fallback for h in home]


def _relocated_views(
    graph: Graph, order: Sequence[int], op_device: Sequence[str], home: Sequence[str]
) -> dict[int, str]:
    """Pure view ops to run on their readers' device, over the copy of their input there.

    A view op qualifies when its outputs are not graph outputs and are read only by
    ops that are not views, all on one device other than the base's home, none
    writing them in place; when its input is copied to that device anyway (an op
    there reads it); and when nothing writes the base in place while the view is in
    use (the view of the copy would miss the write; a weight updated by the optimizer
    after the backward pass is fine).
    """
    topo = graph.topology
    position = {k: step for step, k in enumerate(order)}
    writes: dict[int, list[int]] = {}  # storage -> steps writing it in place, ascending
    for k in order:
        for name in graph.ops[k].in_place:
            writes.setdefault(topo.storage_of[topo.tensor_index[name]], []).append(position[k])
    views = {k for k in order if is_pure_view(graph, k)}
    readers_on: dict[int, set[str]] = {}  # tensor -> devices of the non-view ops reading it
    for k in order:
        if k not in views:
            for t in topo.op_inputs[k]:
                readers_on.setdefault(t, set()).add(op_device[k])
    outputs = set(graph.output_names)
    relocated: dict[int, str] = {}
    for k in order:
        if k not in views:
            continue
        source = topo.op_inputs[k][0]
        s = topo.storage_of[source]
        readers = [c for t in topo.op_outputs[k] for c in topo.consumers[t] if c != k]
        devices = {op_device[c] for c in readers}
        if not readers or len(devices) != 1 or any(c in views for c in readers):
            continue
        if any(graph.tensors[t].name in outputs for t in topo.op_outputs[k]):
            continue
        (device,) = devices
        written = any(graph.tensors[t].name in graph.ops[c].in_place for t in topo.op_outputs[k] for c in readers)
        arrives = device in readers_on.get(source, ())
        in_use = (position[k], max(position[c] for c in readers))
        if device != home[s] and arrives and not written and not _written_within(writes.get(s, []), *in_use):
            relocated[k] = device
    return relocated


def _written_within(steps: Sequence[int], first: int, last: int) -> bool:
    """Whether any of the ascending ``steps`` lies in ``first..last``."""
    i = bisect.bisect_left(steps, first)
    return i < len(steps) and steps[i] <= last


def _device_of(graph: Graph, k: int, op_device: Sequence[str], home: list[str]) -> str:
    """A pure view op runs where its base lives: a view allocates nothing, and its
    readers elsewhere then copy the view, not the whole base."""
    if is_pure_view(graph, k):
        return home[graph.topology.storage_of[graph.topology.op_inputs[k][0]]]
    return op_device[k]


def _renamed(op: Op, renamed: dict[str, str], device: str) -> Op:
    inputs = tuple(renamed.get(t, t) for t in op.inputs)
    return replace(op, inputs=inputs, device=device)


def _fresh(name: str, taken: set[str]) -> str:
    candidate, i = name, 1
    while candidate in taken:
        candidate, i = f"{name}#{i}", i + 1
    taken.add(candidate)
    return candidate

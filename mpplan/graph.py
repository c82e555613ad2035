"""The IR: ``Tensor``, ``Op`` and ``Graph``, and the memory semantics every pass shares.

A graph is an immutable list of ops in a valid execution order (the *as-given*
order) over named tensors.  Names are for I/O and errors; passes work on the dense
integer ids of ``Graph.topology``, derived once and cached.

Memory semantics (DESIGN.md):

* A tensor's **storage** is the root of its ``alias_of`` chain; a view allocates
  nothing.  An op that lists a tensor as both input and output updates it in place:
  same storage, a new *version*.
* A storage is live, inclusively, from the first op that touches it (its producer)
  through the last op that reads or writes any of its aliases; graph outputs live to
  the end.
* ``input``, ``param`` and ``optimizer_state`` tensors, and ``grad`` tensors that
  are the gradient of a parameter (``grad_of``), are **static**: resident for the
  whole step and never shared.  Everything else is **dynamic**.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from operator import attrgetter

from mpplan.errors import GraphError
from mpplan.graph_hash import hash_v1, hash_v2
from mpplan.topo import topological_order


class Kind(str, enum.Enum):
    """What a tensor is for; kinds replace Caffe2's name-suffix conventions."""

    INPUT = "input"
    PARAM = "param"
    ACTIVATION = "activation"
    GRAD = "grad"
    OPTIMIZER_STATE = "optimizer_state"
    OUTPUT = "output"
    WORKSPACE = "workspace"


#: Kinds that exist before the step starts, so they need no producing op.
SOURCE_KINDS = frozenset({Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE})


@dataclass(frozen=True, slots=True)
class Tensor:
    """A named value: ``nbytes`` of storage unless it is a view (``alias_of``)."""

    name: str
    nbytes: int
    kind: Kind = Kind.ACTIVATION
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    alias_of: str | None = None
    grad_of: str | None = None


@dataclass(frozen=True, slots=True)
class Op:
    """One operation.  A tensor in both ``inputs`` and ``outputs`` is updated in place.

    ``backward_of`` names the forward op this op differentiates; ``module`` is the
    dotted module path the op came from; ``stage`` is a remat stage mark;
    ``recompute_of`` names the forward op a recompute op repeats.
    """

    name: str
    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cost: float = 0.0
    device: str | None = None
    backward_of: str | None = None
    module: str | None = None
    stage: str | None = None
    recompute_of: str | None = None

    @property
    def in_place(self) -> tuple[str, ...]:
        """Outputs that are also inputs: written in place."""
        return tuple(t for t in self.outputs if t in self.inputs)


@dataclass(frozen=True, slots=True)
class Topology:
    """Dense-id view of a valid graph; every sequence is indexed by tensor or op id.

    ``op_storages[k]`` are the storages op ``k`` reads or writes: exactly what must
    be resident while it runs.  ``preds``/``succs`` are the op DAG, including the
    ordering that in-place writes impose (a write waits for the readers of the
    previous version; later readers wait for the write).
    """

    tensor_index: dict[str, int]
    op_index: dict[str, int]
    storage_of: tuple[int, ...]
    nbytes: tuple[int, ...]
    is_static: tuple[bool, ...]
    producer: tuple[int, ...]
    consumers: tuple[tuple[int, ...], ...]
    op_inputs: tuple[tuple[int, ...], ...]
    op_outputs: tuple[tuple[int, ...], ...]
    op_storages: tuple[tuple[int, ...], ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    output_storages: frozenset[int]

    @property
    def num_ops(self) -> int:
        return len(self.preds)

    @property
    def storages(self) -> tuple[int, ...]:
        """Ids of the tensors that own storage (roots of alias chains), ascending."""
        return tuple(t for t, s in enumerate(self.storage_of) if s == t)


_NAME, _NBYTES, _KIND = attrgetter("name"), attrgetter("nbytes"), attrgetter("kind")
_ALIAS_OF, _GRAD_OF = attrgetter("alias_of"), attrgetter("grad_of")
_BACKWARD_OF, _RECOMPUTE_OF = attrgetter("backward_of"), attrgetter("recompute_of")
_STR_ONLY = frozenset({str})


@dataclass(frozen=True)
class Graph:
    """An immutable graph.  ``topology`` validates on first use and is cached."""

    name: str
    tensors: tuple[Tensor, ...]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...] = ()

    def validate(self) -> Graph:
        """Return ``self`` if the graph is well formed, else raise ``GraphError``."""
        _ = self.topology
        return self

    @cached_property
    def topology(self) -> Topology:
        return _build_topology(self)

    def tensor(self, name: str) -> Tensor:
        return self.tensors[self.topology.tensor_index[name]]

    def op(self, name: str) -> Op:
        return self.ops[self.topology.op_index[name]]

    @property
    def output_names(self) -> tuple[str, ...]:
        """The declared outputs plus every tensor of kind ``output``, in tensor order."""
        declared = set(self.outputs)
        return tuple(t.name for t in self.tensors if t.name in declared or t.kind is Kind.OUTPUT)

    @cached_property
    def dynamic_grads(self) -> Graph:
        """This graph under ``planner.grads: dynamic`` (``with_dynamic_grads``), made on first use."""
        return _dynamic_grads(self)

    @cached_property
    def content_hash(self) -> str:
        """A stable digest of everything but the graph's name (``graph_hash``: version 2, ``v2-`` and hex)."""
        return hash_v2(self)

    @cached_property
    def content_hash_v1(self) -> str:
        """The version 1 digest, which plans made before version 2 carry (``graph_hash.hash_matches``)."""
        return hash_v1(self)


def _check_op_links(ops: tuple[Op, ...], op_index: Mapping[str, int]) -> None:
    """Each op's ``backward_of`` and ``recompute_of`` names an op of the graph: the runtime looks both up, and a
    dangling link would fail there, far from the file that made it."""
    linked = set(map(_BACKWARD_OF, ops)) | set(map(_RECOMPUTE_OF, ops))
    linked.discard(None)
    if linked <= op_index.keys():  # the common case in C; the loop names the first culprit
        return
    for op in ops:
        for field, name in (("backward_of", op.backward_of), ("recompute_of", op.recompute_of)):
            if name is not None and name not in op_index:
                raise GraphError(f"op {op.name!r}: {field} names unknown op {name!r}")


def _build_topology(graph: Graph) -> Topology:
    tensors = graph.tensors
    tensor_index = _unique_index(list(map(_NAME, tensors)), "tensor")
    op_index = _unique_index(list(map(_NAME, graph.ops)), "op")
    storage_of = _storage_roots(tensors, tensor_index)
    nbytes = tuple(map(_NBYTES, tensors))
    grads_of = set(map(_GRAD_OF, tensors))
    grads_of.discard(None)
    if (nbytes and min(nbytes) < 0) or not grads_of <= tensor_index.keys():  # the loop names the first culprit
        for t in tensors:
            if t.nbytes < 0:
                raise GraphError(f"tensor {t.name!r}: negative size {t.nbytes} bytes")
            if t.grad_of is not None and t.grad_of not in tensor_index:
                raise GraphError(f"tensor {t.name!r}: grad_of names unknown tensor {t.grad_of!r}")
    # Each tensor's own staticness (every grad_of is known by now), read at its storage's root.
    kinds = list(map(_KIND, tensors))
    static = [kind in SOURCE_KINDS or (kind is Kind.GRAD and t.grad_of is not None
                                       and kinds[tensor_index[t.grad_of]] is Kind.PARAM)
              for kind, t in zip(kinds, tensors)]
    is_static = tuple(map(static.__getitem__, storage_of))

    lookup = tensor_index.__getitem__

    def ids(op: Op, names: tuple[str, ...], role: str) -> tuple[int, ...]:
        try:
            found = tuple(map(lookup, names))
        except KeyError as missing:
            raise GraphError(f"op {op.name!r}: {role} names unknown tensor {missing.args[0]!r}") from None
        return _distinct(found)

    try:  # the common case without a call per op; on an unknown name, the loop below names the op
        op_inputs = _all_distinct([tuple(map(lookup, o.inputs)) for o in graph.ops])
        op_outputs = _all_distinct([tuple(map(lookup, o.outputs)) for o in graph.ops])
    except KeyError:
        op_inputs = tuple(ids(o, o.inputs, "input") for o in graph.ops)
        op_outputs = tuple(ids(o, o.outputs, "output") for o in graph.ops)
    _check_op_links(graph.ops, op_index)
    producer = _producers(graph, op_inputs, op_outputs, len(graph.tensors))
    for i, t in enumerate(graph.tensors):
        if producer[i] < 0 and t.alias_of is None and t.kind not in SOURCE_KINDS:
            raise GraphError(
                f"tensor {t.name!r}: produced by no op and not declared input, param or optimizer_state"
            )
    consumers: list[list[int]] = [[] for _ in graph.tensors]
    for k, ins in enumerate(op_inputs):
        for ti in ins:
            consumers[ti].append(k)
    preds = _dependencies(op_inputs, op_outputs, producer, storage_of)
    _check_order(graph, preds)
    succs: list[list[int]] = [[] for _ in graph.ops]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    at = storage_of.__getitem__
    op_storages = _all_distinct([tuple(map(at, ins + outs)) for ins, outs in zip(op_inputs, op_outputs)])
    outputs = set()
    for name in graph.output_names:
        outputs.add(storage_of[tensor_index[name]])
    for name in graph.outputs:
        if name not in tensor_index:
            raise GraphError(f"graph output {name!r} is not a known tensor")
    return Topology(
        tensor_index=tensor_index,
        op_index=op_index,
        storage_of=storage_of,
        nbytes=nbytes,
        is_static=is_static,
        producer=producer,
        consumers=tuple(tuple(c) for c in consumers),
        op_inputs=op_inputs,
        op_outputs=op_outputs,
        op_storages=op_storages,
        preds=preds,
        succs=tuple(tuple(s) for s in succs),
        output_storages=frozenset(outputs),
    )


def _distinct(ids: Sequence[int]) -> tuple[int, ...]:
    """``ids`` without repeats, first occurrences in order."""
    return tuple(ids) if len(ids) < 2 or len(set(ids)) == len(ids) else tuple(dict.fromkeys(ids))


def _all_distinct(rows: list[tuple[int, ...]]) -> tuple[tuple[int, ...], ...]:
    """``_distinct`` of every row, without a call per row that has no repeats (nearly all of them)."""
    return tuple([row if len(row) < 2 or len(set(row)) == len(row) else tuple(dict.fromkeys(row)) for row in rows])


def _unique_index(names: list[str], what: str) -> dict[str, int]:
    if _STR_ONLY.issuperset(map(type, names)):
        index = dict(zip(names, range(len(names))))
        if len(index) == len(names) and "" not in index:
            return index  # the common case, every check in C; the loop below names the culprit
    index = {}
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise GraphError(f"{what} #{i}: name must be a non-empty string, got {name!r}")
        if name in index:
            raise GraphError(f"{what} {name!r}: defined twice")
        index[name] = i
    return index


def _storage_roots(tensors: tuple[Tensor, ...], index: dict[str, int]) -> tuple[int, ...]:
    """Root of each alias chain; rejects unknown bases and alias cycles."""
    roots = [i if base is None else -1 for i, base in enumerate(map(_ALIAS_OF, tensors))]
    for start in range(len(tensors)):
        if roots[start] >= 0:
            continue  # not a view (or a view whose chain an earlier one resolved): its own root is known
        chain: list[int] = []
        i = start
        while roots[i] < 0:
            if i in chain:
                names = " -> ".join(tensors[j].name for j in chain[chain.index(i):] + [i])
                raise GraphError(f"tensor {tensors[i].name!r}: alias cycle {names}")
            chain.append(i)
            base = tensors[i].alias_of  # a view's: every other tensor's root is already set
            if base not in index:
                raise GraphError(f"tensor {tensors[i].name!r}: alias_of names unknown tensor {base!r}")
            i = index[base]
        for j in chain:
            roots[j] = roots[i]
    return tuple(roots)


def _producers(
    graph: Graph, op_inputs: Sequence[Sequence[int]], op_outputs: Sequence[Sequence[int]], num_tensors: int
) -> tuple[int, ...]:
    """The op that first writes each tensor (-1: none); a second non-in-place write is an error."""
    producer = [-1] * num_tensors
    for k, (ins, outs) in enumerate(zip(op_inputs, op_outputs)):
        for t in outs:
            if t in ins:
                continue
            if producer[t] >= 0:
                raise GraphError(
                    f"tensor {graph.tensors[t].name!r}: produced twice, by ops "
                    f"{graph.ops[producer[t]].name!r} and {graph.ops[k].name!r}"
                )
            producer[t] = k
    return tuple(producer)


def _dependencies(
    op_inputs: Sequence[Sequence[int]],
    op_outputs: Sequence[Sequence[int]],
    producer: Sequence[int],
    storage_of: Sequence[int],
) -> tuple[tuple[int, ...], ...]:
    """Op predecessors: read-after-write by name, plus the in-place version order.

    Versions follow the as-given order: an in-place write waits for every reader
    of the storage's previous version, and later readers wait for the write.
    Readers are kept only for the storages some op writes in place, the only ones
    whose readers are ever asked for (none, in most graphs): a quarter of the time.
    """
    written_in_place = {storage_of[t] for ins, outs in zip(op_inputs, op_outputs) if ins for t in outs if t in ins}
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    preds: list[tuple[int, ...]] = []
    writer_of = last_writer.get
    for k, (ins, outs) in enumerate(zip(op_inputs, op_outputs)):
        ps: dict[int, None] = {}
        for t in ins:
            s = storage_of[t]
            p = producer[t]
            if p >= 0 and p != k:
                ps[p] = None
            p = writer_of(s, -1)
            if p >= 0 and p != k:
                ps[p] = None
            if s in written_in_place:
                readers.setdefault(s, []).append(k)
        for t in outs:
            s = storage_of[t]
            if t in ins:
                for r in readers.get(s, ()):
                    if r != k:
                        ps[r] = None
                readers[s] = []
                last_writer[s] = k
            elif t == s:
                last_writer[s] = k
        preds.append(tuple(ps))
    return tuple(preds)


def _check_order(graph: Graph, preds: tuple[tuple[int, ...], ...]) -> None:
    """Reject cycles (naming an op on one), then an op listed before what it needs."""
    if all(not ps or max(ps) < k for k, ps in enumerate(preds)):
        return  # listed in a valid order, so no cycle either: the common case, without a topological sort
    succs: list[list[int]] = [[] for _ in preds]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    reached = topological_order(succs, [len(p) for p in preds])
    if len(reached) < len(preds):
        done = set(reached)
        stuck = next(k for k in range(len(preds)) if k not in done)
        raise GraphError(f"op {graph.ops[stuck].name!r}: lies on a dependency cycle")
    for k, ps in enumerate(preds):
        late = [p for p in ps if p > k]
        if late:
            raise GraphError(
                f"op {graph.ops[k].name!r}: listed before op {graph.ops[late[0]].name!r} it depends on; "
                "list ops in a valid execution order"
            )


def is_pure_view(graph: Graph, k: int) -> bool:
    """Whether op ``k`` only makes views: it reads something, and every output is a new
    alias (not a tensor it also reads, as an in-place op's)."""
    topo = graph.topology
    op = graph.ops[k]
    outs = topo.op_outputs[k]
    return bool(topo.op_inputs[k]) and bool(outs) and all(
        graph.tensors[t].alias_of is not None and graph.tensors[t].name not in op.inputs for t in outs
    )


def with_dynamic_grads(graph: Graph) -> Graph:
    """``graph`` with its parameters' gradients dynamic, as eager PyTorch holds ``.grad`` (``_dynamic_grads``).

    Made once per graph and kept beside its topology: the planner, the timeline and the
    executor each ask for it, and a 100k-op graph takes a second to rewrite.
    """
    return graph.dynamic_grads


def _dynamic_grads(graph: Graph) -> Graph:
    """``graph`` with its parameters' gradients dynamic, as eager PyTorch holds ``.grad``.

    A parameter's gradient is static because of its ``grad_of`` link (module
    docstring): resident for the whole step, memonger's choice.  Eager PyTorch
    (``zero_grad(set_to_none=True)``) allocates it when backward makes it and keeps
    it to the end of the step.  This graph drops the link and makes each such
    gradient a graph output, so the planner, the verifier and the executor see
    exactly that lifetime; before backward its memory is free for activations.
    """
    params = {t.name for t in graph.tensors if t.kind is Kind.PARAM}
    grads = [t for t, tensor in enumerate(graph.tensors) if tensor.kind is Kind.GRAD and tensor.grad_of in params]
    if not grads:
        return graph
    tensors = list(graph.tensors)
    for t in grads:
        old = tensors[t]
        tensors[t] = Tensor(old.name, old.nbytes, old.kind, old.shape, old.dtype, old.alias_of)
    declared = set(graph.outputs)
    names = [tensors[t].name for t in grads]
    outputs = (*graph.outputs, *(g for g in names if g not in declared))
    new = Graph(graph.name, tuple(tensors), graph.ops, outputs)
    # Only the gradients' static marks and the output storages differ from ``graph``'s topology
    # (dropping ``grad_of`` removes a check, adding known outputs adds none), so carry it over
    # instead of rebuilding it from the names: the result equals ``new.validate()``'s, far cheaper.
    topo = graph.topology
    storage_of = topo.storage_of
    dropped = set(grads)
    new.__dict__["topology"] = replace(  # where the cached property keeps what ``topology`` would return
        topo,
        is_static=tuple([False if s in dropped else static for s, static in zip(storage_of, topo.is_static)]),
        output_storages=topo.output_storages | {storage_of[t] for t in grads},
    )
    return new


#: What ``reordered`` requires each replacement op to keep.
_OP_IO = attrgetter("name", "inputs", "outputs")


def _permuted_dependencies(
    topo: Topology, order: Sequence[int], position: Sequence[int]
) -> tuple[tuple[int, ...], ...] | None:
    """``_dependencies`` of the listing ``order``, by renumbering ``topo.preds``; ``None`` where that may differ.

    Only in-place writes make dependencies depend on the listing (readers of a version,
    then the write).  Without them, an op's predecessors are the producers of what it
    reads and of those tensors' storages, found in the same sequence under any listing,
    provided each storage producer is listed before its readers in both listings: in the
    old one (checked here) and in the new one (the renumbered predecessors all precede
    their op).  Otherwise (``None``) the caller derives them afresh, which also names
    an op listed too early.
    """
    storage_of, producer = topo.storage_of, topo.producer
    op_inputs, op_outputs = topo.op_inputs, topo.op_outputs
    for k, ins in enumerate(op_inputs):
        for t in ins:
            if producer[storage_of[t]] > k:
                return None
        for t in op_outputs[k]:
            if t in ins:
                return None
    preds = tuple([tuple([position[p] for p in topo.preds[k]]) for k in order])
    for i, ps in enumerate(preds):
        if ps and max(ps) > i:
            return None
    return preds


def reordered(graph: Graph, order: Sequence[int], ops: Sequence[Op]) -> Graph:
    """``graph`` with its ops listed in ``order`` (op ids of ``graph``), op ``i`` replaced by
    ``ops[i]``, which must read and write exactly what ``graph.ops[order[i]]`` does (a new
    device, say); the tensors stay as they are.

    The topology is carried over, permuted, instead of rebuilt from the names: tensor ids
    are unchanged, so only the op-indexed parts move.  The dependencies are derived again
    for the new listing, as ``_build_topology`` derives them, and the listing is checked
    against them (``GraphError`` naming the op listed too early), so the result is the
    graph ``Graph(graph.name, graph.tensors, tuple(ops), graph.outputs).validate()`` would
    give, at a fraction of the cost on large graphs.
    """
    topo = graph.topology
    if len(order) != len(topo.op_inputs) or len(ops) != len(order) or sorted(order) != list(range(len(order))):
        raise GraphError(f"graph {graph.name!r}: an order must list each of its {len(topo.op_inputs)} ops once")
    was = [graph.ops[k] for k in order]
    if list(map(_OP_IO, ops)) != list(map(_OP_IO, was)):  # the common case at C speed; the loop names the op
        for op, old in zip(ops, was):
            if _OP_IO(op) != _OP_IO(old):
                raise ValueError(
                    f"op {op.name!r}: reordered keeps each op's name, inputs and outputs; {old.name!r} differs"
                )
    new = Graph(graph.name, graph.tensors, tuple(ops), graph.outputs)
    op_index = dict(zip([op.name for op in new.ops], range(len(order))))
    _check_op_links(new.ops, op_index)  # the ops may carry other links than the ones they replace
    position = [0] * len(order)
    for i, k in enumerate(order):
        position[k] = i
    op_inputs = tuple([topo.op_inputs[k] for k in order])
    op_outputs = tuple([topo.op_outputs[k] for k in order])
    producer = tuple([p if p < 0 else position[p] for p in topo.producer])
    preds = _permuted_dependencies(topo, order, position)
    if preds is None:
        preds = _dependencies(op_inputs, op_outputs, producer, topo.storage_of)
    for i, ps in enumerate(preds):
        if ps and max(ps) > i:
            late = next(p for p in ps if p > i)
            raise GraphError(
                f"op {new.ops[i].name!r}: listed before op {new.ops[late].name!r} it depends on; "
                "list ops in a valid execution order"
            )
    succs: list[list[int]] = [[] for _ in order]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    new.__dict__["topology"] = Topology(  # where the cached property keeps what ``topology`` would return
        tensor_index=topo.tensor_index,
        op_index=op_index,
        storage_of=topo.storage_of,
        nbytes=topo.nbytes,
        is_static=topo.is_static,
        producer=producer,
        consumers=tuple([tuple(sorted(map(position.__getitem__, cs))) if cs else () for cs in topo.consumers]),
        op_inputs=op_inputs,
        op_outputs=op_outputs,
        op_storages=tuple(topo.op_storages[k] for k in order),
        preds=preds,
        succs=tuple(tuple(s) for s in succs),
        output_storages=topo.output_storages,
    )
    return new

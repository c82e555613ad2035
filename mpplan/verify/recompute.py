"""The graph a plan runs: the graph rewritten with the recomputes ``plan.remat`` lists, derived here.

The verifier shares no code with the remat pass: this module re-derives the rewrite
from its documented contract (``docs``/the remat pass's docstring), so a bug in the
pass shows up as a schedule, buffer or peak that does not check out.

The contract.  Recomputing op ``F`` adds ``<F>@recompute`` (same type, cost, module;
``recompute_of=F``) that reads ``F``'s inputs as they are late and writes
``<t>@recompute`` for each output ``t``, of the same bytes.  Every *late* reader of a
recomputed storage reads the recompute instead.  In a training graph (one with
``backward_of`` ops) the late region starts at the first backward op of the as-given
order; otherwise a storage's late uses are those after the longest run of steps in
which it is untouched (at least ``MIN_GAP``).  A view of a recomputed tensor read
late is recreated: a view op made early is repeated as ``<V>@recompute`` on the
recomputed base, a view without an op gets a new alias, and a view made late is
re-pointed at the recomputed base.  Names that are taken get a counter
(``t@recompute2``).  A record that states ``from_op`` moves its tensor's late region to
start at that op, which must read the tensor after the op that makes it; ``from_op``
``@recomputes`` puts it past every op, so only other recomputes read the recompute.

On top of rebuilding it, ``with_recomputes`` checks that the rewrite preserves values:
a recompute repeats a deterministic, not-in-place op; its outputs replace tensors that
nobody updates in place; and its inputs are at the versions the original op read.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Op, Tensor
from mpplan.plan import Plan

#: A storage's late uses follow a gap of at least this many steps (graphs without a backward pass).
MIN_GAP = 2
#: The suffix of recompute ops and tensors.
SUFFIX = "@recompute"
#: The ``from_op`` of a recompute that no op of the graph reads, only other recomputes.
RECOMPUTES_ONLY = "@recomputes"
#: Words of an op type that mark a random kernel: recomputing it would draw other numbers.
_RANDOM = ("bernoulli", "dropout", "rand", "normal", "uniform", "multinomial", "poisson", "exponential")


def with_recomputes(graph: Graph, plan: Plan) -> Graph:
    """``graph`` rewritten with the recomputes of ``plan.remat``; ``VerificationError`` when the
    records do not describe a value-preserving rewrite of this graph.

    Records of ops of ``graph`` make the first round; a record of a recompute op that a round
    made (``F@recompute``, several recomputes of one tensor) belongs to a later round, applied
    by the same contract to the graph the rounds before it rewrote.
    """
    remaining = list(plan.remat)
    while remaining:
        present = {o.name for o in graph.ops}
        now = [r for r in remaining if r.get("op") in present]
        if not now:
            r = remaining[0]
            raise VerificationError(
                f"remat: op {r.get('op')!r} is not recomputable: no op of the graph makes {r.get('tensor')!r}"
            )
        graph = _round(graph, now)
        remaining = [r for r in remaining if r.get("op") not in present]
    return graph


def _round(graph: Graph, records: Sequence[Mapping[str, object]]) -> Graph:
    """One round: ``graph`` rewritten with the recomputes of ``records``, each of an op of ``graph``."""
    ops = {o.name: o for o in graph.ops}
    tensors = {t.name: t for t in graph.tensors}
    chosen: dict[str, None] = {}
    for r in records:
        name, tensor = str(r.get("op")), r.get("tensor")
        op = ops.get(name)
        if op is None or tensor not in op.outputs:
            raise VerificationError(f"remat: op {name!r} is not recomputable: no op of the graph makes {tensor!r}")
        if op.in_place or any(word in op.type.lower() for word in _RANDOM) or op.backward_of is not None:
            _fail(f"remat: op {name!r} is not recomputable: in-place, random or a backward op")
        chosen[name] = None
    rewritten = _Rewrite(graph, tensors, chosen, _stated_splits(graph, records)).run()
    new_ops = {o.name: o for o in rewritten.ops}
    new_tensors = {t.name: t for t in rewritten.tensors}
    for r in records:
        if r.get("recompute_op") not in new_ops or new_ops[str(r["recompute_op"])].recompute_of != r.get("op"):
            _fail(f"remat: recompute op {r.get('recompute_op')!r} of {r.get('tensor')!r} is not in the rewritten graph")
        tensor = new_tensors.get(str(r.get("recompute_tensor")))
        if tensor is None or tensor.nbytes != r.get("bytes") or tensor.nbytes != tensors[str(r["tensor"])].nbytes:
            _fail(f"remat: recompute tensor {r.get('recompute_tensor')!r} is missing or has other bytes than listed")
    listed = {str(r["recompute_op"]) for r in records}
    for op in rewritten.ops:
        outputs_are_views = all(new_tensors[t].alias_of is not None for t in op.outputs)
        made_now = op.name not in ops  # recomputes of earlier rounds were checked in theirs
        if made_now and op.recompute_of is not None and op.name not in listed and not outputs_are_views:
            _fail(f"remat: recompute op {op.name!r} is needed by the records but not listed")
    _check_versions(graph, rewritten)
    return rewritten


class _Rewrite:
    """One walk over the as-given order that emits each recompute right before its first late reader."""

    def __init__(
        self, graph: Graph, tensors: Mapping[str, Tensor], chosen: Mapping[str, None], stated: Mapping[str, int]
    ) -> None:
        self.graph, self.tensors = graph, tensors
        self.root = _roots(tensors)
        self.producer = {t: k for k, o in enumerate(graph.ops) for t in o.outputs if t not in o.inputs}
        recomputed = {self.root[t] for o in graph.ops if o.name in chosen for t in o.outputs}
        self.recomputed = recomputed
        self.split = {**_splits(graph, self.root, recomputed), **stated}
        self.taken_tensors = set(tensors)
        self.taken_ops = {o.name for o in graph.ops}
        self.late: dict[str, str] = {}  # tensor -> the name late readers use
        self.new_tensors: list[Tensor] = []
        self.redefined: dict[str, Tensor] = {}
        self.out: list[Op] = []

    def run(self) -> Graph:
        graph = self.graph
        for k, op in enumerate(graph.ops):
            inputs = tuple(self.late_name(t) if self.is_late(t, k) else t for t in op.inputs)
            for t in op.outputs:
                base = self.tensors[t].alias_of
                if base is not None and self.is_late(t, k) and t not in self.redefined:
                    self.redefined[t] = _renamed(self.tensors[t], t, self.late_name(base))
            self.out.append(op if inputs == op.inputs else _with_inputs(op, inputs))
        tensors = tuple(self.redefined.get(t.name, t) for t in graph.tensors) + tuple(self.new_tensors)
        return Graph(graph.name, tensors, tuple(self.out), graph.outputs)

    def is_late(self, t: str, k: int) -> bool:
        s = self.root[t]
        return s in self.recomputed and k >= self.split[s]

    def late_name(self, t: str) -> str:
        """The tensor a late reader of ``t`` reads, emitting its recompute on first need."""
        if self.root[t] not in self.recomputed:
            return t
        if t in self.late:
            return self.late[t]
        tensor = self.tensors[t]
        p = self.producer.get(t)
        if tensor.alias_of is None:
            if p is None:
                _fail(f"remat: tensor {t!r} is recomputed but made by no op")
            self.emit(self.graph.ops[p])  # type: ignore[index]
            return self.late[t]
        if p is not None and p >= self.split[self.root[t]]:
            return t  # a view made late: re-pointed at the recomputed base
        if p is None:
            self.late[t] = self.fresh(t, self.taken_tensors)
            self.new_tensors.append(_renamed(tensor, self.late[t], self.late_name(tensor.alias_of)))
            return self.late[t]
        self.emit(self.graph.ops[p])
        return self.late[t]

    def emit(self, op: Op) -> None:
        inputs = tuple(self.late_name(t) for t in op.inputs)
        outputs = []
        for t in op.outputs:
            tensor = self.tensors[t]
            self.late[t] = self.fresh(t, self.taken_tensors)
            alias = None if tensor.alias_of is None else self.late_name(tensor.alias_of)
            self.new_tensors.append(_renamed(tensor, self.late[t], alias))
            outputs.append(self.late[t])
        name = self.fresh(op.name, self.taken_ops)
        self.out.append(Op(name, op.type, inputs, tuple(outputs), op.cost, op.device, None, op.module, None, op.name))

    @staticmethod
    def fresh(base: str, taken: set[str]) -> str:
        name, k = base + SUFFIX, 1
        while name in taken:
            k += 1
            name = f"{base}{SUFFIX}{k}"
        taken.add(name)
        return name


def _stated_splits(graph: Graph, records: Sequence[Mapping[str, object]]) -> dict[str, int]:
    """Tensor -> the position of the ``from_op`` its record states: an op of ``graph`` after
    the tensor's producer that reads the tensor (or a view of it), or past every op."""
    position = {o.name: k for k, o in enumerate(graph.ops)}
    root = _roots({t.name: t for t in graph.tensors})
    stated = {}
    for r in records:
        start, tensor = r.get("from_op"), str(r.get("tensor"))
        if start is None:
            continue
        if start == RECOMPUTES_ONLY:
            stated[root[tensor]] = len(graph.ops)
            continue
        at = position.get(str(start), -1)
        made = position[str(r.get("op"))]
        if at <= made or root[tensor] not in {root[t] for t in graph.ops[at].inputs}:
            _fail(f"remat: from_op {start!r} of {tensor!r} is no op that reads it after {r.get('op')!r}")
        stated[root[tensor]] = at
    return stated


def _splits(graph: Graph, root: Mapping[str, str], storages: set[str]) -> dict[str, int]:
    """The first late position of each storage in ``storages`` (the module docstring's rule)."""
    boundary = next((k for k, op in enumerate(graph.ops) if op.backward_of is not None), None)
    if boundary is not None:
        return dict.fromkeys(storages, boundary)
    uses: dict[str, list[int]] = {s: [] for s in storages}
    for k, op in enumerate(graph.ops):
        for s in dict.fromkeys(root[t] for t in (*op.inputs, *op.outputs)):
            if s in uses:
                uses[s].append(k)
    split = {}
    for s, u in uses.items():
        best_gap, cut = 0, len(graph.ops)
        for a, b in itertools.pairwise(u):
            if b - a > best_gap:
                best_gap, cut = b - a, b
        split[s] = cut if best_gap >= MIN_GAP else len(graph.ops)
    return split


def _check_versions(graph: Graph, rewritten: Graph) -> None:
    """A recompute reads its inputs at the versions its original read, and its outputs stand in
    only for tensors at version 0 (never updated in place before the late reader)."""
    original = _versions_read(graph)
    now = _versions_read(rewritten)
    ops = {o.name: o for o in graph.ops}
    for op in rewritten.ops:
        source = ops[op.recompute_of] if op.recompute_of else None
        for i, t in enumerate(op.inputs):
            if source is not None:
                before = original[(source.name, source.inputs[i])]
            elif (op.name, t) in original:
                continue
            else:  # an original op reading a recomputed tensor in place of the one it names
                before = original[(op.name, ops[op.name].inputs[i])]
            if now[(op.name, t)] != before:
                _fail(f"remat: op {op.name!r} reads {t!r} at version {now[(op.name, t)]}, the original read {before}")


def _versions_read(graph: Graph) -> dict[tuple[str, str], int]:
    root = _roots({t.name: t for t in graph.tensors})
    version: dict[str, int] = {}
    read: dict[tuple[str, str], int] = {}
    for op in graph.ops:
        for t in op.inputs:
            read[(op.name, t)] = version.get(root[t], 0)
        for t in op.outputs:
            if t in op.inputs:
                version[root[t]] = version.get(root[t], 0) + 1
    return read


def _roots(tensors: Mapping[str, Tensor]) -> dict[str, str]:
    roots: dict[str, str] = {}
    for name in tensors:
        cur, seen = name, set()
        while tensors[cur].alias_of is not None and cur not in seen:
            seen.add(cur)
            cur = tensors[cur].alias_of  # type: ignore[assignment]
        roots[name] = cur
    return roots


def _renamed(tensor: Tensor, name: str, alias_of: str | None) -> Tensor:
    return Tensor(name, tensor.nbytes, tensor.kind, tensor.shape, tensor.dtype, alias_of, tensor.grad_of)


def _with_inputs(op: Op, inputs: tuple[str, ...]) -> Op:
    return Op(op.name, op.type, inputs, op.outputs, op.cost, op.device, op.backward_of, op.module, op.stage,
              op.recompute_of)


def _fail(message: str) -> None:
    raise VerificationError(message)

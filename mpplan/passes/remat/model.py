"""The memory model of rematerialisation and the graph rewrite every policy shares.

A *recompute* is a real op.  For a recomputed op ``F`` writing activation ``t`` the
rewritten graph holds ``<F>@recompute`` (``recompute_of=F.name``; same type, cost,
module and device; ``backward_of`` empty) reading ``F``'s inputs and writing a new
activation ``<t>@recompute`` of the same bytes, shape and dtype.  Every *late* reader
of ``t`` reads ``<t>@recompute`` instead, so ``t`` itself dies after its last *early*
use.  A multi-output op is recomputed whole (outputs nobody reads late die at once).

Early and late.  In a training graph (one with ``backward_of`` ops) the late region
starts at the first backward op of the as-given order; every op before it is a
forward op, and a tensor's late uses are its uses from there on.  A graph without a
backward pass (inference, the random layered graphs) has no such line, so each
tensor is split at its own largest gap: the uses after the longest run of steps in
which it is not touched (at least ``MIN_GAP`` steps) are late.  Either way a
recompute runs once, right before the first late consumer of its outputs; when that
consumer is itself a recompute (a chain, as in Chen's segments) it runs right before
that one, and recomputes placed before the same op run in their forward order.  A
solver may instead name where a tensor's late region starts (``build_model``'s
``cuts``; ``from_op`` of the plan's record): any of its uses after its producer, or
``NEVER`` (``rewriting.RECOMPUTES_ONLY``): only recomputes read the recompute (a chain link).  A
recompute reads its inputs as they are then: kept tensors (whose lives it extends),
static tensors, or the outputs of earlier recomputes.

What is never recomputed: backward ops and ops after the line; ops writing a
param, input, grad, output or workspace tensor (only ``activation`` outputs are
recomputed), a graph output, or a tensor that any op updates in place (the late
readers would see another version); in-place ops; random ops (``is_random``: a
recompute would draw other numbers); ops whose input storage is
updated in place after them and before their latest possible recompute (the
recompute would read another version); ops that write views.  View-only ops cost
nothing and allocate nothing, so they are never chosen; instead, a view of a
recomputed tensor that is read late is *recreated*: its view op is repeated as
``<V>@recompute`` on the recomputed base, right before the first late reader of the
view (a view without a producing op gets a new alias tensor only), and a view made
in the late region is re-pointed at the recomputed base.  A tensor whose views are
made by ops that read other dynamic tensors is not recomputed.

``build_model`` precomputes all of this once per graph as a ``RematModel``;
``evaluate`` (``mpplan.passes.remat.evaluation``) scores a choice of recomputes on
it (the peak of the rewritten graph's as-given order, ``static + LOAD``, exactly as
``mpplan.sim`` would) and ``rewrite`` (``mpplan.passes.remat.rewriting``) makes the
graph.  The policies (``policies``), the budget search (``budget``) and the MILP
(``ilp``) decide on this model only.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mpplan import sim
from mpplan.graph import Graph, Kind, Op

__all__ = ["MIN_GAP", "NEVER", "SUFFIX", "RematModel", "build_model", "is_random", "storage_index"]

#: Graphs without a backward pass: a tensor is recomputed only across a gap of at
#: least this many steps between two of its uses.
MIN_GAP = 2

#: A position after every op: "no such use".
NEVER = 1 << 62

#: Words in an op type that mark a random kernel (dropout, bernoulli, randn, ...).
RANDOM_KERNELS = ("bernoulli", "dropout", "rand", "normal", "uniform", "multinomial", "poisson", "exponential")

#: Suffix of recompute ops and their outputs.
SUFFIX = "@recompute"


# --- records -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RematModel:
    """The memory model every policy and solver decides on: one graph, precomputed.

    Dynamic storages get dense indices ``j``; recomputable ops ("candidates") dense
    indices ``i`` in forward order.  Positions are op ids of the as-given order.

    Storage ``j``: ``size``; ``start`` (first op touching it); ``early_last`` and
    ``last`` (its last early use and last use overall, the end for graph outputs);
    ``late_first``/``late_last`` (its first and last late use; ``NEVER``/-1 if none);
    ``split`` (uses at or after it are late); ``producer`` (the candidate making it,
    -1 if none); ``readers`` (candidates reading any alias of it).

    Candidate ``i``: ``op``, ``cost``, ``outputs`` and ``inputs`` (storage indices;
    dynamic inputs only), ``consumers`` (candidates reading its outputs) and
    ``first_late`` (the first late use of its outputs, ``NEVER`` if none).
    ``training`` says whether the late region is the backward pass (``boundary``)
    or each storage's own gap.
    """

    graph: Graph
    num_ops: int
    boundary: int
    training: bool
    static_bytes: int
    storage_tensor: tuple[int, ...]
    size: tuple[int, ...]
    start: tuple[int, ...]
    early_last: tuple[int, ...]
    last: tuple[int, ...]
    late_first: tuple[int, ...]
    late_last: tuple[int, ...]
    split: tuple[int, ...]
    producer: tuple[int, ...]
    readers: tuple[tuple[int, ...], ...]
    cand_op: tuple[int, ...]
    cand_cost: tuple[float, ...]
    cand_outputs: tuple[tuple[int, ...], ...]
    cand_inputs: tuple[tuple[int, ...], ...]
    cand_consumers: tuple[tuple[int, ...], ...]
    cand_first_late: tuple[int, ...]

    @property
    def num_candidates(self) -> int:
        return len(self.cand_op)

    def candidate_names(self) -> tuple[str, ...]:
        return tuple(self.graph.ops[k].name for k in self.cand_op)

    def lower_bound(self) -> int:
        """A peak no choice of recomputes goes under: ``static`` plus, at the worst op,
        what it touches and what no recompute can free (storages of non-candidates
        live across it, and candidates' storages before their last early use)."""
        n = self.num_ops
        delta = [0] * (n + 1)
        for j, size in enumerate(self.size):
            end = self.last[j] if self.producer[j] < 0 else self.early_last[j]
            delta[self.start[j]] += size
            delta[end + 1] -= size
        touched = [0] * n
        topo = self.graph.topology
        index = storage_index(self)
        for k, storages in enumerate(topo.op_storages):
            for s in storages:
                at = index.get(s)
                if at is not None and self.producer[at] >= 0 and not self.start[at] <= k <= self.early_last[at]:
                    touched[k] += self.size[at]
        running, best = 0, 0
        for k in range(n):
            running += delta[k]
            best = max(best, running + touched[k])
        return self.static_bytes + best


# --- the memory model ----------------------------------------------------------------


def storage_users(graph: Graph) -> dict[int, list[int]]:
    """The ops that read or write each storage (a view's uses count as its base's), ascending, by
    storage number; storages no op touches are absent.  Every split into early and late uses reads these."""
    uses: dict[int, list[int]] = {}
    for k, storages in enumerate(graph.topology.op_storages):
        for s in storages:
            uses.setdefault(s, []).append(k)
    return uses


def build_model(
    graph: Graph, *, only: frozenset[str] | None = None, cuts: Mapping[int, int] | None = None
) -> RematModel:
    """The ``RematModel`` of ``graph``: which ops are recomputable, and every dynamic
    storage's uses split into early and late (module docstring).

    ``only`` restricts the candidates to the ops it names, and then lets recompute ops
    be candidates (a later round of recomputes: ``mpplan.passes.remat.rounds``);
    without it, recompute ops already in the graph are never candidates.  ``cuts``
    maps a storage's tensor id to the position its late region starts at, in place of
    the rule's split (a solver's cut point: ``RematRecord.from_op``)."""
    topo = graph.topology
    ops, tensors = graph.ops, graph.tensors
    n = topo.num_ops
    boundary = next((k for k, op in enumerate(ops) if op.backward_of is not None), n)
    training = boundary < n
    storage_of = topo.storage_of

    uses = storage_users(graph)
    reads: list[tuple[int, ...]] = [tuple(dict.fromkeys(storage_of[t] for t in ins)) for ins in topo.op_inputs]
    readers_at: dict[int, list[int]] = {}
    for k, storages in enumerate(reads):
        for s in storages:
            readers_at.setdefault(s, []).append(k)
    written: dict[int, list[int]] = {}
    for k, op in enumerate(ops):
        for name in dict.fromkeys(op.in_place):
            written.setdefault(storage_of[topo.tensor_index[name]], []).append(k)
    aliases: dict[int, list[int]] = {}
    for t, tensor in enumerate(tensors):
        if tensor.alias_of is not None:
            aliases.setdefault(storage_of[t], []).append(t)

    dynamic = [s for s in topo.storages if not topo.is_static[s] and s in uses]
    index = {s: j for j, s in enumerate(dynamic)}
    cuts = cuts or {}
    split = [cuts[s] if s in cuts else _split(uses[s], boundary, training) for s in dynamic]
    last = [n - 1 if s in topo.output_storages else uses[s][-1] for s in dynamic]

    # Candidates, last op first: an op's consumers decide how late it may be recomputed.
    cand_of_op: dict[int, int] = {}  # op -> provisional id (reverse order)
    found: list[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int]] = []
    max_anchor: list[int] = []
    for k in reversed(range(boundary if training else n)):
        op = ops[k]
        if op.backward_of is not None or not topo.op_outputs[k] or is_random(op):
            continue
        if (op.recompute_of is not None) if only is None else (op.name not in only):
            continue
        outs = topo.op_outputs[k]
        if not all(_recomputable_output(graph, t, k, written, aliases, reads, split[index[t]] if t in index else 0)
                   for t in outs):
            continue
        out_storages = tuple(index[t] for t in outs)
        first_late = min((_first_at_or_after(uses[dynamic[j]], split[j]) for j in out_storages), default=NEVER)
        consumers = sorted(
            {cand_of_op[g] for j in out_storages for g in readers_at.get(dynamic[j], ()) if g in cand_of_op}
        )
        latest = first_late if first_late < NEVER else max((max_anchor[c] for c in consumers), default=-1)
        if latest < 0:
            continue  # nothing late could ever need it
        inputs = tuple(index[s] for s in reads[k] if s in index and s not in outs)
        if any(_written_between(written.get(dynamic[j], ()), k, latest) for j in inputs):
            continue
        if any(_written_between(written.get(s, ()), k, latest) for s in reads[k] if s not in index):
            continue  # a static input updated in place (an optimizer step) before the recompute
        cand_of_op[k] = len(found)
        max_anchor.append(latest)
        found.append((k, out_storages, inputs, tuple(consumers), first_late))

    m = len(found)
    final = {p: m - 1 - p for p in range(m)}  # provisional id (reverse order) -> forward order
    cand_op = tuple(found[m - 1 - i][0] for i in range(m))
    cand_outputs = tuple(found[m - 1 - i][1] for i in range(m))
    cand_inputs = tuple(found[m - 1 - i][2] for i in range(m))
    cand_consumers = tuple(tuple(sorted(final[c] for c in found[m - 1 - i][3])) for i in range(m))
    cand_first_late = tuple(found[m - 1 - i][4] for i in range(m))
    cand_index = {k: i for i, k in enumerate(cand_op)}

    producer = [-1] * len(dynamic)
    for i, outs in enumerate(cand_outputs):
        for j in outs:
            producer[j] = i
    early_last, late_first, late_last = [], [], []
    for j, s in enumerate(dynamic):
        u = uses[s]
        cut = bisect.bisect_left(u, split[j])
        early_last.append(u[cut - 1] if cut > 0 else u[0])
        late_first.append(u[cut] if cut < len(u) else NEVER)
        late_last.append(u[-1] if cut < len(u) else -1)
    readers = tuple(
        tuple(sorted(cand_index[g] for g in readers_at.get(s, ()) if g in cand_index)) for s in dynamic
    )
    return RematModel(
        graph=graph,
        num_ops=n,
        boundary=boundary,
        training=training,
        static_bytes=sim.static_bytes(graph),
        storage_tensor=tuple(dynamic),
        size=tuple(topo.nbytes[s] for s in dynamic),
        start=tuple(uses[s][0] for s in dynamic),
        early_last=tuple(early_last),
        last=tuple(last),
        late_first=tuple(late_first),
        late_last=tuple(late_last),
        split=tuple(split),
        producer=tuple(producer),
        readers=readers,
        cand_op=cand_op,
        cand_cost=tuple(float(graph.ops[k].cost) for k in cand_op),
        cand_outputs=cand_outputs,
        cand_inputs=cand_inputs,
        cand_consumers=cand_consumers,
        cand_first_late=cand_first_late,
    )


def is_random(op: Op) -> bool:
    """Whether ``op`` draws random numbers: a recompute would not reproduce its outputs."""
    kernel = op.type.lower()
    return any(word in kernel for word in RANDOM_KERNELS)


def _split(uses: list[int], boundary: int, training: bool) -> int:
    """The first late position of a storage used at ``uses`` (ascending)."""
    if training:
        return boundary
    best_gap, cut = 0, NEVER
    for a, b in itertools.pairwise(uses):
        if b - a > best_gap:
            best_gap, cut = b - a, b
    return cut if best_gap >= MIN_GAP else NEVER


def _first_at_or_after(uses: list[int], position: int) -> int:
    i = bisect.bisect_left(uses, position)
    return uses[i] if i < len(uses) else NEVER


def _written_between(writes: Sequence[int], after: int, before: int) -> bool:
    """Whether an in-place write lies strictly between positions ``after`` and ``before``."""
    i = bisect.bisect_right(writes, after)
    return i < len(writes) and writes[i] < before


def _recomputable_output(
    graph: Graph,
    t: int,
    k: int,
    written: dict[int, list[int]],
    aliases: dict[int, list[int]],
    reads: list[tuple[int, ...]],
    split: int,
) -> bool:
    """Whether op ``k``'s output ``t`` may be recomputed (module docstring's rules)."""
    topo = graph.topology
    tensor = graph.tensors[t]
    if tensor.alias_of is not None or tensor.kind is not Kind.ACTIVATION or topo.producer[t] != k:
        return False
    if t in topo.output_storages or t in written:
        return False
    for v in aliases.get(t, ()):
        p = topo.producer[v]
        if p < 0 or p >= split:
            continue  # an alias without an op is redefined; a late view op reads the recompute
        view_op = graph.ops[p]
        pure = not view_op.in_place and all(graph.tensors[o].alias_of is not None for o in topo.op_outputs[p])
        reads_other = any(s != t and not topo.is_static[s] for s in reads[p])
        if not pure or reads_other:
            return False
    return True


def storage_index(model: RematModel) -> dict[int, int]:
    return {s: j for j, s in enumerate(model.storage_tensor)}

"""remat(graph, policy) -> RematResult: recompute activations instead of keeping them.

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

Policies (``POLICIES``):

``none``
    the graph unchanged.
``mirror``
    MXNet's mirror plan (``make_mirror_plan`` of its memory-cost example).  Forward
    ops are grouped into stages: ``Op.stage`` where the graph marks any (unmarked
    ops are then recomputed whenever possible, as MXNet mirrors every unmarked node;
    the mark ``"True"`` starts a stage of its own at every op), else the op's module
    up to its first numeric component (``layers.3.attn.qkv`` -> ``layers.3``) or
    its first component (``mid.conv1`` -> ``mid``), else the op's own name.  Walk
    the forward ops in order adding each op's output bytes to ``local``; at the first
    op of each stage, if ``local > threshold`` the stage is *kept* (a checkpoint:
    its activations are stored; ``local`` restarts at 0 and the kept stage's later
    ops count towards the next stretch), otherwise the whole stage is *recomputed*.
    So ``threshold`` bounds the bytes of a recomputed stretch: 0 keeps every stage
    that follows any bytes (nothing is recomputed), a huge threshold recomputes every
    stage.
    ``threshold=None`` runs MXNet's threshold search (``mirror_search``).
``sqrt``
    Chen et al.'s sqrt(n) checkpoints: the ``n`` forward ops that make storage are
    cut into ``round(sqrt(n))`` segments of about equal output bytes; the last op of
    each segment is kept, the others are recomputed.
``budget``
    fit ``budget`` bytes (an ``int``, or a ``float`` fraction of the no-remat peak,
    ``static + LOAD`` of the as-given order) with the least added op cost.  The
    heuristic is a greedy over *moves*: a candidate alone, or with its chain (the
    producers of the inputs its recompute would keep alive, level by level, as in
    Chen's segments: recomputing one link of a chain of equal-sized tensors frees
    nothing, the whole segment frees all but its head).  Rank the moves by the
    bytes they free at the steps over budget per unit of cost, simulate the best
    few, add the one that removes the most excess per unit cost, repeat until the
    graph fits, then drop every recompute the fit does not need, dearest first.
    It runs from nothing (over chains, and over single candidates) and from each
    of the few moves that alone free the most bytes, keeps the cheapest fit, and
    improves it by local search (drop one of the dearest recomputes, ban it,
    refill greedily, while that gets cheaper).  The exact solver is a MILP
    (``mpplan.passes.remat_ilp``) over the same memory model, warm-started with the
    heuristic's answer, under a time limit; it reports its best bound and gap.
    ``solver="auto"`` is exact on graphs of up to ``EXACT_MAX_OPS`` ops when a MILP
    backend (``highspy``, else scipy's HiGHS) is installed, and the heuristic
    otherwise (with a logged note when the backend is missing).

All memory accounting is of the rewritten graph in its own as-given order, the
order ``sim`` scores: ``peak = static + LOAD``.  A budget under the smallest peak any
choice of recomputes reaches raises ``InfeasibleError`` naming that smallest
feasible budget in bytes (proved minimal by the MILP when one is installed).

Example: a three-layer training chain.  ``a`` waits through the whole backward of
``B`` and ``C``; recomputing it right before ``B``'s backward lowers the peak by 100
bytes for one op's cost.

>>> from mpplan.graph import Graph, Kind, Op, Tensor
>>> acts = [Tensor(t, 100) for t in "abc"] + [Tensor("l", 1)]
>>> grads = [Tensor(g, 100, Kind.GRAD) for g in ("gc", "gb", "ga")] + [Tensor("gx", 8, Kind.GRAD)]
>>> forward = [Op("A", "f", ("x",), ("a",), 1.0), Op("B", "f", ("a",), ("b",), 1.0),
...            Op("C", "f", ("b",), ("c",), 1.0), Op("L", "loss", ("c",), ("l",), 1.0)]
>>> backward = [Op("L.bw", "g", ("l", "c"), ("gc",), 1.0, backward_of="L"),
...             Op("C.bw", "g", ("gc", "b"), ("gb",), 1.0, backward_of="C"),
...             Op("B.bw", "g", ("gb", "a"), ("ga",), 1.0, backward_of="B"),
...             Op("A.bw", "g", ("ga", "x"), ("gx",), 1.0, backward_of="A")]
>>> g = Graph("mlp", (Tensor("x", 8, Kind.INPUT), *acts, *grads), (*forward, *backward), ("l", "gx"))
>>> r = remat(g, "budget", budget=350)
>>> r.baseline_peak_bytes, r.peak_bytes, r.recomputed, r.recompute_ops
(409, 309, ('a',), ('A@recompute',))
>>> [op.name for op in r.graph.ops][5:]
['C.bw', 'A@recompute', 'B.bw', 'A.bw']
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import operator
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from mpplan import sim
from mpplan.errors import ConfigError, InfeasibleError
from mpplan.graph import Graph, Kind, Op, Tensor

__all__ = [
    "EXACT_MAX_OPS",
    "MIN_GAP",
    "POLICIES",
    "SOLVERS",
    "SUFFIX",
    "Evaluation",
    "MirrorPlan",
    "RematModel",
    "RematResult",
    "apply_recompute",
    "build_model",
    "evaluate",
    "min_feasible_budget",
    "mirror_plan",
    "mirror_search",
    "recomputable",
    "remat",
    "sqrt_checkpoints",
]

_log = logging.getLogger(__name__)

POLICIES = ("none", "mirror", "sqrt", "budget")
SOLVERS = ("auto", "heuristic", "exact")

#: ``solver="auto"`` uses the MILP on graphs of up to this many ops.
EXACT_MAX_OPS = 1000

#: Graphs without a backward pass: a tensor is recomputed only across a gap of at
#: least this many steps between two of its uses.
MIN_GAP = 2

#: A position after every op: "no such use".
NEVER = 1 << 62

#: Words in an op type that mark a random kernel (dropout, bernoulli, randn, ...).
RANDOM_KERNELS = ("bernoulli", "dropout", "rand", "normal", "uniform", "multinomial", "poisson", "exponential")

#: The greedy simulates its best-ranked candidates this many at a time, and at most
#: ``GREEDY_MAX_TRIES`` per step.
GREEDY_TRIES = 8
GREEDY_MAX_TRIES = 64

#: The greedy's chain moves (``_chain``): at most this many levels (the candidate
#: and its producers' levels above it), and this many candidates in one move.
CHAIN_LEVELS = 6
CHAIN_MAX_OPS = 8

#: The budget heuristic's extra greedy starts (module docstring).
HEURISTIC_SEEDS = 4

#: The budget heuristic's local search: rounds, and recomputes tried per round.
IMPROVE_ROUNDS = 8
IMPROVE_TRIES = 6

#: Suffix of recompute ops and their outputs.
SUFFIX = "@recompute"


# --- records -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RematResult:
    """What ``remat`` decided and the graph it made.

    ``graph`` is the rewritten graph (the input itself when nothing is recomputed);
    ``recomputed`` the original activations whose late readers now read a recompute,
    ``recompute_ops`` the ops added (recomputes and recreated views), in graph order.
    ``compute_overhead`` is the added op cost over the original graph's total op cost.
    ``peak_bytes`` is ``static + LOAD`` of the new graph's as-given order (``sim``),
    ``baseline_peak_bytes`` the same for the input graph; ``budget_bytes`` the
    budget resolved to bytes (``budget`` policy).  Solver fields: ``solver`` names
    what decided (``rule`` for none/mirror/sqrt, ``heuristic``, ``highs`` or
    ``scipy-highs``), ``optimal`` whether the added cost is proved least, ``bound``
    a proved lower bound on the added cost and ``gap`` = (cost - bound) / cost
    (``None`` when nothing bounds it), ``seconds`` the time taken, ``note`` why a
    solver was not used or stopped early.
    """

    graph: Graph
    policy: str
    recomputed: tuple[str, ...]
    recompute_ops: tuple[str, ...]
    added_cost: float
    compute_overhead: float
    peak_bytes: int
    baseline_peak_bytes: int
    budget_bytes: int | None = None
    threshold: int | None = None
    solver: str = "rule"
    optimal: bool = False
    bound: float | None = None
    gap: float | None = None
    seconds: float = 0.0
    note: str = ""

    def plan_records(self) -> tuple[dict[str, Any], ...]:
        """One record per recomputed tensor, for ``Plan.remat``: the tensor, the op that
        made it, the recompute op and tensor that replace it late, and its bytes."""
        graph = self.graph
        records = []
        for op in graph.ops:
            if op.recompute_of is None or graph.tensor(op.outputs[0]).alias_of is not None:
                continue
            original = graph.op(op.recompute_of)
            for old, new in zip(original.outputs, op.outputs):
                records.append(
                    {
                        "tensor": old,
                        "op": original.name,
                        "recompute_op": op.name,
                        "recompute_tensor": new,
                        "bytes": graph.tensor(new).nbytes,
                    }
                )
        return tuple(records)


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
        index = _storage_index(self)
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


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The recomputes a choice really makes, where they run, and the peak they give.

    ``chosen``: the effective candidates (those some late use needs), ascending;
    ``anchor``: candidate -> the original op its recompute runs before; ``load``:
    LOAD of the rewritten as-given order; ``profile``: live dynamic bytes per step
    of that order, not counting recreated views (they change no step's load);
    ``orig_step``: the step of each original op in it.
    """

    chosen: tuple[int, ...]
    anchor: dict[int, int]
    load: int
    peak: int
    profile: tuple[int, ...]
    orig_step: tuple[int, ...]
    cost: float


@dataclass(frozen=True, slots=True)
class MirrorPlan:
    """MXNet's plan at one threshold: ops to recompute, the largest recomputed stretch
    (``max_size``, MXNet's ``plan_info['max_size']``) and the kept bytes (``save_size``)."""

    threshold: int
    recompute: tuple[str, ...]
    max_size: int
    save_size: int


# --- the entry point -----------------------------------------------------------------


def remat(
    graph: Graph,
    policy: str,
    *,
    threshold: int | None = None,
    budget: float | str | None = None,
    solver: str = "auto",
    time_limit_s: float = 60.0,
) -> RematResult:
    """Rewrite ``graph`` with the recomputes ``policy`` chooses (module docstring).

    ``threshold`` (bytes) steers ``mirror`` (``None``: MXNet's threshold search);
    ``budget`` (bytes, a fraction in (0, 1] of the no-remat peak, or a size string
    such as ``"16GiB"``) is what ``budget`` fits; ``solver`` is ``auto``,
    ``heuristic`` or ``exact``; ``time_limit_s`` caps the budget search: the exact
    solver, and the heuristic's extra starts and local search (its first greedy
    pass always runs to the end).  Raises ``ConfigError`` for a bad argument and ``InfeasibleError``
    when no choice of recomputes fits the budget.
    """
    clock = time.perf_counter()
    if policy not in POLICIES:
        raise ConfigError(f"remat policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    if solver not in SOLVERS:
        raise ConfigError(f"remat solver: expected one of {', '.join(SOLVERS)}, got {solver!r}")
    if not time_limit_s > 0:
        raise ConfigError(f"remat time_limit_s: expected a positive number of seconds, got {time_limit_s!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0):
        raise ConfigError(f"remat threshold: expected a non-negative number of bytes, got {threshold!r}")
    baseline = sim.static_bytes(graph) + sim.order_load(graph, range(len(graph.ops)))
    if policy == "none":
        return _unchanged(graph, policy, baseline, clock)
    model = build_model(graph)
    if policy == "mirror":
        if threshold is None:
            threshold, _ = mirror_search(graph, model=model)
        plan = mirror_plan(graph, threshold, model=model)
        chosen = _indices(model, plan.recompute)
        return _result(model, policy, chosen, baseline, clock, threshold=threshold)
    if policy == "sqrt":
        chosen = _indices(model, sqrt_checkpoints(graph, model=model))
        return _result(model, policy, chosen, baseline, clock)
    if budget is None:
        raise ConfigError("remat budget: the budget policy needs bytes (16GiB) or a fraction (0.8) of the peak")
    limit = _resolve_budget(budget, baseline)
    return _fit_budget(model, limit, baseline, solver, time_limit_s, clock)


def _resolve_budget(budget: float | str, baseline: int) -> int:
    """Bytes of a budget given as bytes, a size string or a fraction of ``baseline``."""
    if isinstance(budget, str):
        from mpplan.config import parse_budget

        try:
            budget = parse_budget(budget)
        except ValueError as exc:
            raise ConfigError(f"remat budget: {exc}") from None
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise ConfigError(f"remat budget: expected bytes or a fraction in (0, 1], got {budget!r}")
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ConfigError(f"remat budget: a fraction must lie in (0, 1], got {budget}")
        return int(budget * baseline)
    if budget <= 0:
        raise ConfigError(f"remat budget: expected a positive number of bytes, got {budget}")
    return budget


# --- the memory model ----------------------------------------------------------------


def build_model(graph: Graph) -> RematModel:
    """The ``RematModel`` of ``graph``: which ops are recomputable, and every dynamic
    storage's uses split into early and late (module docstring)."""
    topo = graph.topology
    ops, tensors = graph.ops, graph.tensors
    n = topo.num_ops
    boundary = next((k for k, op in enumerate(ops) if op.backward_of is not None), n)
    training = boundary < n
    storage_of = topo.storage_of

    uses: dict[int, list[int]] = {}
    for k, storages in enumerate(topo.op_storages):
        for s in storages:
            uses.setdefault(s, []).append(k)
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
    split = [_split(uses[s], boundary, training) for s in dynamic]
    last = [n - 1 if s in topo.output_storages else uses[s][-1] for s in dynamic]

    # Candidates, last op first: an op's consumers decide how late it may be recomputed.
    cand_of_op: dict[int, int] = {}  # op -> provisional id (reverse order)
    found: list[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int]] = []
    max_anchor: list[int] = []
    for k in reversed(range(boundary if training else n)):
        op = ops[k]
        if op.backward_of is not None or op.recompute_of is not None or not topo.op_outputs[k] or is_random(op):
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


def _storage_index(model: RematModel) -> dict[int, int]:
    return {s: j for j, s in enumerate(model.storage_tensor)}


def evaluate(model: RematModel, chosen: Iterable[int]) -> Evaluation:
    """Where the recomputes of candidates ``chosen`` run and the LOAD they give.

    A candidate no late use needs (directly or through chosen consumers) is dropped.
    This is the fast twin of ``sim.order_load`` on ``apply_recompute``'s graph (the
    tests hold them equal); the searches score with it, results come from ``sim``.
    """
    wanted = set(chosen)
    anchor: dict[int, int] = {}
    first_late, consumers = model.cand_first_late, model.cand_consumers
    for i in sorted(wanted, reverse=True):
        a = first_late[i]
        for c in consumers[i]:
            if c in anchor and anchor[c] < a:
                a = anchor[c]
        if a < NEVER:
            anchor[i] = a
    effective = tuple(sorted(anchor))
    n = model.num_ops
    count = [0] * n
    for i in effective:
        count[anchor[i]] += 1
    orig_step = list(map(operator.add, range(n), itertools.accumulate(count)))
    step_of: dict[int, int] = {}
    seen = [0] * n
    for i in effective:  # ascending = forward order within an anchor
        p = anchor[i]
        step_of[i] = orig_step[p] - count[p] + seen[p]
        seen[p] += 1
    steps = n + len(effective)
    delta = [0] * (steps + 1)
    size, start, last, producer = model.size, model.start, model.last, model.producer
    for j, nbytes in enumerate(size):
        if not nbytes:
            continue
        p = producer[j]
        if p >= 0 and p in anchor:
            delta[orig_step[start[j]]] += nbytes
            delta[orig_step[model.early_last[j]] + 1] -= nbytes
            first = step_of[p]
            end = orig_step[model.late_last[j]] if model.late_last[j] >= 0 else first
            for h in model.readers[j]:
                if h in step_of and step_of[h] > end:
                    end = step_of[h]
            delta[first] += nbytes
            delta[max(end, first) + 1] -= nbytes
        else:
            end = orig_step[last[j]]
            for h in model.readers[j]:
                if h in step_of and step_of[h] > end:
                    end = step_of[h]
            delta[orig_step[start[j]]] += nbytes
            delta[end + 1] -= nbytes
    delta.pop()
    profile = list(itertools.accumulate(delta))
    load = max(profile, default=0)
    cost = sum(model.cand_cost[i] for i in effective)
    return Evaluation(effective, anchor, load, model.static_bytes + load, tuple(profile), tuple(orig_step), cost)


# --- the rewrite ---------------------------------------------------------------------


def recomputable(graph: Graph) -> tuple[str, ...]:
    """Names of the ops ``remat`` may recompute, in graph order."""
    return build_model(graph).candidate_names()


def apply_recompute(graph: Graph, ops: Iterable[str]) -> Graph:
    """``graph`` with the ops named in ``ops`` recomputed before their late readers.

    Names that are not recomputable (``recomputable``) raise ``ConfigError``; ops no
    late use needs are left alone.
    """
    model = build_model(graph)
    return _rewrite(model, evaluate(model, _indices(model, ops)))[0]


def _indices(model: RematModel, names: Iterable[str]) -> list[int]:
    index = {model.graph.ops[k].name: i for i, k in enumerate(model.cand_op)}
    chosen = []
    for name in names:
        if name not in index:
            raise ConfigError(f"remat: op {name!r} is not recomputable; see mpplan.passes.remat.recomputable")
        chosen.append(index[name])
    return chosen


def _rewrite(model: RematModel, ev: Evaluation) -> tuple[Graph, tuple[str, ...], float]:
    """The rewritten graph, the names of the ops added, and their total cost."""
    graph = model.graph
    if not ev.chosen:
        return graph, (), 0.0
    topo = graph.topology
    tensors, ops = graph.tensors, graph.ops
    storage_of, producer = topo.storage_of, topo.producer
    index = _storage_index(model)
    recomputed = {model.storage_tensor[j] for i in ev.chosen for j in model.cand_outputs[i]}
    taken_tensors = {t.name for t in tensors}
    taken_ops = {o.name for o in ops}
    late: dict[int, str] = {}  # tensor id -> the name late readers use
    new_tensors: list[Tensor] = []
    redefined: dict[int, Tensor] = {}
    out: list[Op] = []
    added: list[str] = []
    added_cost = 0.0

    def fresh(base: str, taken: set[str]) -> str:
        name, k = base + SUFFIX, 1
        while name in taken:  # only when the input graph already uses the name
            k += 1
            name = f"{base}{SUFFIX}{k}"
        taken.add(name)
        return name

    def late_split(t: int) -> int:
        return model.split[index[storage_of[t]]]

    def late_name(t: int) -> str:
        """The tensor a late reader of ``t`` reads, making a recreated view if needed."""
        if storage_of[t] not in recomputed:
            return tensors[t].name
        if t in late:
            return late[t]
        tensor = tensors[t]
        assert tensor.alias_of is not None, f"{tensor.name}: read late before its recompute"
        p = producer[t]
        if p >= late_split(t):
            return tensor.name  # a view made late: redefined on the recomputed base
        if p < 0:
            base = late_name(topo.tensor_index[tensor.alias_of])
            late[t] = fresh(tensor.name, taken_tensors)
            new_tensors.append(_copy_tensor(tensor, late[t], alias_of=base))
            return late[t]
        emit_recompute(ops[p])  # a view op made early: repeat it on the recomputed base
        return late[t]

    def emit_recompute(op: Op) -> None:
        nonlocal added_cost
        inputs = tuple(late_name(topo.tensor_index[name]) for name in op.inputs)
        outputs = []
        for name in op.outputs:
            t = topo.tensor_index[name]
            tensor = tensors[t]
            late[t] = fresh(name, taken_tensors)
            alias = None if tensor.alias_of is None else late_name(topo.tensor_index[tensor.alias_of])
            new_tensors.append(_copy_tensor(tensor, late[t], alias_of=alias))
            outputs.append(late[t])
        name = fresh(op.name, taken_ops)
        out.append(Op(name, op.type, inputs, tuple(outputs), op.cost, op.device, None, op.module, None, op.name))
        added.append(name)
        added_cost += op.cost

    anchored: dict[int, list[int]] = {}
    for i in ev.chosen:
        anchored.setdefault(ev.anchor[i], []).append(i)
    for k, op in enumerate(ops):
        for i in anchored.get(k, ()):
            emit_recompute(ops[model.cand_op[i]])
        inputs = tuple(
            late_name(t) if storage_of[t] in recomputed and k >= late_split(t) else tensors[t].name
            for t in (topo.tensor_index[name] for name in op.inputs)
        )
        for name in op.outputs:
            t = topo.tensor_index[name]
            base = tensors[t].alias_of
            if base is not None and storage_of[t] in recomputed and k >= late_split(t) and t not in redefined:
                redefined[t] = _copy_tensor(tensors[t], name, alias_of=late_name(topo.tensor_index[base]))
        out.append(op if inputs == op.inputs else _with_inputs(op, inputs))
    all_tensors = tuple(redefined.get(t, tensor) for t, tensor in enumerate(tensors)) + tuple(new_tensors)
    return Graph(graph.name, all_tensors, tuple(out), graph.outputs), tuple(added), added_cost


def _copy_tensor(tensor: Tensor, name: str, *, alias_of: str | None) -> Tensor:
    return Tensor(name, tensor.nbytes, tensor.kind, tensor.shape, tensor.dtype, alias_of, tensor.grad_of)


def _with_inputs(op: Op, inputs: tuple[str, ...]) -> Op:
    return Op(op.name, op.type, inputs, op.outputs, op.cost, op.device, op.backward_of, op.module, op.stage,
              op.recompute_of)


def _result(
    model: RematModel,
    policy: str,
    chosen: Iterable[int],
    baseline: int,
    clock: float,
    **fields: Any,
) -> RematResult:
    """Rewrite for ``chosen`` and measure the new graph with ``sim``."""
    ev = evaluate(model, chosen)
    graph, added, added_cost = _rewrite(model, ev)
    peak = sim.static_bytes(graph) + sim.order_load(graph, range(len(graph.ops))) if ev.chosen else baseline
    total = sum(op.cost for op in model.graph.ops)
    names = tuple(
        model.graph.tensors[model.storage_tensor[j]].name for i in ev.chosen for j in model.cand_outputs[i]
    )
    return RematResult(
        graph=graph,
        policy=policy,
        recomputed=names,
        recompute_ops=added,
        added_cost=added_cost,
        compute_overhead=added_cost / total if total > 0 else 0.0,
        peak_bytes=peak,
        baseline_peak_bytes=baseline,
        seconds=round(time.perf_counter() - clock, 6),
        **fields,
    )


def _unchanged(graph: Graph, policy: str, baseline: int, clock: float, **fields: Any) -> RematResult:
    return RematResult(
        graph=graph,
        policy=policy,
        recomputed=(),
        recompute_ops=(),
        added_cost=0.0,
        compute_overhead=0.0,
        peak_bytes=baseline,
        baseline_peak_bytes=baseline,
        seconds=round(time.perf_counter() - clock, 6),
        **fields,
    )


# --- mirror and sqrt -----------------------------------------------------------------


def _forward_ops(model: RematModel) -> list[int]:
    """The ops the rules walk: before the backward line (every op without one)."""
    ops = model.graph.ops
    return [k for k in range(model.boundary) if ops[k].recompute_of is None and ops[k].backward_of is None]


def _made_bytes(graph: Graph, k: int) -> int:
    """Bytes of the new storage op ``k`` makes (views and in-place outputs make none)."""
    topo = graph.topology
    return sum(topo.nbytes[t] for t in topo.op_outputs[k] if topo.storage_of[t] == t and topo.producer[t] == k)


def _stage_key(op: Op, marked: bool) -> str | None:
    """The mirror stage of ``op`` (module docstring); ``None``: unmarked in a marked graph."""
    if marked:
        return op.stage
    if op.module:
        parts = op.module.split(".")
        for i, part in enumerate(parts):
            if part.isdigit():
                return ".".join(parts[: i + 1])
        return parts[0]
    return op.name


def mirror_plan(graph: Graph, threshold: int, *, model: RematModel | None = None) -> MirrorPlan:
    """MXNet's ``make_mirror_plan`` at ``threshold`` bytes (module docstring's rule)."""
    model = build_model(graph) if model is None else model
    ops = graph.ops
    forward = _forward_ops(model)
    marked = any(ops[k].stage is not None for k in forward)
    local = save = max_size = 0
    last_stage: str | None = None
    keep_stage = False
    recompute: list[str] = []
    candidates = set(model.cand_op)
    for k in forward:
        size = _made_bytes(graph, k)
        local += size
        stage = _stage_key(ops[k], marked)
        keep = False
        if stage is not None:
            if stage == "True" or stage != last_stage:
                if local > threshold:  # this stretch is long enough: checkpoint here
                    save += size
                    max_size = max(max_size, local)
                    local = 0
                    keep_stage = True
                    keep = True
                else:
                    keep_stage = False
                last_stage = stage
            elif keep_stage:
                save += size
                keep = True
        if not keep and k in candidates:
            recompute.append(ops[k].name)
    return MirrorPlan(threshold, tuple(recompute), max_size, save)


def mirror_thresholds(graph: Graph, *, ntrial: int = 6, model: RematModel | None = None) -> tuple[int, ...]:
    """The thresholds (bytes) MXNet's ``search_plan`` tries, in its order, without repeats.

    Three rounds from threshold 0, each guessing ``sqrt(save_size * max_size / 2)``
    from the last mirror plan; then ``ntrial`` evenly spaced thresholds between the
    smallest ``max_size`` seen and ``sqrt(2)`` times the last guess.  ``mpplan
    search`` measures them (``{generate: mxnet}`` on ``planner.remat.threshold``).
    """
    model = build_model(graph) if model is None else model
    tried = []
    threshold, min_threshold = 0, None
    for _ in range(3):
        tried.append(threshold)
        plan = mirror_plan(graph, threshold, model=model)
        if min_threshold is None or plan.max_size < min_threshold:
            min_threshold = plan.max_size
        threshold = int(math.sqrt(plan.save_size * plan.max_size / 2))
    assert min_threshold is not None
    step = int((threshold * math.sqrt(2) - min_threshold) / ntrial)
    if step > 0:
        tried += [min_threshold + step * (i + 1) for i in range(ntrial)]
    return tuple(dict.fromkeys(tried))


def mirror_search(graph: Graph, *, ntrial: int = 6, model: RematModel | None = None) -> tuple[int, int]:
    """MXNet's ``search_plan``: of the ``mirror_thresholds``, the one whose mirror plan has the least peak.

    Peaks are ``static + LOAD`` of each rewritten graph's as-given order; ties go to
    the least recompute cost, then the smaller threshold.  Returns ``(threshold, peak)``.
    """
    model = build_model(graph) if model is None else model
    history = []
    for threshold in mirror_thresholds(graph, ntrial=ntrial, model=model):
        ev = evaluate(model, _indices(model, mirror_plan(graph, threshold, model=model).recompute))
        history.append((ev.peak, ev.cost, threshold))
    peak, _, best = min(history)
    return best, peak


def sqrt_checkpoints(graph: Graph, *, model: RematModel | None = None) -> tuple[str, ...]:
    """Chen et al.'s sqrt(n) plan: the ops to recompute (module docstring)."""
    model = build_model(graph) if model is None else model
    makers = [k for k in _forward_ops(model) if _made_bytes(graph, k) > 0]
    if not makers:
        return ()
    segments = max(1, round(math.sqrt(len(makers))))
    total = sum(_made_bytes(graph, k) for k in makers)
    keep, done, cut = set(), 0, 1
    for pos, k in enumerate(makers):
        done += _made_bytes(graph, k)
        # The last op of a segment is kept: the segment ends where the bytes pass the next cut.
        if done * segments >= cut * total or pos == len(makers) - 1:
            keep.add(k)
            while done * segments >= cut * total:
                cut += 1
    candidates = set(model.cand_op)
    return tuple(graph.ops[k].name for k in makers if k not in keep and k in candidates)


# --- budget --------------------------------------------------------------------------


def _fit_budget(
    model: RematModel, limit: int, baseline: int, solver: str, time_limit_s: float, clock: float
) -> RematResult:
    """The ``budget`` policy: least added cost with ``peak <= limit``, within ``time_limit_s``."""
    fields: dict[str, Any] = {"budget_bytes": limit}
    if limit >= baseline:
        return _unchanged(model.graph, "budget", baseline, clock, solver="none", optimal=True, bound=0.0, gap=0.0,
                          note="the graph fits without recomputation", **fields)
    backend, note = _backend(solver, model)
    deadline = clock + time_limit_s
    lower = model.lower_bound()
    if limit < lower:
        _raise_infeasible(model, limit, backend, deadline, lower)
    dyn = limit - model.static_bytes
    # The heuristic may use a third of the time when a MILP follows, all of it otherwise.
    share = time_limit_s / 3 if backend is not None else time_limit_s
    greedy = _heuristic(model, dyn, clock + share)
    if backend is None:
        if greedy.load > dyn:
            _raise_infeasible(model, limit, None, deadline, lower, best=greedy)
        return _result(model, "budget", greedy.chosen, baseline, clock, solver="heuristic", note=note, **fields)
    from mpplan.passes import remat_ilp

    solution = remat_ilp.solve(
        model,
        dyn,
        time_limit_s=_remaining(deadline),
        warm_start=greedy.chosen if greedy.load <= dyn else None,
        backend=backend,
    )
    if solution.status == "infeasible":
        _raise_infeasible(model, limit, backend, deadline, lower, best=greedy)
    found = [greedy]
    if solution.chosen is not None:  # re-scored exactly: the MILP works to a tolerance
        found.append(_prune(model, evaluate(model, solution.chosen), dyn))
    fits = [ev for ev in found if ev.load <= dyn]
    if not fits:
        _raise_infeasible(model, limit, backend, deadline, lower, best=greedy)
    best = min(fits, key=lambda ev: (ev.cost, ev.load, ev.chosen))
    optimal = solution.status == "optimal" and found[-1].load <= dyn and solution.chosen is not None
    bound = best.cost if optimal else solution.bound
    if solution.status == "too_large":
        return _result(model, "budget", best.chosen, baseline, clock, solver="heuristic", note=solution.note, **fields)
    gap = None if bound is None else (0.0 if best.cost <= 0 else max(0.0, (best.cost - bound) / best.cost))
    return _result(
        model, "budget", best.chosen, baseline, clock, solver=solution.backend, optimal=optimal, bound=bound,
        gap=gap, note=solution.note, **fields,
    )


def _remaining(deadline: float) -> float:
    """Seconds left before ``deadline``; at least one, so a solver always gets a look."""
    return max(1.0, deadline - time.perf_counter())


def _backend(solver: str, model: RematModel) -> tuple[str | None, str]:
    """The MILP backend to use (``None``: the heuristic decides) and a note saying why not."""
    if solver == "heuristic":
        return None, ""
    from mpplan.passes import remat_ilp

    backend = remat_ilp.available_backend()
    if backend is None:
        note = "no MILP backend installed (pip install highspy): used the heuristic"
        _log.warning("remat: %s", note)
        return None, note
    if solver == "auto" and model.num_ops > EXACT_MAX_OPS:
        return None, f"{model.num_ops} ops > {EXACT_MAX_OPS}: used the heuristic"
    return backend, ""


def _greedy(
    model: RematModel,
    dyn_budget: int,
    start: Evaluation | None = None,
    *,
    prune: bool = True,
    banned: frozenset[int] = frozenset(),
    levels: int = CHAIN_LEVELS,
) -> Evaluation:
    """The budget heuristic (module docstring), from ``start`` (default: nothing recomputed).

    Each step simulates the ranked moves (``_rank``) in batches of ``GREEDY_TRIES``
    until a batch holds one that lowers the excess over the budget (at most
    ``GREEDY_MAX_TRIES`` per step), never choosing ``banned``; moves grow at most
    ``levels`` levels (1: single candidates).  If the budget cannot be met, the
    choice with the least LOAD met is returned.
    """
    current = evaluate(model, ()) if start is None else start
    best = current
    while current.load > dyn_budget:
        chosen = set(current.chosen)
        excess = _excess(current.profile, dyn_budget)
        moves = _rank(model, current, dyn_budget, levels=levels)
        ranked = [move for move in moves if banned.isdisjoint(move)][:GREEDY_MAX_TRIES]
        pick, pick_score = None, None
        for first in range(0, len(ranked), GREEDY_TRIES):
            for move in ranked[first : first + GREEDY_TRIES]:
                trial = evaluate(model, chosen.union(move))
                gain = excess - _excess(trial.profile, dyn_budget)
                if gain <= 0:
                    continue
                score = (gain / max(trial.cost - current.cost, 1e-9), -trial.load)
                if pick_score is None or score > pick_score:
                    pick, pick_score = trial, score
            if pick is not None:
                break
        if pick is None:
            break
        current = pick
        if (current.load, current.cost) < (best.load, best.cost):
            best = current
    if current.load > dyn_budget:
        return best
    return _prune(model, current, dyn_budget) if prune else current


def _heuristic(model: RematModel, dyn_budget: int, deadline: float = math.inf) -> Evaluation:
    """The cheapest fit of several greedy starts, improved by local search.

    Starts: nothing recomputed, greedy over chains and then over single candidates
    (chains reach lower peaks; where single recomputes suffice they tend to fit for
    less), and each of the ``HEURISTIC_SEEDS`` moves that alone free the most excess
    bytes (whatever their cost): the ratio-greedy alone takes cheap recomputes first
    and can then need a dear one where one mid-priced recompute plus a few cheap
    ones would fit.  If no start fits, the peak is lowered step by step
    (``_least_peak``), from the lowest start and from nothing, until it does.
    Past ``deadline`` only the first start runs to the end; the others and the
    local search are skipped.
    """
    empty = evaluate(model, ())
    excess = _excess(empty.profile, dyn_budget)
    seeds = []
    for move in _rank(model, empty, dyn_budget, per_cost=False)[: 2 * HEURISTIC_SEEDS]:
        trial = evaluate(model, move)
        seeds.append((_excess(trial.profile, dyn_budget) - excess, move, trial))
    starts = [(empty, CHAIN_LEVELS), (empty, 1)]
    starts += [(start, CHAIN_LEVELS) for _, _, start in sorted(seeds, key=lambda seed: seed[:2])[:HEURISTIC_SEEDS]]
    runs = []
    for start, levels in starts:
        if runs and time.perf_counter() > deadline:
            break
        runs.append(_greedy(model, dyn_budget, start, levels=levels))
    fits = [ev for ev in runs if ev.load <= dyn_budget]
    if not fits:
        lowest = min(runs, key=lambda ev: (ev.load, ev.cost))
        descents = (_least_peak(model, start, stop_at=dyn_budget) for start in (lowest, empty))
        lowered = min(descents, key=lambda ev: (ev.load, ev.cost))
        if lowered.load > dyn_budget:
            return lowered
        fits = [_prune(model, lowered, dyn_budget)]
    return _improve(model, min(fits, key=lambda ev: (ev.cost, ev.load, ev.chosen)), dyn_budget, deadline)


def _improve(model: RematModel, ev: Evaluation, dyn_budget: int, deadline: float = math.inf) -> Evaluation:
    """Local search on a fit: drop one of the ``IMPROVE_TRIES`` dearest recomputes, ban
    it, refill greedily; keep the first cheaper fit and repeat (``IMPROVE_ROUNDS`` at most).

    The greedy alone can take one dear recompute where several cheap ones together
    fit (none of them alone lowers the excess); this finds many of those.
    """
    if ev.load > dyn_budget:
        return ev
    for _ in range(IMPROVE_ROUNDS):
        better = None
        for i in sorted(ev.chosen, key=lambda i: (-model.cand_cost[i], i))[:IMPROVE_TRIES]:
            if time.perf_counter() > deadline:
                return ev
            start = evaluate(model, set(ev.chosen) - {i})
            trial = _greedy(model, dyn_budget, start, banned=frozenset({i}))
            if trial.load <= dyn_budget and trial.cost < ev.cost - 1e-9 * max(1.0, ev.cost):
                better = trial
                break
        if better is None:
            break
        ev = better
    return ev


def _least_peak(model: RematModel, start: Evaluation | None = None, *, stop_at: int = -1) -> Evaluation:
    """The greedy pushed down one peak at a time: the least LOAD it reaches (or the
    first at or under ``stop_at``)."""
    current = evaluate(model, ()) if start is None else start
    while current.load > stop_at:
        lower = _greedy(model, current.load - 1, current, prune=False)
        if lower.load >= current.load:
            break
        current = lower
    return current


def _excess(profile: Sequence[int], dyn_budget: int) -> int:
    """Live bytes over ``dyn_budget``, summed over the steps of ``profile``."""
    over = [v for v in profile if v > dyn_budget]
    return sum(over) - dyn_budget * len(over)


def _rank(
    model: RematModel, ev: Evaluation, dyn_budget: int, *, per_cost: bool = True, levels: int = CHAIN_LEVELS
) -> list[tuple[int, ...]]:
    """Moves of unchosen candidates (``_chain``, up to ``levels`` levels) by estimated
    over-budget bytes freed per unit cost (or in all, ``per_cost=False``), best first.

    A move frees its members' outputs from their last early use until their
    recomputes and keeps the kept inputs they read alive until then; both are
    counted over the steps now above the budget.
    """
    over = [0]
    for v in ev.profile:
        over.append(over[-1] + (1 if v > dyn_budget else 0))
    scores: dict[tuple[int, ...], float] = {}
    for i in range(model.num_candidates):
        if i in ev.anchor:
            continue
        for anchors, gain in _chain(model, ev, i, levels, over):
            move = tuple(sorted(anchors))
            if gain > 0 and move not in scores:
                cost = sum(model.cand_cost[c] for c in move)
                scores[move] = -gain / max(cost, 1e-9) if per_cost else -gain
    return sorted(scores, key=lambda move: (scores[move], move))


def _anchor_of(model: RematModel, ev: Evaluation, i: int) -> int:
    """Where candidate ``i``'s recompute would run if chosen now: before its first late
    use or before the earliest chosen recompute reading it (``NEVER``: not needed)."""
    at = model.cand_first_late[i]
    for c in model.cand_consumers[i]:
        if c in ev.anchor and ev.anchor[c] < at:
            at = ev.anchor[c]
    return at


def _chain(
    model: RematModel, ev: Evaluation, i: int, levels: int, over: Sequence[int]
) -> Iterable[tuple[dict[int, int], int]]:
    """The moves grown from candidate ``i``, as ({member: anchor}, estimated gain):
    ``i`` alone, then with each further level of producers of the inputs the members
    would keep alive.

    A member's input is kept alive by its recompute when it is not recomputed and
    its last use comes before the member's anchor; when that adds life at steps
    over the budget (``over``: prefix counts of those steps), its producer, when a
    candidate, joins the next level and runs right before that member (a chain).
    Growth stops at ``levels`` levels, at ``CHAIN_MAX_OPS`` members, or when no
    input is kept alive over the budget.  The gain is over-budget byte-steps freed:
    the members' outputs between their last early use and their recompute, less
    the kept inputs' extra life until the latest recompute reading them; it is
    updated member by member, so a chain costs what its members read.
    """
    at = _anchor_of(model, ev, i)
    if at >= NEVER:
        return
    step, size = ev.orig_step, model.size
    anchors: dict[int, int] = {}
    extended: dict[int, int] = {}  # kept input -> the latest recompute step reading it
    gain = 0

    def kept_cost(j: int) -> int:
        return size[j] * _over_between(over, step[model.last[j]], extended[j])

    def add(member: int, at: int) -> None:
        nonlocal gain
        anchors[member] = at
        for j in model.cand_outputs[member]:
            gain += size[j] * _over_between(over, step[model.early_last[j]], step[at])
            if j in extended:
                gain += kept_cost(j)
                del extended[j]
        for j in model.cand_inputs[member]:
            p = model.producer[j]
            if p in anchors or p in ev.anchor or extended.get(j, -1) >= step[at]:
                continue
            if j in extended:
                gain += kept_cost(j)
            extended[j] = step[at]
            gain -= kept_cost(j)

    add(i, at)
    frontier = [i]
    for _ in range(levels - 1):
        yield dict(anchors), gain
        grown: dict[int, int] = {}
        for member in frontier:
            at = anchors[member]
            for j in model.cand_inputs[member]:
                p = model.producer[j]
                if p < 0 or p in ev.anchor or p in anchors or _over_between(over, step[model.last[j]], step[at]) == 0:
                    continue
                grown[p] = min(grown.get(p, NEVER), at, _anchor_of(model, ev, p))
        if not grown or len(anchors) + len(grown) > CHAIN_MAX_OPS:
            return
        for p, at in grown.items():
            add(p, at)
        frontier = list(grown)
    yield anchors, gain


def _over_between(over: Sequence[int], a: int, b: int) -> int:
    """Steps over the budget strictly between steps ``a`` and ``b`` (``over``: their prefix counts)."""
    return over[b] - over[a + 1] if b > a + 1 else 0


def _prune(model: RematModel, ev: Evaluation, dyn_budget: int) -> Evaluation:
    """Drop the recomputes a fit does not need, dearest first."""
    if ev.load > dyn_budget:
        return ev
    for i in sorted(ev.chosen, key=lambda i: (-model.cand_cost[i], -i)):
        if i not in ev.anchor:
            continue
        trial = evaluate(model, set(ev.chosen) - {i})
        if trial.load <= dyn_budget:
            ev = trial
    return ev


def min_feasible_budget(
    graph: Graph, *, solver: str = "auto", time_limit_s: float = 60.0, model: RematModel | None = None
) -> tuple[int, bool]:
    """The smallest peak (bytes) any choice of recomputes gives, and whether it is proved.

    Exact (the MILP minimising the peak) when a backend is installed and ``solver``
    allows it; otherwise the greedy's least peak, an upper bound (proved only when it
    meets ``RematModel.lower_bound``).
    """
    if solver not in SOLVERS:
        raise ConfigError(f"remat solver: expected one of {', '.join(SOLVERS)}, got {solver!r}")
    model = build_model(graph) if model is None else model
    found, proved = _min_peak(model, _backend(solver, model)[0], time.perf_counter() + time_limit_s, model.lower_bound())
    return found.peak, proved


def _min_peak(
    model: RematModel, backend: str | None, deadline: float, lower: int, best: Evaluation | None = None
) -> tuple[Evaluation, bool]:
    """The least-peak choice found and whether it is proved least.

    The greedy lowers the peak from ``best`` (or nothing) one byte at a time, and
    also from its run aimed straight at ``lower``: pushed one byte at a time it can
    take recomputes that lower the excess but leave the peak where it is, and stall.
    """
    aimed = _greedy(model, lower - model.static_bytes, prune=False)
    found = min(_least_peak(model, best), _least_peak(model, aimed), key=lambda ev: (ev.load, ev.cost))
    if best is not None and best.load < found.load:
        found = best
    if backend is not None and found.peak > lower:
        from mpplan.passes import remat_ilp

        solution = remat_ilp.solve(model, None, time_limit_s=_remaining(deadline), warm_start=found.chosen,
                                   backend=backend)
        if solution.chosen is not None:
            ev = evaluate(model, solution.chosen)
            if ev.load < found.load:
                found = ev
        if solution.status == "optimal":
            return found, True
    return found, found.peak <= lower


def _raise_infeasible(
    model: RematModel, limit: int, backend: str | None, deadline: float, lower: int, best: Evaluation | None = None
) -> None:
    found, proved = _min_peak(model, backend, deadline, lower, best)
    what = "the smallest feasible budget is" if proved else "the smallest budget found feasible is"
    raise InfeasibleError(
        f"graph {model.graph.name!r}: remat budget {limit} bytes is infeasible: {what} {found.peak} bytes "
        f"(static {model.static_bytes} bytes; no choice of recomputes goes under {lower} bytes); "
        "raise the budget or the device capacity",
        missing_bytes=max(0, found.peak - limit),
    )

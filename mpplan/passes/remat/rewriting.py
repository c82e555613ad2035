"""Build the rewritten graph of a choice of recomputes (the rules are
``mpplan.passes.remat.model``'s): recompute ops, recreated views, late readers re-pointed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mpplan.errors import ConfigError
from mpplan.graph import Graph, Op, Tensor
from mpplan.passes.remat.evaluation import Evaluation, evaluate
from mpplan.passes.remat.model import NEVER, SUFFIX, RematModel, build_model, storage_index

__all__ = ["RECOMPUTES_ONLY", "apply_recompute", "candidate_indices", "cut_name", "cut_positions", "recomputable",
           "repeated_op", "rewrite"]

#: The cut point (``from_op``) past every op: only recomputes read the recompute (a chain link).
RECOMPUTES_ONLY = "@recomputes"


def recomputable(graph: Graph) -> tuple[str, ...]:
    """Names of the ops ``remat`` may recompute, in graph order."""
    return build_model(graph).candidate_names()


def apply_recompute(graph: Graph, ops: Iterable[str], from_ops: Mapping[str, str] | None = None) -> Graph:
    """``graph`` with the ops named in ``ops`` recomputed before their late readers.

    Names of ops of ``graph`` are recomputed first; a name of a recompute op that round
    made (``F@recompute``) is then recomputed again, in a round of its own on the
    rewritten graph (several recomputes of one tensor), and so on.  ``from_ops`` maps a
    tensor a round recomputes to the op of that round's graph its late region starts at
    (``cut_positions``; ``RECOMPUTES_ONLY``: only recomputes of the round read its
    recompute); other tensors split where the model's rule says.  Names that
    are not recomputable in their round raise ``ConfigError``; ops no late use needs are
    left alone.
    """
    remaining = list(dict.fromkeys(ops))
    from_ops = from_ops or {}
    first = True
    while remaining:
        present = {op.name for op in graph.ops}
        now = [name for name in remaining if name in present]
        if not now:
            raise ConfigError(f"remat: op {remaining[0]!r} is not recomputable; see mpplan.passes.remat.recomputable")
        cuts = cut_positions(graph, now, from_ops)
        model = build_model(graph, cuts=cuts) if first else build_model(graph, only=frozenset(now), cuts=cuts)
        graph = rewrite(model, evaluate(model, candidate_indices(model, now)))[0]
        remaining = [name for name in remaining if name not in present]
        first = False
    return graph


def cut_positions(graph: Graph, ops: Iterable[str], from_ops: Mapping[str, str]) -> dict[int, int]:
    """Tensor id -> position of its ``from_ops`` op, for the outputs of the ops named in
    ``ops`` (``NEVER`` for ``RECOMPUTES_ONLY``); ``ConfigError`` when that op is not in
    ``graph`` or does not read the tensor after its producer (a late region starts at a use)."""
    topo = graph.topology
    cuts: dict[int, int] = {}
    for name in ops:
        k = topo.op_index[name]
        for out in graph.ops[k].outputs:
            start = from_ops.get(out)
            if start is None:
                continue
            t = topo.tensor_index[out]
            at = NEVER if start == RECOMPUTES_ONLY else topo.op_index.get(start, -1)
            if at < NEVER and (at <= k or topo.storage_of[t] not in {topo.storage_of[u] for u in topo.op_inputs[at]}):
                raise ConfigError(f"remat: tensor {out!r}: from_op {start!r} is no later reader of it")
            cuts[topo.storage_of[t]] = at
    return cuts


def cut_name(graph: Graph, at: int) -> str:
    """``cut_positions``' inverse for one cut: the name of op ``at``, ``RECOMPUTES_ONLY`` for ``NEVER``."""
    return RECOMPUTES_ONLY if at == NEVER else graph.ops[at].name


def repeated_op(name: str) -> str:
    """The op a recompute op named ``name`` repeats in its round (``F`` for ``F@recompute``
    and ``F@recompute2``, ``F@recompute`` for ``F@recompute@recompute``)."""
    return name.rsplit(SUFFIX, 1)[0]


def candidate_indices(model: RematModel, names: Iterable[str]) -> list[int]:
    """The candidate indices of the ops named in ``names``; ``ConfigError`` for one that
    is not recomputable."""
    index = {model.graph.ops[k].name: i for i, k in enumerate(model.cand_op)}
    chosen = []
    for name in names:
        if name not in index:
            raise ConfigError(f"remat: op {name!r} is not recomputable; see mpplan.passes.remat.recomputable")
        chosen.append(index[name])
    return chosen


def rewrite(model: RematModel, ev: Evaluation) -> tuple[Graph, tuple[str, ...], float]:
    """The graph with ``ev``'s recomputes (module docstring), the names of the ops
    added, and their total cost; the graph itself when nothing is recomputed."""
    graph = model.graph
    if not ev.chosen:
        return graph, (), 0.0
    topo = graph.topology
    tensors, ops = graph.tensors, graph.ops
    storage_of, producer = topo.storage_of, topo.producer
    index = storage_index(model)
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
        root = op.recompute_of or op.name  # the captured op it repeats, whatever the round
        out.append(Op(name, op.type, inputs, tuple(outputs), op.cost, op.device, None, op.module, None, root))
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

"""What ``apply`` holds: the plan's graph as eager autograd and ``torch.optim`` run it in a user's loop.

``evaluate`` runs the plan's own schedule with its own frees; in a user's loop the
memory is eager PyTorch's, so ``apply`` is held to a different graph, built here
and scored by the one peak simulator (``mpplan.sim``) in its as-given order, which
is the order eager runs it: the forward, then autograd's backward in the order the
capture recorded, then the optimizer.

* **Gradients** are dynamic (``with_dynamic_grads``): backward makes ``.grad``
  after ``zero_grad(set_to_none=True)`` and it lives to the end of the step.
* **Recompute**: the recomputes ``apply`` honours (``RecomputePolicy``) are put back
  in with ``apply_recompute``, right before their first late reader: the backward
  node that unpacks the saved tensor recomputes it then (``mpplan.runtime.recompute``).
* **Saved tensors live to the end of their backward node**: autograd unpacks a
  node's saved tensors (and recomputes) when the node starts and releases them when
  it ends, so a forward tensor a backward op reads is held to the last op of the
  node that op runs in (the ops sharing its ``backward_of``), not freed after its
  own last reader: ``mm``'s backward keeps its saved input while it computes the
  second of its two gradients.
* **The optimizer** is the one ``torch.optim`` really runs, not the capture's
  capturable single-tensor update.  ``torch.optim.Adam`` on CPU runs its
  single-tensor loop, where ``denom = (exp_avg_sq.sqrt() / bc2).add_(eps)`` holds two
  parameter-sized temporaries at once; on CUDA its ``foreach`` path takes
  ``_foreach_sqrt`` of every ``exp_avg_sq`` at once, one temporary per parameter,
  all live together.  SGD without momentum updates in place.  Adam's per-parameter
  ``step`` counters (4-byte host scalars) are not modelled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from mpplan import sim
from mpplan.capture.torch_capture import CapturedProgram, SourceRole
from mpplan.graph import Graph, Kind, Op, Tensor, with_dynamic_grads
from mpplan.passes.remat import apply_recompute

__all__ = ["OPTIMIZER_PATHS", "ApplyPrediction", "apply_memory_graph", "predict_apply"]

#: How ``torch.optim`` runs the update: ``single`` (per-parameter loop, CPU's default) or
#: ``foreach`` (one kernel over all parameters, CUDA's default).
OPTIMIZER_PATHS = ("single", "foreach")


@dataclass(frozen=True, slots=True)
class ApplyPrediction:
    """The peak ``apply`` is predicted to hold in a user's loop, and its parts.

    ``peak_bytes = static_bytes + load_bytes`` (``sim``) over ``graph``;
    ``recompute_ops`` are the forward ops recomputed, ``optimizer_path`` the
    ``torch.optim`` path modelled.
    """

    peak_bytes: int
    static_bytes: int
    load_bytes: int
    recompute_ops: tuple[str, ...]
    optimizer_path: str
    graph: Graph


def predict_apply(
    program: CapturedProgram, recompute_ops: Iterable[str] = (), *, optimizer_path: str = "single"
) -> ApplyPrediction:
    """Predict ``apply``'s peak for ``program`` with ``recompute_ops`` recomputed (module docstring)."""
    ops = tuple(recompute_ops)
    graph = apply_memory_graph(program, ops, optimizer_path=optimizer_path)
    static = sim.static_bytes(graph)
    load = sim.order_load(graph, range(len(graph.ops)))
    return ApplyPrediction(static + load, static, load, ops, optimizer_path, graph)


def apply_memory_graph(
    program: CapturedProgram, recompute_ops: Iterable[str] = (), *, optimizer_path: str = "single"
) -> Graph:
    """The graph eager PyTorch runs for ``program`` under ``apply`` (module docstring)."""
    if optimizer_path not in OPTIMIZER_PATHS:
        raise ValueError(f"optimizer_path: expected one of {', '.join(OPTIMIZER_PATHS)}, got {optimizer_path!r}")
    graph = with_dynamic_grads(program.graph)
    ops = tuple(recompute_ops)
    if ops:
        graph = apply_recompute(graph, dict.fromkeys(ops))
    graph = _held_to_node_end(graph, program)
    if program.optimizer is None:
        return graph
    return _with_torch_optim(graph, program, optimizer_path)


def _held_to_node_end(graph: Graph, program: CapturedProgram) -> Graph:
    """``graph`` with every saved tensor also read by the last op of each backward node that reads it.

    A saved tensor is one a forward op (or a recompute) makes and a backward op
    reads; a node is the run of backward ops sharing a ``backward_of``.
    """
    phase = program.op_phases
    forward_made = {
        t for op in graph.ops
        if phase.get(op.name) == "forward" or op.recompute_of is not None
        for t in op.outputs
    }
    last: dict[str, int] = {}
    for k, op in enumerate(graph.ops):
        if op.backward_of is not None and phase.get(op.name) == "backward":
            last[op.backward_of] = k
    held: dict[int, list[str]] = {}
    for op in graph.ops:
        if op.backward_of is None or phase.get(op.name) != "backward":
            continue
        end = held.setdefault(last[op.backward_of], [])
        end.extend(t for t in op.inputs if t in forward_made and t not in end)
    if not held:
        return graph
    ops = []
    for k, op in enumerate(graph.ops):
        extra = tuple(t for t in held.get(k, ()) if t not in op.inputs)
        ops.append(replace(op, inputs=(*op.inputs, *extra)) if extra else op)
    return Graph(graph.name, graph.tensors, tuple(ops), graph.outputs).validate()


def _with_torch_optim(graph: Graph, program: CapturedProgram, path: str) -> Graph:
    """``graph`` with the captured update replaced by ``torch.optim``'s, temporaries included."""
    kept = [op for op in graph.ops if program.op_phases.get(op.name) != "optimizer"]
    used = {t for op in kept for t in (*op.inputs, *op.outputs)} | set(graph.outputs)
    tensors = {t.name: t for t in graph.tensors}
    states: dict[str, dict[str, str]] = {}
    for src in program.sources:
        if src.role is SourceRole.OPTIMIZER_STATE and src.key:
            states.setdefault(src.key, {})[str(src.state)] = src.tensor
    shared = [s.tensor for s in program.sources if s.role is SourceRole.OPTIMIZER_STATE and not s.key]
    param_of = {s.key: s.tensor for s in program.sources if s.role is SourceRole.PARAM}
    params = [(fqn, param_of[fqn], grad) for fqn, grad in program.grads.items()]
    adam = program.optimizer is not None and program.optimizer.name == "adam"
    extra: list[Tensor] = []
    update: list[Op] = []

    def temp(name: str, like: str) -> str:
        extra.append(Tensor(name, _storage_bytes(tensors, like), Kind.WORKSPACE))
        return name

    if not adam:  # SGD without momentum: p.add_(g, alpha=-lr), in place, either path
        for fqn, p, g in params:
            update.append(Op(f"optim.{fqn}", "sgd", (p, g), (p,)))
    elif path == "single":
        for fqn, p, g in params:
            avg, sq = _adam_states(states, fqn)
            t1 = temp(f"optim.{fqn}.sqrt", sq)
            t2 = temp(f"optim.{fqn}.denom", sq)
            update.append(Op(f"optim.{fqn}.moments", "adam_moments", (avg, sq, g, *shared), (avg, sq, *shared)))
            update.append(Op(f"optim.{fqn}.sqrt", "sqrt", (sq,), (t1,)))
            update.append(Op(f"optim.{fqn}.div", "div", (t1,), (t2,)))
            update.append(Op(f"optim.{fqn}.step", "addcdiv_", (p, avg, t2), (p,)))
    else:
        avgs = [_adam_states(states, fqn)[0] for fqn, _, _ in params]
        sqs = [_adam_states(states, fqn)[1] for fqn, _, _ in params]
        grads = [g for _, _, g in params]
        temps = [temp(f"optim.{fqn}.sqrt", sq) for (fqn, _, _), sq in zip(params, sqs)]
        update.append(Op("optim.moments", "_foreach_adam_moments", (*avgs, *sqs, *grads, *shared),
                         (*avgs, *sqs, *shared)))
        update.append(Op("optim.sqrt", "_foreach_sqrt", tuple(sqs), tuple(temps)))
        update.append(Op("optim.step", "_foreach_addcdiv_", (*(p for _, p, _ in params), *avgs, *temps),
                         tuple(p for _, p, _ in params)))
    touched = used | {t for op in update for t in (*op.inputs, *op.outputs)}
    made_by_update = {
        t for op in graph.ops if program.op_phases.get(op.name) == "optimizer" for t in op.outputs if t not in op.inputs
    }
    dropped = made_by_update - touched
    kept_tensors = []
    for t in graph.tensors:  # a view follows its base (Graph.validate), so one pass drops views of dropped bases
        if t.name in dropped or (t.alias_of is not None and t.alias_of in dropped):
            dropped.add(t.name)
        else:
            kept_tensors.append(t)
    return Graph(graph.name, (*kept_tensors, *extra), (*kept, *update), graph.outputs).validate()


def _adam_states(states: dict[str, dict[str, str]], fqn: str) -> tuple[str, str]:
    """(exp_avg, exp_avg_sq) IR tensors of parameter ``fqn``."""
    return states[fqn]["exp_avg"], states[fqn]["exp_avg_sq"]


def _storage_bytes(tensors: dict[str, Tensor], name: str) -> int:
    t = tensors[name]
    while t.alias_of is not None:
        t = tensors[t.alias_of]
    return t.nbytes

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
  Where a record cuts later, ``from_ops`` (``RecomputePolicy.from_ops``) starts the
  late region at the node ``apply`` recomputes for (``apply_cuts``); the readers
  before it read the original.
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
  all live together.  The loop's ``denom`` lives on into the next parameter's
  iteration (a local variable); the loop is modelled as one parameter group in the
  model's order.  SGD without momentum updates in place.  Adam's per-parameter
  ``step`` counters (4-byte host scalars) are not modelled.
* **The step in backward** (``step_in_backward=True``, ``mpplan.runtime.apply_step``):
  each parameter's update runs as soon as its gradient is complete, right after the
  backward node that makes it (autograd runs an ``AccumulateGrad`` node, and so its
  hook, before any other ready node), and the gradient dies after that update: it is
  no longer an output of the step.  On either path the update is one parameter's:
  two temporaries on the loop's path, one on ``foreach``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
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

    ``peak_bytes = static_bytes + load_bytes + workspace_bytes`` (``sim``) over
    ``graph``: ``load_bytes`` is LOAD, ``workspace_bytes`` what the kernels'
    workspaces, held at their ops' steps, add to it (0 unless probed); the three are
    counted as ``predict_apply``'s ``allocation`` says, ``graph`` holds exact bytes;
    ``recompute_ops`` are the forward ops recomputed, ``optimizer_path`` the
    ``torch.optim`` path modelled, ``step_in_backward`` whether the update runs per
    parameter inside backward.
    """

    peak_bytes: int
    static_bytes: int
    load_bytes: int
    recompute_ops: tuple[str, ...]
    optimizer_path: str
    graph: Graph
    step_in_backward: bool = False
    workspace_bytes: int = 0


def predict_apply(
    program: CapturedProgram,
    recompute_ops: Iterable[str] = (),
    *,
    optimizer_path: str = "single",
    step_in_backward: bool = False,
    from_ops: Mapping[str, str] | None = None,
    workspaces: Mapping[str, int] | None = None,
    allocation: Callable[[int], int] | None = None,
) -> ApplyPrediction:
    """Predict ``apply``'s peak for ``program`` with ``recompute_ops`` recomputed (module docstring).

    ``from_ops``: recomputed tensor -> the op its late region starts at, where a cut says.
    ``workspaces``: IR op -> bytes its kernels take while it runs (``apply_workspace``), held
    beside the storages live at its step, and at its recomputes'.  ``allocation``: bytes ->
    bytes an allocator counts for one storage (``allocation.cuda_block_bytes`` on a GPU, where
    eager makes every storage an allocation of its own).
    """
    ops = tuple(recompute_ops)
    graph = apply_memory_graph(program, ops, optimizer_path=optimizer_path, step_in_backward=step_in_backward,
                               from_ops=from_ops)
    counted = graph if allocation is None else _allocated(graph, allocation)
    static = sim.static_bytes(counted)
    profile = sim.order_profile(counted, range(len(graph.ops)))
    load = max(profile, default=0)
    found = workspaces or {}
    held = max((live + found.get(op.name, found.get(op.recompute_of or "", 0))
                for live, op in zip(profile, graph.ops)), default=0)
    return ApplyPrediction(static + held, static, load, ops, optimizer_path, graph, step_in_backward, held - load)


def _allocated(graph: Graph, allocation: Callable[[int], int]) -> Graph:
    """``graph`` with each storage (a tensor that aliases none) as ``allocation`` counts it."""
    tensors = tuple(t if t.alias_of is not None else replace(t, nbytes=allocation(t.nbytes)) for t in graph.tensors)
    return replace(graph, tensors=tensors)


def apply_memory_graph(
    program: CapturedProgram,
    recompute_ops: Iterable[str] = (),
    *,
    optimizer_path: str = "single",
    step_in_backward: bool = False,
    from_ops: Mapping[str, str] | None = None,
) -> Graph:
    """The graph eager PyTorch runs for ``program`` under ``apply`` (module docstring; ``from_ops`` as
    ``predict_apply``)."""
    if optimizer_path not in OPTIMIZER_PATHS:
        raise ValueError(f"optimizer_path: expected one of {', '.join(OPTIMIZER_PATHS)}, got {optimizer_path!r}")
    graph = with_dynamic_grads(program.graph)
    ops = tuple(recompute_ops)
    if ops:
        graph = apply_recompute(graph, dict.fromkeys(ops), from_ops)
    graph = _held_to_node_end(graph, program)
    if program.optimizer is None:
        return graph
    return _with_torch_optim(graph, program, optimizer_path, step_in_backward)


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


def _with_torch_optim(graph: Graph, program: CapturedProgram, path: str, in_backward: bool) -> Graph:
    """``graph`` with the captured update replaced by ``torch.optim``'s, temporaries included.

    ``in_backward``: each parameter's update follows the backward node that completes
    its gradient, and the gradient is no output (``apply_step``).
    """
    kept = [op for op in graph.ops if program.op_phases.get(op.name) != "optimizer"]
    tensors = {t.name: t for t in graph.tensors}
    states: dict[str, dict[str, str]] = {}
    for src in program.sources:
        if src.role is SourceRole.OPTIMIZER_STATE and src.key:
            states.setdefault(src.key, {})[str(src.state)] = src.tensor
    shared = tuple(s.tensor for s in program.sources if s.role is SourceRole.OPTIMIZER_STATE and not s.key)
    param_of = {s.key: s.tensor for s in program.sources if s.role is SourceRole.PARAM}
    params = [(fqn, param_of[fqn], grad) for fqn, grad in program.grads.items()]
    adam = program.optimizer is not None and program.optimizer.name == "adam"
    extra: list[Tensor] = []

    def temp(name: str, like: str) -> str:
        extra.append(Tensor(name, _storage_bytes(tensors, like), Kind.WORKSPACE))
        return name

    def one(fqn: str, p: str, g: str, previous: tuple[str, ...] = ()) -> list[Op]:
        """One parameter's update: the loop's body, or ``foreach`` over a list of one.

        ``previous``: the last iteration's ``denom``, which the loop's local variable
        keeps alive until this iteration's ``denom`` replaces it.
        """
        if not adam:  # SGD without momentum: p.add_(g, alpha=-lr), in place, either path
            return [Op(f"optim.{fqn}", "sgd", (p, g), (p,))]
        avg, sq = _adam_states(states, fqn)
        update = [Op(f"optim.{fqn}.moments", "adam_moments", (avg, sq, g, *shared), (avg, sq, *shared)),
                  Op(f"optim.{fqn}.sqrt", "sqrt", (sq, *previous), (temp(f"optim.{fqn}.sqrt", sq),))]
        denom = f"optim.{fqn}.sqrt"
        if path == "single":  # denom = (exp_avg_sq.sqrt() / bc2).add_(eps): a second temporary
            update.append(Op(f"optim.{fqn}.div", "div", (denom, *previous), (temp(f"optim.{fqn}.denom", sq),)))
            denom = f"optim.{fqn}.denom"
        # ``.grad`` stays set until the update is over: in backward, the hook frees it after ``step()``.
        update.append(Op(f"optim.{fqn}.step", "addcdiv_", (p, avg, denom, g), (p,)))
        return update

    outputs = graph.outputs
    if in_backward:
        ready = _grads_ready(kept, program, [g for _, _, g in params])
        after: dict[int, list[Op]] = {}
        for fqn, p, g in params:
            after.setdefault(ready[g], []).extend(one(fqn, p, g))
        ops = [step for k, op in enumerate(kept) for step in (op, *after.get(k, ()))]
        grads = {_base(tensors, g) for _, _, g in params}  # the step's outputs name a gradient or its base
        outputs = tuple(t for t in outputs if _base(tensors, t) not in grads)
    elif not adam or path == "single":  # one loop over the parameters (one group, in the model's order)
        ops = list(kept)
        for k, (fqn, p, g) in enumerate(params):
            ops += one(fqn, p, g, (f"optim.{params[k - 1][0]}.denom",) if adam and k else ())
    else:  # foreach over every parameter at once: one sqrt temporary per parameter, all live together
        avgs = [_adam_states(states, fqn)[0] for fqn, _, _ in params]
        sqs = [_adam_states(states, fqn)[1] for fqn, _, _ in params]
        temps = [temp(f"optim.{fqn}.sqrt", sq) for (fqn, _, _), sq in zip(params, sqs)]
        ops = [*kept,
               Op("optim.moments", "_foreach_adam_moments", (*avgs, *sqs, *(g for _, _, g in params), *shared),
                  (*avgs, *sqs, *shared)),
               Op("optim.sqrt", "_foreach_sqrt", tuple(sqs), tuple(temps)),
               Op("optim.step", "_foreach_addcdiv_", (*(p for _, p, _ in params), *avgs, *temps),
                  tuple(p for _, p, _ in params))]
    touched = {t for op in ops for t in (*op.inputs, *op.outputs)} | set(outputs)
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
    return Graph(graph.name, (*kept_tensors, *extra), tuple(ops), outputs).validate()


def _grads_ready(ops: list[Op], program: CapturedProgram, grads: Iterable[str]) -> dict[str, int]:
    """Gradient -> index of the op after which it is complete: the last op of the backward node that writes it last.

    Autograd runs a node whole, then the ``AccumulateGrad`` it made ready (those come
    first among ready nodes), so the update follows the node's end, not the op.
    """
    node_end: dict[str, int] = {}
    last_write: dict[str, int] = {}
    for k, op in enumerate(ops):
        if op.backward_of is not None and program.op_phases.get(op.name) == "backward":
            node_end[op.backward_of] = k
        for t in op.outputs:
            last_write[t] = k
    ready = {}
    for g in grads:
        k = last_write[g]
        op = ops[k]
        if op.backward_of is not None and program.op_phases.get(op.name) == "backward":
            k = max(k, node_end[op.backward_of])
        ready[g] = k
    return ready


def _adam_states(states: dict[str, dict[str, str]], fqn: str) -> tuple[str, str]:
    """(exp_avg, exp_avg_sq) IR tensors of parameter ``fqn``."""
    return states[fqn]["exp_avg"], states[fqn]["exp_avg_sq"]


def _storage_bytes(tensors: dict[str, Tensor], name: str) -> int:
    return tensors[_base(tensors, name)].nbytes


def _base(tensors: dict[str, Tensor], name: str) -> str:
    """The tensor owning ``name``'s storage (``name`` unless it is a view)."""
    t = tensors[name]
    while t.alias_of is not None:
        t = tensors[t.alias_of]
    return t.name

"""The static half of execution: what each step of a plan does, derived once from (program, plan).

``compile_schedule`` rebuilds the copy-augmented graph the plan describes
(``planner.placed_graph``), checks it is the plan's schedule, and turns every op
of it into a ``Step``: the device it runs on, the fx node it executes (or the copy
it performs), the fresh outputs that need planned memory (``Target``), and the
storages that die right after it.  Death follows the placed graph's liveness, the
contract every pass shares: a storage dies after the last step that touches any of
its aliases, graph outputs and static storages never do.  Freeing a storage drops
the fx values of every IR tensor aliasing it (and, for a copy, the destination's
overlay entries), so the real memory goes when the plan says it goes.

Nothing here touches real tensors; ``executor`` runs the steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.capture.torch_capture.program import getitem_paths
from mpplan.errors import GraphError, PlanError
from mpplan.graph import Graph
from mpplan.graph_hash import graph_hash_like, hash_matches
from mpplan.passes.copies import Placed
from mpplan.plan import Plan
from mpplan.planner import placed_graph
from mpplan.runtime.arena import Layout, OutVariant, layout_of, out_variant

__all__ = ["CopyStep", "Release", "Schedule", "Step", "Target", "compile_schedule", "flatten", "unflatten"]


@dataclass(frozen=True, slots=True)
class Target:
    """A fresh output of an op that lives in planned memory: result leaf ``leaf`` is IR tensor ``tensor``.

    ``static`` marks a static storage produced by the step (a parameter's gradient),
    which lives in a buffer of its own for the whole run rather than in the arena.
    ``device_type`` is where the traced kernel put it (a CUDA op may return CPU
    scalars, e.g. attention's RNG state); only results of the device's own type go
    to planned memory.
    """

    leaf: int
    tensor: str
    layout: Layout
    static: bool
    device_type: str


@dataclass(frozen=True, slots=True)
class CopyStep:
    """Copy IR tensor ``tensor`` (a view of storage root ``root``) from ``src``: ``nbytes`` of the root's bytes.

    The destination holds a byte-exact replica of the root's storage and a tensor
    laid over it exactly as ``tensor`` lies over the root; consumers on the
    destination read it in place of the fx nodes ``nodes``.
    """

    name: str
    tensor: str
    root: str
    src: str
    nbytes: int
    nodes: tuple[str, ...]
    root_nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """What to drop when a storage dies: fx values in the shared env, or in one device's overlay."""

    storage: str
    env_nodes: tuple[str, ...]
    overlay_device: str | None
    overlay_nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One op of the plan's schedule, with what the executor must do around it."""

    index: int
    op: str
    device: str
    node: str | None
    copy: CopyStep | None
    func: Any
    targets: tuple[Target, ...]
    out: OutVariant | None
    inputs: tuple[str, ...]
    results: tuple[str, ...]
    containers: tuple[str, ...]
    drop_before: tuple[str, ...]
    releases: tuple[Release, ...]
    keys: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """A plan compiled against a captured program.

    ``static_roots`` are the statically resident storages some step produces
    (parameter gradients): name -> (home device, layout, fx nodes of the root).
    ``source_homes`` maps each source's fx node to the home device of its storage,
    for the sources some op touches; the others are never bound.
    """

    program: CapturedProgram
    plan: Plan
    placed: Placed
    steps: tuple[Step, ...]
    static_roots: Mapping[str, tuple[str, Layout, tuple[str, ...]]]
    source_homes: Mapping[str, str]
    devices: tuple[str, ...]

    @property
    def graph(self) -> Graph:
        return self.placed.graph


def compile_schedule(program: CapturedProgram, plan: Plan) -> Schedule:
    """Check ``plan`` belongs to ``program`` and derive every step's work; ``PlanError`` if it cannot."""
    if not hash_matches(plan.graph_hash, program.graph):
        raise PlanError(
            f"plan is for graph hash {plan.graph_hash} ({plan.graph_name}), the captured program has "
            f"{graph_hash_like(plan.graph_hash, program.graph)} ({program.graph.name}): "
            "capture the model with the mode, optimizer, "
            "inputs and dtype the plan was made for, traced for the kind of device it runs on (GPU kernels "
            "differ from CPU ones)"
        )
    try:
        placed = placed_graph(program.graph, plan)
    except KeyError as exc:
        raise PlanError(f"plan: placement names no device for op {exc.args[0]!r}") from None
    except GraphError as exc:
        raise PlanError(f"plan: its schedule is not a valid order: {exc}") from None
    graph = placed.graph
    names = tuple(op.name for op in graph.ops)
    if names != tuple(plan.schedule):
        shorter = min(len(names), len(plan.schedule))
        first = next((i for i, (a, b) in enumerate(zip(names, plan.schedule)) if a != b), shorter)
        raise PlanError(
            f"plan: schedule differs from the copy-augmented graph at step {first}: rebuilding gives "
            f"{names[first] if first < len(names) else '<end>'!r}, the plan lists "
            f"{plan.schedule[first] if first < len(plan.schedule) else '<end>'!r}"
        )
    devices = tuple(d.name for d in plan.devices)
    repeats = recompute_sources(graph)

    def nodes_of(tensor: str) -> tuple[str, ...]:
        """The env keys holding ``tensor``: its fx nodes', apart for a recompute's results."""
        if tensor in repeats:
            return tuple(recompute_key(n, tensor) for n in program.tensor_nodes.get(repeats[tensor], ()))
        return tuple(program.tensor_nodes.get(tensor, ()))

    unknown = sorted(set(placed.op_device) - set(devices))
    if unknown:
        raise PlanError(f"plan: ops are placed on {', '.join(unknown)}, which the plan's devices do not list")
    topo = graph.topology
    copies = {c.name: c for c in placed.copies}
    storage_name = [graph.tensors[s].name for s in range(len(graph.tensors))]

    last: dict[int, int] = {}
    for k, storages in enumerate(topo.op_storages):
        for s in storages:
            last[s] = k
    never_free = set(topo.output_storages) | {s for s in last if topo.is_static[s]}

    members: dict[int, list[int]] = {}
    for t, s in enumerate(topo.storage_of):
        members.setdefault(s, []).append(t)

    def release(s: int) -> Release:
        env_nodes: list[str] = []
        overlay_device: str | None = None
        overlay_nodes: tuple[str, ...] = ()
        for t in members[s]:
            name = graph.tensors[t].name
            if name in copies:
                overlay_device = copies[name].dst
                overlay_nodes = nodes_of(copies[name].tensor)
            else:
                env_nodes.extend(nodes_of(name))
        return Release(storage_name[s], tuple(env_nodes), overlay_device, tuple(overlay_nodes))

    dying: dict[int, list[int]] = {}
    for s, k in last.items():
        if s not in never_free:
            dying.setdefault(k, []).append(s)

    static_roots: dict[str, tuple[str, Layout, tuple[str, ...]]] = {}
    variants: dict[Any, OutVariant | None] = {}
    steps: list[Step] = []
    for k, op in enumerate(graph.ops):
        device = placed.op_device[k]
        releases = tuple(release(s) for s in sorted(dying.get(k, ())))
        if op.name in copies:
            steps.append(_copy_step(graph, k, device, copies[op.name], releases, nodes_of))
            continue
        source_op = repeats.get(op.name, op.name)
        if source_op not in program.op_nodes:
            raise PlanError(f"plan: op {op.name!r} has no node in the captured program; it cannot be executed")
        node = program.nodes[program.op_nodes[source_op]]
        targets = _targets(program, graph, op.name, node, repeats)
        drop_before: list[str] = []
        for target in targets:
            if target.static:
                s = topo.storage_of[topo.tensor_index[target.tensor]]
                nodes = nodes_of(target.tensor)
                static_roots[target.tensor] = (device, target.layout, tuple(nodes))
                drop_before.extend(release(s).env_nodes)
        leaves = flatten(node.meta.get("val"))
        all_targeted = bool(targets) and len(targets) == len(leaves) == sum(
            isinstance(v, torch.Tensor) for v in leaves
        )
        keys = _env_keys(program, graph, op, _result_nodes(node), repeats, copies)
        steps.append(
            Step(
                index=k,
                op=op.name,
                device=device,
                node=node.name,
                copy=None,
                func=node.target,
                targets=targets,
                out=_cached(variants, node.target) if all_targeted else None,
                inputs=tuple(keys.get(n.name, n.name) for n in node.all_input_nodes),
                results=tuple(keys.get(r, r) for r in _result_nodes(node) if r in program.node_tensors),
                containers=tuple(keys.get(r, r) for r in _result_nodes(node) if r not in program.node_tensors),
                keys=keys,
                drop_before=tuple(drop_before),
                releases=releases,
            )
        )
    for root, (device, layout, nodes) in static_roots.items():
        if not nodes:
            raise PlanError(f"gradient storage {root!r} has no value in the captured program; cannot keep it resident")
    touched = {s for storages in topo.op_storages for s in storages}
    source_homes = {}
    for src in program.sources:
        s = topo.storage_of[topo.tensor_index[src.tensor]]
        if s in touched:
            source_homes[src.node] = placed.storage_device[s]
    return Schedule(program, plan, placed, tuple(steps), static_roots, source_homes, devices)


def _cached(variants: dict[Any, OutVariant | None], func: Any) -> OutVariant | None:
    if func not in variants:
        variants[func] = out_variant(func)
    return variants[func]


def recompute_sources(graph: Graph) -> dict[str, str]:
    """Each recompute op and tensor of a rematerialised graph -> the captured op or tensor it repeats.

    A recompute runs its original's fx node again and keeps its results under env
    keys of their own (``recompute_key``), so the original and its recompute may be
    alive together; late readers read them there.
    """
    sources: dict[str, str] = {}
    for op in graph.ops:
        if op.recompute_of is None:
            continue
        sources[op.name] = op.recompute_of
        for new, old in zip(op.outputs, graph.op(op.recompute_of).outputs):
            sources[new] = old
    return sources


def recompute_key(node: str, tensor: str) -> str:
    """The env key under which recompute tensor ``tensor`` holds fx node ``node``'s value."""
    return f"{node}|{tensor}"


def _env_keys(
    program: CapturedProgram,
    graph: Graph,
    op: Any,
    results: list[str],
    repeats: Mapping[str, str],
    copies: Mapping[str, Any],
) -> dict[str, str]:
    """fx node name -> env key for an op that reads recomputed tensors (or copies of them) or is a recompute."""
    keys: dict[str, str] = {}
    for name in op.inputs:
        name = copies[name].tensor if name in copies else name
        if name in repeats:
            for n in program.tensor_nodes.get(repeats[name], ()):
                keys[n] = recompute_key(n, name)
    if op.recompute_of is not None:
        recreated = dict(zip(graph.op(op.recompute_of).outputs, op.outputs))
        for r in results:
            tensor = program.node_tensors.get(r)
            keys[r] = recompute_key(r, recreated[tensor] if tensor in recreated else op.name)
    return keys


def _copy_step(
    graph: Graph,
    k: int,
    device: str,
    copy: Any,
    releases: tuple[Release, ...],
    nodes_of: Callable[[str], tuple[str, ...]],
) -> Step:
    topo = graph.topology
    root = graph.tensors[topo.storage_of[topo.tensor_index[copy.tensor]]].name
    nodes = nodes_of(copy.tensor)
    if not nodes:
        raise PlanError(f"copy {copy.name!r}: tensor {copy.tensor!r} has no value in the captured program")
    step = CopyStep(copy.name, copy.tensor, root, copy.src, copy.bytes, nodes, nodes_of(root))
    return Step(k, copy.name, device, None, step, None, (), None, nodes[:1], (), (), (), releases)


def _targets(
    program: CapturedProgram, graph: Graph, op_name: str, node: Any, repeats: Mapping[str, str]
) -> tuple[Target, ...]:
    """Fresh root outputs of an op and the result leaf each one is.

    The lowering lists an op's outputs in the order of its tensor results, so the
    i-th tensor leaf of the traced value is ``op.outputs[i]``; the mapping is kept
    only where shapes, dtypes and the ``getitem`` nodes that name results agree.
    """
    topo = graph.topology
    op = graph.op(op_name)
    leaves = flatten(node.meta.get("val"))
    positions = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    named = {path[0]: name for name, path in getitem_paths(node).items() if len(path) == 1}
    if not isinstance(node.meta.get("val"), (list, tuple)):
        named = {0: node.name}
    targets: list[Target] = []
    for j, pos in enumerate(positions):
        if j >= len(op.outputs):
            break
        name = op.outputs[j]
        tensor = graph.tensor(name)
        fake = leaves[pos]
        if tensor.shape != tuple(int(s) for s in fake.shape) or tensor.dtype != str(fake.dtype).removeprefix("torch."):
            return ()  # layout disagreement: trust nothing positional
        if pos in named and program.node_tensors.get(named[pos]) != repeats.get(name, name):
            return ()
        if tensor.alias_of is not None or name in op.inputs:
            continue
        s = topo.storage_of[topo.tensor_index[name]]
        targets.append(Target(pos, name, layout_of(fake), bool(topo.is_static[s]), fake.device.type))
    return tuple(targets)


def _result_nodes(node: Any) -> list[str]:
    """The fx node names an op's results are stored under: the node itself or its ``getitem`` users."""
    paths = getitem_paths(node)
    return list(paths) if paths else [node.name]


def flatten(value: Any) -> list[Any]:
    """Leaves of a nest of lists and tuples, in order (``None`` and non-tensors included)."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in flatten(v)]
    return [value]


def unflatten(like: Any, leaves: list[Any]) -> Any:
    """``like``'s structure with its leaves replaced by ``leaves`` (in ``flatten`` order).

    A module-level helper, not a recursive closure: a closure naming itself is a
    reference cycle, which would hold ``leaves`` (an op's results) until the garbage
    collector runs, and their memory with them (an arena block outliving its buffers).
    """
    return _build(like, iter(leaves))


def _build(like: Any, leaves: Iterator[Any]) -> Any:
    if isinstance(like, (list, tuple)):
        return type(like)(_build(x, leaves) for x in like)
    return next(leaves)

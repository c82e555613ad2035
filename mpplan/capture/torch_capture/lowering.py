"""Lowering the traced ATen ``fx.Graph`` to the IR, one ATen call per ``Op``.

* **Views** (a schema return with non-write ``alias_info``, e.g. ``view``, ``t``,
  ``expand``, ``split``) become tensors with ``alias_of`` their base argument.  An
  output the schema calls fresh that nevertheless shares its input's storage
  (``_unsafe_view``) is an alias too: storage identity of the fake values decides.
* **In-place** writes (a schema argument with ``alias_info.is_write``: ``relu_``,
  ``add_``, ``out=`` arguments, batch-norm running stats, ``_foreach_*_``) list the
  mutated tensor as both input and output; later readers of the fx node the op
  returned read that same IR tensor.  ``native_batch_norm``, whose schema hides its
  running-stat update, is traced as the same kernel under the annotated
  ``_native_batch_norm_legit`` so the write shows.
* Multi-output ops get one IR tensor per tensor element, named after the
  ``getitem`` node that reads it (``<node>.<i>`` when none does); ``getitem`` itself
  is no op.  Ops without tensor outputs are kept, with no outputs.
* Tensor sizes are ``numel * element_size``; a view (``alias_of``) allocates
  nothing and has ``nbytes`` 0, as in graph files; its ``shape`` and ``dtype`` say
  what it looks like.
* ``Op.cost`` is roofline microseconds (``capture.torch_capture.cost``); ops that only
  make views (and ops that write nothing) cost 0.
* ``Op.module`` and ``Op.backward_of`` come from the tracing's marks
  (``capture.torch_capture.annotations``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import fx

from mpplan.capture.torch_capture.annotations import BACKWARD, FORWARD, GRAD_FN, MODULE, PHASE
from mpplan.capture.torch_capture.cost import logical_bytes, op_cost
from mpplan.capture.torch_capture.optimizer import OptimizerSpec
from mpplan.capture.torch_capture.program import CapturedProgram, Source, SourceRole, getitem_paths
from mpplan.capture.torch_capture.tracing import Slot, storage_ref
from mpplan.errors import CaptureError, GraphError
from mpplan.graph import Graph, Kind, Op, Tensor


@dataclass
class _Draft:
    """A tensor being built; frozen into ``Tensor`` once kinds are final."""

    nbytes: int
    kind: Kind
    shape: tuple[int, ...]
    dtype: str
    alias_of: str | None = None
    grad_of: str | None = None


@dataclass
class _OpDraft:
    """An op being built: its IR fields, and the tracing's marks that ``_link_backward`` turns into links."""

    name: str
    type: str
    inputs: list[str]
    outputs: list[str]
    cost: float
    phase: str | None
    module: str | None
    grad_fn: int | None
    seq_nr: int | None
    backward_of: str | None = None


def lower(
    gm: fx.GraphModule,
    slots: list[Slot],
    grad_params: list[str],
    *,
    name: str,
    mode: str,
    optimizer: OptimizerSpec | None,
) -> CapturedProgram:
    """Walk the fx graph once, building tensors and ops; then fix kinds, links and outputs."""
    drafts: dict[str, _Draft] = {}
    fake_of: dict[str, torch.Tensor] = {}
    value: dict[fx.Node, Any] = {}  # fx node -> IR name, or nested lists of them for multi-output nodes
    ops: list[_OpDraft] = []
    sources: list[Source] = []
    used: set[str] = set()

    def fresh_name(wanted: str) -> str:
        candidate, i = wanted, 0
        while candidate in used:
            i += 1
            candidate = f"{wanted}_{i}"
        used.add(candidate)
        return candidate

    def new_tensor(wanted: str, fake: torch.Tensor, kind: Kind, alias_of: str | None = None) -> str:
        tname = fresh_name(wanted)
        drafts[tname] = _Draft(
            nbytes=0 if alias_of is not None else logical_bytes(fake),
            kind=kind,
            shape=tuple(int(s) for s in fake.shape),
            dtype=str(fake.dtype).removeprefix("torch."),
            alias_of=alias_of,
        )
        fake_of[tname] = fake
        return tname

    placeholders = iter(slots)
    output_names: list[str | None] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            slot = next(placeholders)
            kind = {
                SourceRole.PARAM: Kind.PARAM,
                SourceRole.BUFFER: Kind.PARAM,
                SourceRole.INPUT: Kind.INPUT,
                SourceRole.OPTIMIZER_STATE: Kind.OPTIMIZER_STATE,
            }[slot.role]
            value[node] = new_tensor(slot.name, node.meta["val"], kind)
            sources.append(Source(node.name, value[node], slot.role, slot.key, slot.state))
        elif node.op == "get_attr":
            val = node.meta.get("val", getattr(gm, str(node.target), None))
            if isinstance(val, torch.Tensor):
                value[node] = new_tensor(node.name, val, Kind.PARAM)
                sources.append(Source(node.name, value[node], SourceRole.CONSTANT, str(node.target)))
            else:
                value[node] = None
        elif node.op == "call_function" and node.target is operator.getitem:
            parent = value.get(node.args[0])
            value[node] = parent[node.args[1]] if isinstance(parent, list) else None
        elif node.op == "call_function":
            ops.append(_lower_op(node, value, fake_of, new_tensor))
        elif node.op == "output":
            output_names = [
                _flat_name(value.get(a)) if isinstance(a, fx.Node) else None for a in _arg_leaves(node.args[0])
            ]
        else:
            raise CaptureError(f"capture: unsupported fx node {node.name!r} of kind {node.op!r}")

    grads = _mark_grads(drafts, grad_params, output_names[1:] if mode == "train" else [])
    graph_outputs = output_names[:1] if mode == "train" else output_names
    graph_outputs_unique = tuple(dict.fromkeys(o for o in graph_outputs if o is not None))
    for out in graph_outputs_unique:
        if drafts[out].kind is Kind.ACTIVATION:
            drafts[out].kind = Kind.OUTPUT
    _link_backward(ops)

    tensors = tuple(Tensor(n, d.nbytes, d.kind, d.shape, d.dtype, d.alias_of, d.grad_of) for n, d in drafts.items())
    ir_ops = tuple(
        Op(o.name, o.type, tuple(o.inputs), tuple(o.outputs), cost=o.cost, backward_of=o.backward_of, module=o.module)
        for o in ops
    )
    graph = Graph(name, tensors, ir_ops, graph_outputs_unique)
    try:
        graph.validate()
    except GraphError as e:  # a lowering bug, not a user error; keep the message precise anyway
        raise CaptureError(f"capture: the captured graph is malformed: {e}") from e
    node_tensors = {n.name: v for n, v in value.items() if isinstance(v, str)}
    return CapturedProgram(
        graph=graph,
        module=gm,
        mode=mode,
        optimizer=optimizer,
        sources=tuple(sources),
        op_nodes=MappingProxyType({o.name: o.name for o in ops}),
        node_tensors=MappingProxyType(node_tensors),
        grads=MappingProxyType(grads),
        output_nodes=tuple(_output_node_names(gm)),
        op_phases=MappingProxyType({o.name: o.phase or FORWARD for o in ops}),
    )


def _flat_name(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _output_node_names(gm: fx.GraphModule) -> list[str | None]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    return [a.name if isinstance(a, fx.Node) else None for a in _arg_leaves(out.args[0])]


def _arg_leaves(arg: Any) -> list[Any]:
    """Leaves of an fx argument structure (nested lists and tuples), ``None`` included."""
    if isinstance(arg, (list, tuple)):
        return [leaf for a in arg for leaf in _arg_leaves(a)]
    return [arg]


def _lower_op(
    node: fx.Node,
    value: dict[fx.Node, Any],
    fake_of: dict[str, torch.Tensor],
    new_tensor: Callable[..., str],
) -> _OpDraft:
    """One IR op for one ATen call: inputs, in-place writes, views and fresh outputs."""
    target = node.target
    schema = target._schema if isinstance(target, torch._ops.OpOverload) else None
    inputs: list[str] = []
    for arg in node.all_input_nodes:
        for t in _names_in(value.get(arg)):
            if t not in inputs:
                inputs.append(t)

    bound = _bind_schema(schema, node) if schema is not None else []
    writes: list[str] = []
    for arg, val in bound:
        if arg.alias_info is not None and arg.alias_info.is_write:
            writes.extend(t for t in _names_in(_arg_value(val, value)) if t not in writes)

    element_names = getitem_paths(node)
    outputs: list[str] = []
    fresh_bytes = 0

    def lower_value(val: Any, path: tuple[int, ...], ret: Any) -> Any:
        nonlocal fresh_bytes
        if isinstance(val, (list, tuple)):
            return [lower_value(v, path + (i,), ret) for i, v in enumerate(val)]
        if not isinstance(val, torch.Tensor):
            return None
        wanted = node.name if not path else _element_name(node.name, path, element_names)
        base = _alias_base(ret, bound, path, value) if ret is not None else None
        if ret is not None and ret.alias_info is not None and ret.alias_info.is_write and base is not None:
            result = base
        elif ret is not None and ret.alias_info is not None and base is not None:
            result = new_tensor(wanted, val, Kind.ACTIVATION, alias_of=base)
        else:
            same = next((t for t in inputs if fake_of[t] is val), None)
            if same is not None:  # a schema-less in-place op returned its input
                result = same
            else:
                shared = next((t for t in inputs if _same_storage(fake_of[t], val)), None)
                result = new_tensor(wanted, val, Kind.ACTIVATION, alias_of=shared)
                if shared is None:
                    fresh_bytes += logical_bytes(val)
        if result not in outputs:
            outputs.append(result)
        return result

    val = node.meta.get("val")
    if schema is not None and len(schema.returns) > 1 and isinstance(val, (list, tuple)):
        value[node] = [lower_value(v, (j,), schema.returns[j]) for j, v in enumerate(val)]
    else:
        ret = schema.returns[0] if schema is not None and schema.returns else None
        value[node] = lower_value(val, (), ret)
    for t in writes:
        if t not in outputs:
            outputs.append(t)

    custom = node.meta.get("custom") or {}
    read = sum(logical_bytes(fake_of[t]) for t in inputs)
    written = fresh_bytes + sum(logical_bytes(fake_of[t]) for t in writes)
    return _OpDraft(
        name=node.name,
        type=str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target)),
        inputs=inputs,
        outputs=outputs,
        cost=op_cost(node, read + written) if written else 0.0,
        phase=custom.get(PHASE),
        module=custom.get(MODULE),
        grad_fn=custom.get(GRAD_FN),
        seq_nr=node.meta.get("seq_nr"),
    )


def _names_in(v: Any) -> list[str]:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return [n for x in v for n in _names_in(x)]
    return []


def _arg_value(val: Any, value: dict[fx.Node, Any]) -> Any:
    """IR names held by an fx argument (a node or a list of nodes)."""
    if isinstance(val, fx.Node):
        return value.get(val)
    if isinstance(val, (list, tuple)):
        return [_arg_value(v, value) for v in val]
    return None


def _bind_schema(schema: torch._C.FunctionSchema, node: fx.Node) -> list[tuple[Any, Any]]:
    """(schema argument, fx value) pairs for the arguments the node passes."""
    bound = []
    for i, arg in enumerate(schema.arguments):
        if not arg.kwarg_only and i < len(node.args):
            bound.append((arg, node.args[i]))
        elif arg.name in node.kwargs:
            bound.append((arg, node.kwargs[arg.name]))
    return bound


def _alias_base(ret: Any, bound: list[tuple[Any, Any]], path: tuple[int, ...], value: dict[fx.Node, Any]) -> str | None:
    """The IR tensor a schema return aliases: the argument sharing its alias set.

    A list return such as ``split``'s ``Tensor(a)[]`` exposes no alias set, so the
    first aliased argument is the base; a list argument pairs element by element.
    """
    info = ret.alias_info
    if info is None:
        return None
    candidates = [
        (arg, val) for arg, val in bound if arg.alias_info is not None and arg.alias_info.is_write == info.is_write
    ]
    match = [(a, v) for a, v in candidates if a.alias_info.before_set & info.before_set] or candidates
    if not match:
        return None
    names = _arg_value(match[0][1], value)
    if isinstance(names, list):
        index = path[-1] if path else 0
        names = names[index] if index < len(names) else None
    return names if isinstance(names, str) else None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return storage_ref(a) == storage_ref(b)


def _element_name(node: str, path: tuple[int, ...], element_names: dict[str, tuple[int, ...]]) -> str:
    for name, p in element_names.items():
        if p == path:
            return name
    return node + "".join(f".{i}" for i in path)


def _mark_grads(drafts: dict[str, _Draft], params: list[str], grad_names: list[str | None]) -> dict[str, str]:
    """Give each parameter's gradient storage kind ``grad`` and ``grad_of``; views of it kind ``grad``."""

    def root(t: str) -> str:
        while (parent := drafts[t].alias_of) is not None:
            t = parent
        return t

    grads: dict[str, str] = {}
    roots: set[str] = set()
    for param, g in zip(params, grad_names):
        assert g is not None, f"gradient of {param} is not a tensor"
        r = root(g)
        assert drafts[r].kind is Kind.ACTIVATION and r not in roots, f"gradient of {param} does not own its storage"
        drafts[r].kind = Kind.GRAD
        drafts[r].grad_of = param
        roots.add(r)
        grads[param] = g
    for t, d in drafts.items():
        if d.alias_of is not None and root(t) in roots:
            d.kind = Kind.GRAD
    return grads


def _link_backward(ops: list[_OpDraft]) -> None:
    """Set ``backward_of`` and inherited ``module`` on backward ops (see the module docstring)."""
    forward_of_seq: dict[int, _OpDraft] = {}
    for o in ops:
        if o.phase == FORWARD and o.seq_nr is not None:
            forward_of_seq.setdefault(o.seq_nr, o)
    backward = [o for o in ops if o.phase == BACKWARD]
    for o in backward:
        fwd = forward_of_seq.get(o.grad_fn) if o.grad_fn is not None else None
        if fwd is not None:
            o.backward_of, o.module = fwd.name, fwd.module
    # Engine-run ops: inherit from the first consumer with a link, then from input producers.
    producer: dict[str, _OpDraft] = {}
    consumers: dict[str, list[_OpDraft]] = {}
    for o in ops:
        for t in o.outputs:
            if t not in o.inputs:
                producer.setdefault(t, o)
        for t in o.inputs:
            consumers.setdefault(t, []).append(o)
    by_name = {o.name: o for o in ops}
    for o in reversed(backward):
        if o.backward_of is None:
            linked = next((c for t in o.outputs for c in consumers.get(t, ()) if c.backward_of), None)
            if linked is not None:
                o.backward_of = linked.backward_of
    for o in backward:
        if o.backward_of is None:
            linked = next((p for t in o.inputs if (p := producer.get(t)) is not None and p.backward_of), None)
            if linked is not None:
                o.backward_of = linked.backward_of
        if o.backward_of is not None and o.grad_fn is None:
            o.module = by_name[o.backward_of].module
    assert all(math.isfinite(o.cost) for o in ops)

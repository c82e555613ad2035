"""The records a capture returns: the graph's sources and the program that runs the captured step op by op."""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any

import torch
from torch import fx

from mpplan.capture.torch_capture.inputs import input_leaves
from mpplan.capture.torch_capture.optimizer import OptimizerSpec
from mpplan.errors import CaptureError
from mpplan.graph import Graph


class SourceRole(str, enum.Enum):
    """What a graph source (an fx placeholder or lifted constant) binds to."""

    PARAM = "param"
    BUFFER = "buffer"
    INPUT = "input"
    OPTIMIZER_STATE = "optimizer_state"
    CONSTANT = "constant"


@dataclass(frozen=True, slots=True)
class Source:
    """One value the program starts from.

    ``node`` is the fx placeholder (or ``get_attr``) node, ``tensor`` its IR tensor.
    ``key`` is the parameter or buffer FQN, the input name (``input0``, ``input_ids``,
    ``input0.1`` for nested inputs), the parameter FQN an optimizer state belongs to
    (``""`` for Adam's shared ``step``), or the GraphModule attribute of a constant.
    ``state`` names the optimizer state: ``exp_avg``, ``exp_avg_sq`` or ``step``.
    """

    node: str
    tensor: str
    role: SourceRole
    key: str
    state: str | None = None


#: Overloads the capture traces in place of the one eager calls (``tracing._annotated_batch_norm``: the
#: same kernel under a schema that declares its writes, taking the same tensors in the same order).
EAGER_OVERLOADS: Mapping[Any, Any] = MappingProxyType({
    torch.ops.aten._native_batch_norm_legit.default: torch.ops.aten.native_batch_norm.default,
    torch.ops.aten._native_batch_norm_legit.no_stats: torch.ops.aten.native_batch_norm.default,
    torch.ops.aten._native_batch_norm_legit_no_training.default: torch.ops.aten.native_batch_norm.default,
})


@dataclass(frozen=True)
class CapturedProgram:
    """A captured ``Graph`` plus what an executor needs to run it op by op on real tensors.

    ``module`` is the traced ATen-level ``fx.GraphModule``; calling it on the source
    values in ``sources`` order (placeholders only) runs the whole step and returns
    the values named in ``output_nodes``: the forward outputs in ``"infer"`` mode,
    ``(loss, *gradients)`` in ``"train"`` mode.  ``op_nodes`` maps each IR op to its
    fx node, ``node_tensors`` each tensor-valued fx node to the IR tensor it holds (a
    version of it, for in-place ops), ``grads`` each trainable parameter's FQN to the
    IR tensor holding its gradient, ``op_phases`` each IR op to ``"forward"``,
    ``"backward"`` or ``"optimizer"``.

    To execute a schedule of IR ops on real tensors::

        env = program.bind(module, inputs)      # fx node name -> tensor, for every source
        with torch.no_grad():                   # backward ops are explicit: no autograd
            for op in order:
                program.run_op(op, env)         # node.target(*args) with args read from env
                # when a storage dies, for every IR tensor t aliasing it: del env[n] for n in tensor_nodes[t]

    ``run_op`` stores the result under the op's fx node name, binds every ``getitem``
    of a multi-output result and then drops the tuple, so elements nobody reads die
    at once, as the IR assumes.  In-place ops mutate the tensors in ``env`` (and so,
    through ``bind``, the module's own parameters, buffers and given inputs).  To back
    a dynamic IR tensor by planned memory, write the result into the planned buffer
    and store that buffer in ``env`` under the same fx node names.
    """

    graph: Graph
    module: fx.GraphModule
    mode: str
    optimizer: OptimizerSpec | None
    sources: tuple[Source, ...]
    op_nodes: Mapping[str, str]
    node_tensors: Mapping[str, str]
    grads: Mapping[str, str]
    output_nodes: tuple[str | None, ...]
    op_phases: Mapping[str, str]

    @cached_property
    def nodes(self) -> Mapping[str, fx.Node]:
        """The GraphModule's fx nodes by name."""
        return MappingProxyType({n.name: n for n in self.module.graph.nodes})

    @cached_property
    def tensor_nodes(self) -> Mapping[str, tuple[str, ...]]:
        """IR tensor -> the fx nodes whose values are (versions of) it: drop them all to free it."""
        inverse: dict[str, list[str]] = {}
        for node, tensor in self.node_tensors.items():
            inverse.setdefault(tensor, []).append(node)
        return MappingProxyType({t: tuple(ns) for t, ns in inverse.items()})

    @cached_property
    def _getitems(self) -> Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]]:
        return MappingProxyType({n.name: tuple(getitem_paths(n).items()) for n in self.module.graph.nodes})

    def eager_call(self, op: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The ATen call eager PyTorch makes for IR op ``op``: its overload (``EAGER_OVERLOADS``' where
        the capture traced another) and its arguments, each node read as its traced value (a fake tensor)."""
        node = self.nodes[self.op_nodes[op]]
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        return EAGER_OVERLOADS.get(node.target, node.target), tuple(args), dict(kwargs)

    def run_op(self, op: str, env: MutableMapping[str, Any]) -> None:
        """Run IR op ``op`` on the values in ``env`` (keyed by fx node name) and store its results there."""
        self.run_node(self.op_nodes[op], env)

    def run_node(
        self, name: str, env: MutableMapping[str, Any], keys: Mapping[str, str] = MappingProxyType({})
    ) -> None:
        """Run fx node ``name`` on the values in ``env`` and store its results there.

        ``keys`` renames fx node names to env keys, for reads and writes alike: a
        recompute reruns its original's node but keeps its results apart from the
        original's, and its late readers read them from there.
        """
        node = self.nodes[name]
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: env[keys.get(n.name, n.name)])
        result = node.target(*args, **kwargs)  # type: ignore[operator]
        paths = self._getitems[node.name]
        if not paths:
            env[keys.get(node.name, node.name)] = result
            return
        for item, path in paths:
            value = result
            for i in path:
                value = value[i]
            env[keys.get(item, item)] = value

    def bind(self, module: torch.nn.Module, example_inputs: Any) -> dict[str, Any]:
        """Initial ``env`` for ``run_op``: each source's real value, keyed by fx node name.

        Parameters (detached, sharing storage), buffers and inputs are the module's and
        the given ones; optimizer states are fresh zeros on their parameter's device;
        constants come from the GraphModule.  ``example_inputs`` must have the
        structure the program was captured with.
        """
        params = dict(module.named_parameters())
        buffers = dict(module.named_buffers())
        inputs = dict(input_leaves(example_inputs))
        env: dict[str, Any] = {}
        for src in self.sources:
            if src.role is SourceRole.PARAM:
                value = params[src.key].detach()
            elif src.role is SourceRole.BUFFER:
                value = buffers[src.key]
            elif src.role is SourceRole.INPUT:
                if src.key not in inputs:
                    raise CaptureError(f"bind: input {src.key!r} missing; expected inputs {sorted(inputs)}")
                value = inputs[src.key]
            elif src.role is SourceRole.CONSTANT:
                value = getattr(self.module, src.key)
            else:
                spec = self.graph.tensor(src.tensor)
                device = params[src.key].device if src.key else next(iter(params.values())).device
                value = torch.zeros(spec.shape or (), dtype=getattr(torch, spec.dtype or "float32"), device=device)
            if isinstance(value, torch.Tensor) and value.device.type == "meta":
                raise CaptureError(f"bind: source {src.key!r} is on the meta device; executing needs real tensors")
            env[src.node] = value
        return env


def getitem_paths(node: fx.Node) -> dict[str, tuple[int, ...]]:
    """fx node name -> index path, for every (nested) ``getitem`` reading ``node``'s result."""
    paths: dict[str, tuple[int, ...]] = {}
    frontier: list[tuple[fx.Node, tuple[int, ...]]] = [(node, ())]
    while frontier:
        current, prefix = frontier.pop()
        for user in current.users:
            if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
                paths[user.name] = prefix + (user.args[1],)
                frontier.append((user, prefix + (user.args[1],)))
    return paths

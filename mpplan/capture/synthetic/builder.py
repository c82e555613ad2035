"""The builder behind every synthetic generator: forward ops in, a graph with its backward out.

A generator describes its forward pass op by op (``compute``, ``inplace``, ``view``, ``add``,
``loss``); in train mode ``Builder.graph`` then derives the backward pass as autograd would
and appends the optimizer update (the rules are in ``mpplan.capture.synthetic``'s docstring).
Costs follow one roofline model, the one ``capture.torch_capture`` uses too.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.units import DTYPE_BYTES, dtype_bytes

#: Cost model: FLOPs and bytes moved per microsecond, and the per-op floor (a launch).
FLOPS_PER_US = 100e6
BYTES_PER_US = 2e6
MIN_COST_US = 1.0

#: Optimizer state tensors per parameter, by optimizer name.
OPTIMIZER_STATES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"sgd": (), "momentum": ("momentum_buffer",), "adam": ("exp_avg", "exp_avg_sq")}
)

Key = tuple[str, int]
"""A tensor version: its name and how many in-place writes it has seen."""


@dataclass(frozen=True, slots=True)
class _Forward:
    """A forward op as the backward derivation needs it."""

    op: Op
    reads: tuple[Key, ...]
    writes: tuple[Key, ...]
    saved: tuple[str, ...]
    grad_view: bool
    flops: float


class Builder:
    """Collects one generator's forward graph, then derives its backward pass.

    Mutable, but private to one generator call: nothing outlives ``graph()``.
    Tensors are tracked by version so in-place ops (ReLU) differentiate correctly:
    the backward of an in-place op turns the gradient of the version it wrote into
    the gradient of the version it read.
    """

    def __init__(self, dtype: str, seed: int | None, train: bool) -> None:
        self.dtype = dtype
        self.rng = None if seed is None else random.Random(seed)
        self.train = train
        self.tensors: dict[str, Tensor] = {}
        self.version: dict[str, int] = {}
        self.ops: list[Op] = []
        self.forward: list[_Forward] = []  # what the backward derivation needs; train only
        self.params: dict[str, str | None] = {}  # name -> module
        self.loss_name: str | None = None

    # -- tensors

    def _tensor(
        self,
        name: str,
        shape: tuple[int, ...] | None,
        kind: Kind,
        dtype: str | None = None,
        nbytes: int | None = None,
        alias_of: str | None = None,
    ) -> str:
        assert name not in self.tensors, f"synthetic tensor {name!r} defined twice"
        dtype = dtype or self.dtype
        if nbytes is None:
            nbytes = 0 if alias_of is not None else math.prod(shape or ()) * DTYPE_BYTES[dtype.removeprefix("torch.")]
        self.tensors[name] = Tensor(name, nbytes, kind, shape, dtype if shape is not None else None, alias_of)
        self.version[name] = 0
        return name

    def input(self, name: str, shape: tuple[int, ...], dtype: str | None = None) -> str:
        return self._tensor(name, shape, Kind.INPUT, dtype)

    def param(self, name: str, shape: tuple[int, ...], *, module: str | None) -> str:
        self.params[name] = module
        return self._tensor(name, shape, Kind.PARAM)

    # -- ops

    def _cost(self, flops: float, nbytes: float) -> float:
        cost = max(flops / FLOPS_PER_US, nbytes / BYTES_PER_US, MIN_COST_US)
        if self.rng is not None:
            cost *= self.rng.uniform(0.8, 1.2)
        return float(f"{cost:.4g}")

    def _record(
        self,
        op: Op,
        reads: Sequence[str],
        writes: Sequence[str],
        saved: Sequence[str],
        grad_view: bool,
        flops: float = 0.0,
    ) -> None:
        self.ops.append(op)
        if not self.train:
            return
        version = self.version
        before = tuple([(t, version[t]) for t in dict.fromkeys(reads)])
        for t in writes:
            if t in reads:
                version[t] += 1
        after = tuple([(t, version[t]) for t in writes])
        self.forward.append(_Forward(op, before, after, tuple(dict.fromkeys(saved)), grad_view, flops))

    def compute(
        self,
        name: str,
        type: str,
        inputs: Sequence[str],
        shape: tuple[int, ...] | None,
        *,
        module: str | None,
        flops: float = 0.0,
        saved: Sequence[str] | None = None,
        grad_view: bool = False,
        nbytes: int | None = None,
        cost: float | None = None,
    ) -> str:
        """An op writing one new tensor ``name``; ``saved`` (default: the inputs; ``@out``
        is the output) are what its backward reads besides the output's gradient."""
        out = self._tensor(name, shape, Kind.ACTIVATION, nbytes=nbytes)
        moved = sum(self.tensors[t].nbytes for t in inputs) + self.tensors[out].nbytes
        op_cost = self._cost(flops, moved) if cost is None else cost
        op = Op(name, type, tuple(inputs), (out,), op_cost, module=module)
        keep = list(inputs) if saved is None else [out if s == "@out" else s for s in saved]
        self._record(op, inputs, [out], keep, grad_view, flops)
        return out

    def inplace(self, name: str, type: str, target: str, *, module: str | None) -> str:
        """An elementwise op that overwrites ``target``; its backward reads the result."""
        op = Op(name, type, (target,), (target,), self._cost(0.0, 2 * self.tensors[target].nbytes), module=module)
        self._record(op, [target], [target], [target], False)
        return target

    def view(
        self, name: str, type: str, base: str, outputs: Sequence[tuple[str, tuple[int, ...]]], *, module: str | None
    ) -> list[str]:
        """Views of ``base`` (no storage, no cost).  One view passes its gradient back
        as a view too; several (a split) are concatenated by their backward."""
        outs = [self._tensor(t, shape, Kind.ACTIVATION, alias_of=base) for t, shape in outputs]
        self._record(Op(name, type, (base,), tuple(outs), 0.0, module=module), [base], outs, [], len(outs) == 1)
        return outs

    def loss(self, type: str, inputs: Sequence[str]) -> str:
        """The scalar ``loss`` the backward pass starts from; its backward reads ``inputs``."""
        self.loss_name = self.compute("loss", type, inputs, (), module=None)
        return self.loss_name

    def add(self, name: str, a: str, b: str, *, module: str | None) -> str:
        """``a + b``; its backward hands the output gradient to both inputs as views."""
        return self.compute(name, "Add", [a, b], self.tensors[a].shape, module=module, saved=[], grad_view=True)

    # -- the graph

    def graph(self, name: str, outputs: str | Sequence[str], *, optimizer: str | None) -> Graph:
        """The graph: the forward ops, and in train mode the backward and optimizer ops.

        In train mode the loss is the only declared output (parameter gradients and
        optimizer state are static anyway); otherwise ``outputs`` are.
        """
        ops = list(self.ops)
        declared = (outputs,) if isinstance(outputs, str) else tuple(outputs)
        if self.train:
            assert self.loss_name is not None, "a train graph ends in a loss"
            ops += self._backward()
            declared = (self.loss_name,)
            if optimizer is not None and optimizer != "none":
                ops += self._optimizer(optimizer)
        # Valid by construction (the tests validate every kind); the topology is
        # built, and checked, on first use, so building stays cheap.
        return Graph(name, tuple(self.tensors.values()), tuple(ops), declared)

    def _backward(self) -> list[Op]:
        forward = self.forward
        needs_grad = {(p, 0) for p in self.params}
        for f in forward:
            if any(k in needs_grad for k in f.reads):
                needs_grad.update(f.writes)
        final = dict(self.version)
        # Which ops pass gradient back (an input needs one, and an output's reaches
        # the loss), and how many partial gradients each tensor version receives.
        flows: set[Key] = set()
        active: list[bool] = [False] * len(forward)
        partials: dict[Key, int] = {}
        for i in reversed(range(len(forward))):
            f = forward[i]
            if not any(k in needs_grad for k in f.reads):
                continue
            if f.op.name != self.loss_name and not any(k in flows for k in f.writes):
                continue
            active[i] = True
            for k in f.reads:
                if k in needs_grad:
                    flows.add(k)
                    partials[k] = partials.get(k, 0) + 1
        grads: dict[Key, list[str]] = {}
        ops: list[Op] = []
        for i in reversed(range(len(forward))):
            if not active[i]:
                continue
            f = forward[i]
            out_grads = [self._grad_sum(k, grads[k], final, f.op.module, ops) for k in f.writes if k in flows]
            written = []
            for k in f.reads:
                if k not in needs_grad:
                    continue
                tensor, version = k
                base = f"{tensor}.grad" if version == final[tensor] else f"{tensor}.v{version}.grad"
                got = grads.setdefault(k, [])
                gname = base if partials[k] == 1 else f"{base}.{len(got)}"
                assert tensor not in self.params or partials[k] == 1, f"param {tensor!r} is read by several ops"
                source = self.tensors[tensor]
                if f.grad_view:
                    assert len(out_grads) == 1
                    self._grad_tensor(gname, source, alias_of=out_grads[0])
                else:
                    self._grad_tensor(gname, source)
                got.append(gname)
                written.append(gname)
            if f.grad_view:
                cost = 0.0
            else:  # a backward does about twice its forward's arithmetic
                moved = sum(self.tensors[t].nbytes for t in (*out_grads, *f.saved, *written))
                cost = self._cost(2 * f.flops, moved)
            inputs = tuple(dict.fromkeys((*out_grads, *f.saved)))
            ops.append(
                Op(
                    f"{f.op.name}.backward",
                    f"{f.op.type}Backward",
                    inputs,
                    tuple(written),
                    cost,
                    backward_of=f.op.name,
                    module=f.op.module,
                )
            )
        return ops

    def _grad_tensor(self, name: str, of: Tensor, alias_of: str | None = None) -> None:
        if alias_of is not None:
            nbytes = 0
        elif of.alias_of is not None:  # the gradient of a view is a tensor of its own
            assert of.shape is not None and of.dtype is not None
            nbytes = math.prod(of.shape) * dtype_bytes(of.dtype)
        else:
            nbytes = of.nbytes
        self.tensors[name] = Tensor(name, nbytes, Kind.GRAD, of.shape, of.dtype, alias_of, grad_of=of.name)

    def _grad_sum(self, key: Key, parts: list[str], final: dict[str, int], module: str | None, ops: list[Op]) -> str:
        """The gradient of ``key``: its only gradient, or an ``AddN`` of its partials.

        Called once per version, by the op that wrote it, after all its readers'
        backward ops (they come later in the forward, so earlier in the backward).
        """
        if len(parts) == 1:
            return parts[0]
        tensor, version = key
        base = f"{tensor}.grad" if version == final[tensor] else f"{tensor}.v{version}.grad"
        self._grad_tensor(base, self.tensors[tensor])
        moved = (len(parts) + 1) * self.tensors[base].nbytes
        ops.append(Op(f"{base}.sum", "AddN", tuple(parts), (base,), self._cost(0.0, moved), module=module))
        return base

    def _optimizer(self, optimizer: str) -> list[Op]:
        ops = []
        for p, module in self.params.items():
            grad = f"{p}.grad"
            if grad not in self.tensors:
                continue
            param = self.tensors[p]
            states = [self._tensor(f"{p}.{s}", param.shape, Kind.OPTIMIZER_STATE) for s in OPTIMIZER_STATES[optimizer]]
            moved = param.nbytes * (3 + 2 * len(states))
            ops.append(
                Op(
                    f"{p}.step",
                    f"{optimizer.capitalize()}Step",
                    (p, grad, *states),
                    (p, *states),
                    self._cost(0.0, moved),
                    module=module,
                )
            )
        return ops

"""Random valid graphs for property tests, and large synthetic graphs for scale checks.

``graphs(max_ops=...)`` is a hypothesis strategy for ``mpplan.graph.Graph``s that
exercise every memory rule of the IR at once:

* parallel branches and multi-consumer tensors: an op reads any earlier tensor,
  not only the latest one, so tensors fan out and branches join;
* views: ``view`` ops make a tensor with ``alias_of`` its input (no bytes of its own),
  and views of views;
* in-place ops: an op lists an existing tensor (or view) as input and output, so the
  base storage gets a new version; in-place updates of params (optimizer steps) too;
* static storage: inputs, params, optimizer state and param gradients (``grad_of``),
  next to dynamic activations, workspaces and non-param gradients;
* several graph outputs, declared in ``Graph.outputs`` or by kind ``output``, some of
  them views; ops whose outputs nobody reads; zero-byte tensors.

Every drawn graph passes ``Graph.validate()`` and its ops are listed in a valid
order.  Ops are named ``op<i>``; tensors are named after what made them.  Draws
shrink towards fewer, smaller, simpler ops.

``layered_graph`` and ``chain_graph`` build large deterministic graphs (100k ops in a
second or two) for scale checks, without hypothesis.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

from mpplan.graph import Graph, Kind, Op, Tensor

#: What an op does, in the order hypothesis shrinks towards (compute first).
_OP_KINDS = ("compute", "compute2", "view", "inplace", "sink", "optimizer")


@st.composite
def graphs(
    draw: st.DrawFn,
    max_ops: int = 12,
    min_ops: int = 1,
    *,
    max_bytes: int = 64,
    views: bool = True,
    in_place: bool = True,
) -> Graph:
    """A random valid graph of ``min_ops..max_ops`` ops (see the module docstring).

    ``views=False`` / ``in_place=False`` leave out views / in-place ops for tests of
    passes that do not support them yet.  Sizes are ``0..max_bytes`` bytes.
    """
    size = st.integers(0, max_bytes)
    kinds: dict[str, Kind] = {}
    tensors: list[Tensor] = []

    def add(tensor: Tensor) -> str:
        tensors.append(tensor)
        kinds[tensor.name] = tensor.kind
        return tensor.name

    readable: list[str] = []  # tensors an op may read: everything made so far
    writable: list[str] = []  # dynamic tensors and views an in-place op may update
    params: list[str] = []
    for i in range(draw(st.integers(0, 2))):
        readable.append(add(Tensor(f"x{i}", draw(size), Kind.INPUT)))
    for i in range(draw(st.integers(0, 2))):
        params.append(add(Tensor(f"w{i}", draw(size), Kind.PARAM)))
        readable.append(params[-1])
        if draw(st.booleans()):
            readable.append(add(Tensor(f"m{i}", draw(size), Kind.OPTIMIZER_STATE)))
    op_kinds = [k for k in _OP_KINDS if (views or k != "view") and (in_place or k not in ("inplace", "optimizer"))]
    ops: list[Op] = []
    num_ops = draw(st.integers(min_ops, max_ops))
    for k in range(num_ops):
        if len(ops) >= num_ops:
            break
        name = f"op{k}"
        kind = _pick(draw, op_kinds)
        if kind == "optimizer" and len(ops) + 2 > num_ops:
            kind = "compute"
        if kind == "view" and readable:
            base = _pick(draw, readable)
            view = add(Tensor(f"v{k}", 0, kinds[base], alias_of=base))
            readable.append(view)
            if kinds[base] not in _STATIC_KINDS:
                writable.append(view)
            ops.append(Op(name, "view", (base,), (view,)))
        elif kind == "inplace" and writable:
            target = _pick(draw, writable)
            extra = _picks(draw, readable, 1)
            ops.append(Op(name, "inplace", (target, *extra), (target,)))
        elif kind == "optimizer" and params:
            param = _pick(draw, params)
            grad = add(Tensor(f"g{k}", draw(size), Kind.GRAD, grad_of=param))
            ops.append(Op(f"{name}_grad", "grad", tuple(_picks(draw, readable, 2)), (grad,)))
            ops.append(Op(name, "step", (param, grad), (param,)))
            readable.append(grad)
        else:
            inputs = _picks(draw, readable, 3)
            outputs = []
            for o in range(2 if kind == "compute2" else 1):
                out = add(Tensor(f"t{k}_{o}", draw(size), _pick(draw, _OUTPUT_KINDS)))
                outputs.append(out)
                if kind != "sink":  # a sink's outputs are never read
                    readable.append(out)
                    writable.append(out)
            ops.append(Op(name, kind, tuple(inputs), tuple(outputs)))
    made = [t.name for t in tensors if t.kind not in _STATIC_KINDS]
    declared = tuple(_picks(draw, made, 3))
    if made and draw(st.booleans()):
        # One more output by kind rather than by declaration.
        chosen = _pick(draw, made)
        index = next(i for i, t in enumerate(tensors) if t.name == chosen)
        t = tensors[index]
        if t.alias_of is None and t.kind in (Kind.ACTIVATION, Kind.WORKSPACE):
            tensors[index] = Tensor(t.name, t.nbytes, Kind.OUTPUT)
    return Graph("random", tuple(tensors), tuple(ops), declared).validate()


_STATIC_KINDS = (Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE)
_OUTPUT_KINDS = (Kind.ACTIVATION, Kind.ACTIVATION, Kind.GRAD, Kind.WORKSPACE)


def _pick(draw: st.DrawFn, items: list | tuple):
    """One of ``items``, shrinking towards the first (integer draws are cached strategies, so fast)."""
    return items[draw(st.integers(0, len(items) - 1))]


def _picks(draw: st.DrawFn, items: list, max_size: int) -> list:
    """Up to ``max_size`` distinct ``items``, in draw order."""
    if not items:
        return []
    return [items[i] for i in draw(st.lists(st.integers(0, len(items) - 1), max_size=max_size, unique=True))]


def chain_graph(num_ops: int, nbytes: int = 64) -> Graph:
    """``x -> op0 -> t0 -> op1 -> ... -> t{n-1}`` with a param per op; ``t{n-1}`` is the output."""
    tensors = [Tensor("x", nbytes, Kind.INPUT)]
    ops = []
    prev = "x"
    for i in range(num_ops):
        tensors += [Tensor(f"w{i}", 16, Kind.PARAM), Tensor(f"t{i}", nbytes)]
        ops.append(Op(f"op{i}", "linear", (prev, f"w{i}"), (f"t{i}",)))
        prev = f"t{i}"
    return Graph(f"chain{num_ops}", tuple(tensors), tuple(ops), (prev,)).validate()


def layered_graph(num_ops: int, width: int = 8, fan_in: int = 3, seed: int = 0, skip: float = 0.1) -> Graph:
    """A deterministic layered DAG of ``num_ops`` ops for scale checks.

    Ops come in layers of ``width``; each op reads up to ``fan_in`` tensors of the
    previous layer and, with probability ``skip``, one from up to ten layers back (a
    skip connection, so tensors live long).  Sizes vary over two orders of magnitude.
    Every fourth op is a view or an in-place update, so large graphs also exercise
    aliasing.  The last layer's tensors are the outputs.
    """
    rng = random.Random(seed)
    tensors: list[Tensor] = [Tensor("x", 1024, Kind.INPUT)]
    ops: list[Op] = []
    previous = ["x"]
    layers: list[list[str]] = [previous]
    k = 0
    while k < num_ops:
        layer = []
        for _ in range(min(width, num_ops - k)):
            name = f"op{k}"
            if k % 4 == 3 and previous[0] != "x":
                src = rng.choice(previous)
                if rng.random() < 0.5:
                    out = f"v{k}"
                    tensors.append(Tensor(out, 0, alias_of=src))
                    ops.append(Op(name, "view", (src,), (out,)))
                    layer.append(out)
                else:
                    ops.append(Op(name, "inplace", (src,), (src,)))
                    layer.append(src)
            else:
                unique = list(dict.fromkeys(previous))
                inputs = rng.sample(unique, min(len(unique), rng.randint(1, fan_in)))
                if len(layers) > 2 and rng.random() < skip:
                    older = rng.choice(layers[max(0, len(layers) - 12) : len(layers) - 2])
                    pick = rng.choice(older)
                    if pick not in inputs:
                        inputs.append(pick)
                out = f"t{k}"
                tensors.append(Tensor(out, rng.choice((16, 64, 256, 1024, 4096))))
                ops.append(Op(name, "f", tuple(inputs), (out,)))
                layer.append(out)
            k += 1
        layers.append(layer)
        previous = layer
    outputs = tuple(dict.fromkeys(t for t in previous if t != "x"))
    return Graph(f"layered{num_ops}", tuple(tensors), tuple(ops), outputs).validate()


def random_order(graph: Graph, rng: random.Random) -> list[int]:
    """A uniformly drawn ready op at each step: a random topological order of ``graph``."""
    topo = graph.topology
    missing = [len(p) for p in topo.preds]
    ready = [k for k, m in enumerate(missing) if m == 0]
    order = []
    while ready:
        k = ready.pop(rng.randrange(len(ready)))
        order.append(k)
        for s in topo.succs[k]:
            missing[s] -= 1
            if missing[s] == 0:
                ready.append(s)
    return order

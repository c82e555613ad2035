"""Synthetic graphs: deterministic model-shaped graphs for tests and scaling benchmarks.

Five generators, each a pure function of its arguments:

* ``chain(n)``: ``n`` Linear layers in a row, the simplest graph with params.
* ``residual_cnn(blocks)``: a ResNet of basic blocks in four stages, with in-place
  ReLUs (as torchvision builds it) and a flatten view before the classifier.
* ``transformer(layers)``: a pre-norm decoder; q, k and v are views of one qkv
  projection, attention scores are the big ``seq x seq`` tensors.
* ``unet(depth)``: an encoder/decoder whose skip activations live across the
  whole network, the classic hard case for memory planners.
* ``random_layered(n, seed=...)``: a random layered DAG with skip edges, in the
  spirit of the random-layered benchmark graphs of "Neural Topological Ordering
  for Computation Graphs".

Sizes are exact ``int`` bytes from shapes and dtypes (``random_layered``: drawn
sizes, no shapes).  Costs are estimated microseconds on a GPU doing 100 TFLOP/s and
2 TB/s, at least 1 per op, 0 for views.  The four model generators are analytic
unless given a ``seed``, which multiplies each cost by a factor drawn from
[0.8, 1.2] (breaking the ties a scheduler would otherwise meet everywhere; a
chain's seed also draws its widths); ``random_layered`` draws everything from its
seed.  The same arguments always give the same graph.  Op and tensor names are module paths
(``layers.3.attn.qkv``); ``Op.module`` is the innermost module an op belongs to.

``train=True`` appends the backward pass, derived as autograd would: every op with
an input that needs a gradient gets one backward op (``<op>.backward``,
``backward_of`` set) reading the gradients of its outputs and the tensors it saved,
and writing one gradient per input (``<tensor>.grad``, kind ``grad``, ``grad_of``
set).  Activation gradients are dynamic; parameter gradients are static, one per
parameter.  A tensor read by several ops receives partial gradients
(``<tensor>.grad.<i>``) that an ``AddN`` op (``<tensor>.grad.sum``) adds up; the
gradient of a version an in-place op overwrote is ``<tensor>.v<k>.grad``.  The
backward of an addition or a view passes its gradient on as views of it, as
autograd does.  ``optimizer`` (``sgd``, ``momentum`` or ``adam``) then appends one
in-place update op per parameter (``<param>.step``) with its ``optimizer_state``
tensors.

Graphs come back valid by construction but unvalidated: ``Graph.topology``
checks them on first use, so building 100k ops stays cheap.

``synthetic_graph(kind, **kwargs)`` dispatches by name for YAML configs
(``model.synthetic: {kind: transformer, layers: 4}``).
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable, Mapping, Sequence
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


def chain(
    n: int,
    *,
    batch: int = 32,
    width: int = 1024,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """``n`` Linear layers ``layers.<i>`` (no bias) in a row, from input ``x`` of ``[batch, width]``.

    With a ``seed``, each layer's output width is also drawn from
    ``[width / 2, 2 * width]``, so activation sizes vary along the chain.

    >>> g = chain(3, train=True)
    >>> [o.name for o in g.ops]
    ['layers.0', 'layers.1', 'layers.2', 'loss', 'loss.backward', 'layers.2.backward', 'layers.1.backward', 'layers.0.backward']
    """
    _check_common("chain", dtype, train, optimizer, seed, name)
    _positive("chain", n=n, batch=batch, width=width)
    b = _Builder(dtype, seed, train)
    widths = [width] * (n + 1)
    if seed is not None:
        shapes = random.Random(f"chain-widths-{seed}")
        widths = [width] + [shapes.randint(max(1, width // 2), 2 * width) for _ in range(n)]
    h = b.input("x", (batch, widths[0]))
    for i in range(n):
        h = _linear(b, f"layers.{i}", h, widths[i], widths[i + 1], bias=False)
    if train:
        target = b.input("target", (batch, widths[n]))
        b.loss("MSELoss", [h, target])
    return b.graph(name or f"chain{n}", h, optimizer=optimizer)


def residual_cnn(
    blocks: int,
    *,
    batch: int = 32,
    channels: int = 64,
    image: int = 224,
    classes: int = 1000,
    stages: int = 4,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """A ResNet of ``blocks`` basic blocks spread evenly over ``stages`` stages.

    Stem: 7x7 conv (stride 2), batch norm, in-place ReLU, 3x3 max pool (stride 2).
    Stage ``s`` works at ``channels * 2**s`` channels and half the previous
    resolution; its first block downsamples through a 1x1 conv shortcut.  Block:
    conv, bn, ReLU, conv, bn, add the shortcut, ReLU (both ReLUs in place).  Head:
    global average pool, a flatten view, a Linear to ``classes`` logits, and in
    train mode a cross-entropy loss.  Module paths follow torchvision
    (``layer2.0.conv1``, ``layer2.0.downsample.0``).
    """
    _check_common("residual_cnn", dtype, train, optimizer, seed, name)
    _positive(
        "residual_cnn", blocks=blocks, batch=batch, channels=channels, image=image, classes=classes, stages=stages
    )
    b = _Builder(dtype, seed, train)
    size = image
    x = b.input("x", (batch, 3, size, size))
    h, size = _conv(b, "conv1", x, 3, channels, 7, 2, size)
    h = _batchnorm(b, "bn1", h, channels)
    h = _relu(b, "relu", h)
    h = b.compute("maxpool", "MaxPool2d", [h], (batch, channels, _down(size), _down(size)), module="maxpool")
    size = _down(size)
    cin = channels
    per_stage = [blocks // stages + (1 if s < blocks % stages else 0) for s in range(stages)]
    for s, count in enumerate(per_stage):
        cout = channels * 2**s
        for j in range(count):
            p = f"layer{s + 1}.{j}"
            stride = 2 if j == 0 and s > 0 else 1
            shortcut = h
            y, out_size = _conv(b, f"{p}.conv1", h, cin, cout, 3, stride, size)
            y = _relu(b, f"{p}.relu1", _batchnorm(b, f"{p}.bn1", y, cout))
            y, _ = _conv(b, f"{p}.conv2", y, cout, cout, 3, 1, out_size)
            y = _batchnorm(b, f"{p}.bn2", y, cout)
            if stride != 1 or cin != cout:
                shortcut, _ = _conv(b, f"{p}.downsample.0", h, cin, cout, 1, stride, size)
                shortcut = _batchnorm(b, f"{p}.downsample.1", shortcut, cout)
            h = _relu(b, f"{p}.relu2", b.add(f"{p}.add", y, shortcut, module=p))
            cin, size = cout, out_size
    pooled = b.compute("avgpool", "AdaptiveAvgPool2d", [h], (batch, cin, 1, 1), module="avgpool")
    (flat,) = b.view("flatten", "Flatten", pooled, [("flatten", (batch, cin))], module="flatten")
    logits = _linear(b, "fc", flat, cin, classes)
    if train:
        b.loss("CrossEntropyLoss", [logits, b.input("labels", (batch,), "int64")])
    return b.graph(name or f"residual_cnn{blocks}", logits, optimizer=optimizer)


def transformer(
    layers: int,
    *,
    batch: int = 4,
    seq: int = 512,
    hidden: int = 768,
    heads: int = 12,
    ffn: int | None = None,
    vocab: int = 32000,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """A pre-norm decoder of ``layers`` blocks (GPT-2 small sizes by default).

    ``embed`` (token embedding) then per layer ``layers.<i>``: ``ln1``, ``attn.qkv``
    (Linear to ``3 * hidden``), ``attn.split`` (q, k, v as views of qkv),
    ``attn.scores`` (``[batch, heads, seq, seq]``), ``attn.softmax``,
    ``attn.context``, ``attn.proj``, residual ``add1``, ``ln2``, ``mlp.fc1``,
    ``mlp.act`` (GELU), ``mlp.fc2``, residual ``add2``; then ``ln_f``, ``lm_head``
    (logits over ``vocab``) and in train mode a cross-entropy loss.
    ``ffn`` defaults to ``4 * hidden``.
    """
    _check_common("transformer", dtype, train, optimizer, seed, name)
    ffn = 4 * hidden if ffn is None else ffn
    _positive("transformer", layers=layers, batch=batch, seq=seq, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab)
    if hidden % heads:
        raise ValueError(f"transformer: hidden ({hidden}) must be a multiple of heads ({heads})")
    b = _Builder(dtype, seed, train)
    head = hidden // heads
    rows = batch * seq
    bsd = (batch, seq, hidden)
    tokens = b.input("tokens", (batch, seq), "int64")
    table = b.param("embed.weight", (vocab, hidden), module="embed")
    h = b.compute("embed", "Embedding", [tokens, table], bsd, module="embed", saved=[tokens])
    for i in range(layers):
        p = f"layers.{i}"
        a = _layernorm(b, f"{p}.ln1", h, hidden)
        qkv = _linear(b, f"{p}.attn.qkv", a, hidden, 3 * hidden)
        split = [(f"{p}.attn.{x}", (batch, heads, seq, head)) for x in "qkv"]
        q, k, v = b.view(f"{p}.attn.split", "Split", qkv, split, module=f"{p}.attn")
        bhss = (batch, heads, seq, seq)
        scores = b.compute(
            f"{p}.attn.scores", "MatMul", [q, k], bhss, module=f"{p}.attn", flops=2 * rows * seq * hidden
        )
        probs = b.compute(f"{p}.attn.softmax", "Softmax", [scores], bhss, module=f"{p}.attn", saved=["@out"])
        ctx = b.compute(
            f"{p}.attn.context", "MatMul", [probs, v], bsd, module=f"{p}.attn", flops=2 * rows * seq * hidden
        )
        h1 = b.add(f"{p}.add1", h, _linear(b, f"{p}.attn.proj", ctx, hidden, hidden), module=p)
        m = _layernorm(b, f"{p}.ln2", h1, hidden)
        m = _linear(b, f"{p}.mlp.fc1", m, hidden, ffn)
        m = b.compute(f"{p}.mlp.act", "GELU", [m], (batch, seq, ffn), module=f"{p}.mlp.act", flops=8 * rows * ffn)
        h = b.add(f"{p}.add2", h1, _linear(b, f"{p}.mlp.fc2", m, ffn, hidden), module=p)
    h = _layernorm(b, "ln_f", h, hidden)
    logits = _linear(b, "lm_head", h, hidden, vocab, bias=False)
    if train:
        b.loss("CrossEntropyLoss", [logits, b.input("labels", (batch, seq), "int64")])
    return b.graph(name or f"transformer{layers}", logits, optimizer=optimizer)


def unet(
    depth: int,
    *,
    batch: int = 4,
    channels: int = 64,
    image: int = 256,
    classes: int = 2,
    max_channels: int = 1024,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """A U-Net with ``depth`` down- and up-sampling levels.

    Level ``l`` works at ``min(channels * 2**l, max_channels)`` channels and
    ``image / 2**l`` pixels a side (at least 1).  Encoder level: two 3x3 conv +
    in-place ReLU (``down.<l>.conv1``, ...), then a 2x2 max pool; the bottleneck
    (``mid``) is a double conv; decoder level: a 2x2 transposed conv
    (``up.<l>.upconv``), a concat with the encoder's skip activation
    (``up.<l>.cat``), and a double conv.  Head: a 1x1 conv to ``classes`` and in
    train mode a per-pixel cross-entropy loss.
    """
    _check_common("unet", dtype, train, optimizer, seed, name)
    _positive(
        "unet", depth=depth, batch=batch, channels=channels, image=image, classes=classes, max_channels=max_channels
    )
    b = _Builder(dtype, seed, train)

    def width(level: int) -> int:
        return min(channels << min(level, 32), max_channels)

    def side(level: int) -> int:
        return max(1, image >> min(level, 62))

    h = b.input("x", (batch, 3, image, image))
    cin = 3
    skips = []
    for level in range(depth + 1):
        p = "mid" if level == depth else f"down.{level}"
        h = _double_conv(b, p, h, cin, width(level), side(level))
        cin = width(level)
        if level < depth:
            skips.append(h)
            shape = (batch, cin, side(level + 1), side(level + 1))
            h = b.compute(f"{p}.pool", "MaxPool2d", [h], shape, module=f"{p}.pool")
    for level in reversed(range(depth)):
        p = f"up.{level}"
        c, s = width(level), side(level)
        weight = b.param(f"{p}.upconv.weight", (cin, c, 2, 2), module=f"{p}.upconv")
        flops = 2 * batch * s * s * c * cin
        h = b.compute(
            f"{p}.upconv", "ConvTranspose2d", [h, weight], (batch, c, s, s), module=f"{p}.upconv", flops=flops
        )
        h = b.compute(f"{p}.cat", "Cat", [h, skips[level]], (batch, 2 * c, s, s), module=p, saved=[], grad_view=True)
        h = _double_conv(b, p, h, 2 * c, c, s)
        cin = c
    logits, _ = _conv(b, "head", h, cin, classes, 1, 1, image)
    if train:
        b.loss("CrossEntropyLoss", [logits, b.input("labels", (batch, image, image), "int64")])
    return b.graph(name or f"unet{depth}", logits, optimizer=optimizer)


def random_layered(
    n: int,
    *,
    width: int | None = None,
    degree: float = 2.0,
    span: int = 3,
    param_prob: float = 0.5,
    min_bytes: int = 1 << 16,
    max_bytes: int = 1 << 26,
    train: bool = False,
    optimizer: str | None = None,
    seed: int = 0,
    name: str | None = None,
) -> Graph:
    """A random layered DAG of ``n`` ops ``v<i>`` (module ``layers.<l>``), all drawn from ``seed``.

    Layers hold 1 to ``2 * width - 1`` ops (``width`` defaults to ``sqrt(n)``).  Each
    op reads one random op of the layer before (the input ``x`` for the first
    layer) and about ``degree`` more from up to ``span`` layers back, so skip edges
    keep tensors alive across layers.  Output bytes are log-uniform in
    ``[min_bytes, max_bytes]``, costs log-uniform in [1, 1000] microseconds; with
    probability ``param_prob`` an op also reads a ``param`` (``v<i>.weight``).  Ops
    nobody reads are the outputs (in train mode, one loss reads them all).
    """
    _check_common("random_layered", "float32", train, optimizer, seed, name)
    if seed is None:
        raise ValueError("random_layered: seed: expected an integer, got None")
    width = max(1, round(math.sqrt(n))) if width is None else width
    _positive("random_layered", n=n, width=width, span=span, min_bytes=min_bytes, max_bytes=max_bytes)
    for key, value, low, high in (("degree", degree, 0.0, float(n)), ("param_prob", param_prob, 0.0, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"random_layered: {key}: expected a number in [{low:g}, {high:g}], got {value!r}")
    if min_bytes > max_bytes:
        raise ValueError(f"random_layered: min_bytes ({min_bytes}) exceeds max_bytes ({max_bytes})")
    rng = random.Random(seed)
    b = _Builder("float32", None, train)
    x = b.input("x", (max(1, min_bytes // 4),))
    layers: list[list[str]] = []
    count = 0
    read: set[str] = set()
    log_lo, log_hi = math.log(min_bytes), math.log(max_bytes)
    while count < n:
        size = min(n - count, rng.randint(1, 2 * width - 1))
        module = f"layers.{len(layers)}"
        window = [t for layer_ops in layers[-span:] for t in layer_ops]
        layer = []
        for _ in range(size):
            v = f"v{count}"
            count += 1
            inputs = [rng.choice(layers[-1]) if layers else x]
            extra = min(len(window), _binomial(rng, 2 * round(degree), 0.5))
            inputs += [t for t in rng.sample(window, extra) if t not in inputs]
            if rng.random() < param_prob:
                elements = max(1, round(math.exp(rng.uniform(log_lo, log_hi)) / 4))
                inputs.append(b.param(f"{v}.weight", (elements,), module=module))
            nbytes = round(math.exp(rng.uniform(log_lo, log_hi)))
            cost = round(math.exp(rng.uniform(0.0, math.log(1000.0))), 3)
            b.compute(v, "Node", inputs, None, module=module, nbytes=nbytes, cost=cost)
            read.update(inputs)
            layer.append(v)
        layers.append(layer)
    sinks = [v for layer in layers for v in layer if v not in read]
    if train:
        b.loss("Loss", sinks)
    return b.graph(name or f"random_layered{n}_s{seed}", sinks, optimizer=optimizer)


#: The generators ``synthetic_graph`` dispatches to, by kind.
GENERATORS: Mapping[str, Callable[..., Graph]] = MappingProxyType(
    {
        "chain": chain,
        "residual_cnn": residual_cnn,
        "transformer": transformer,
        "unet": unet,
        "random_layered": random_layered,
    }
)


def synthetic_graph(kind: str, **kwargs: object) -> Graph:
    """Build the synthetic graph ``kind`` with ``kwargs``; the entry point for YAML configs.

    Raises ``ValueError`` naming an unknown kind or argument with the accepted ones.

    >>> len(synthetic_graph("chain", n=4).ops)
    4
    """
    if kind not in GENERATORS:
        raise ValueError(f"unknown synthetic graph kind {kind!r}; expected one of {', '.join(GENERATORS)}")
    generator = GENERATORS[kind]
    params = inspect.signature(generator).parameters
    for key in kwargs:
        if key not in params:
            raise ValueError(f"{kind}: unknown argument {key!r}; expected one of {', '.join(params)}")
    for param in params.values():
        if param.default is inspect.Parameter.empty and param.name not in kwargs:
            raise ValueError(f"{kind}: missing argument {param.name!r}; expected one of {', '.join(params)}")
    return generator(**kwargs)


# --- argument checks -----------------------------------------------------------------


def _check_common(kind: str, dtype: object, train: object, optimizer: object, seed: object, name: object) -> None:
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPE_BYTES:
        raise ValueError(f"{kind}: dtype: expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    if not isinstance(train, bool):
        raise ValueError(f"{kind}: train: expected true or false, got {train!r}")
    if optimizer is not None and optimizer != "none" and optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"{kind}: optimizer: expected one of none, {', '.join(OPTIMIZER_STATES)}, got {optimizer!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"{kind}: seed: expected an integer, got {seed!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"{kind}: name: expected a non-empty string, got {name!r}")


def _positive(kind: str, **values: object) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{kind}: {key}: expected a positive integer, got {value!r}")


def _binomial(rng: random.Random, trials: int, p: float) -> int:
    return sum(rng.random() < p for _ in range(trials))


# --- the builder ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Forward:
    """A forward op as the backward derivation needs it."""

    op: Op
    reads: tuple[Key, ...]
    writes: tuple[Key, ...]
    saved: tuple[str, ...]
    grad_view: bool
    flops: float


class _Builder:
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


# --- layers --------------------------------------------------------------------------


def _linear(b: _Builder, name: str, x: str, fin: int, fout: int, *, bias: bool = True) -> str:
    shape = b.tensors[x].shape
    assert shape is not None
    rows = math.prod(shape[:-1])
    params = [b.param(f"{name}.weight", (fout, fin), module=name)]
    if bias:
        params.append(b.param(f"{name}.bias", (fout,), module=name))
    return b.compute(
        name,
        "Linear",
        [x, *params],
        (*shape[:-1], fout),
        module=name,
        flops=2 * rows * fin * fout,
        saved=[x, params[0]],
    )


def _conv(b: _Builder, name: str, x: str, cin: int, cout: int, k: int, stride: int, size: int) -> tuple[str, int]:
    batch = b.tensors[x].shape[0]  # type: ignore[index]
    out = max(1, size // stride)
    weight = b.param(f"{name}.weight", (cout, cin, k, k), module=name)
    flops = 2 * batch * out * out * cout * cin * k * k
    return b.compute(name, "Conv2d", [x, weight], (batch, cout, out, out), module=name, flops=flops), out


def _batchnorm(b: _Builder, name: str, x: str, channels: int) -> str:
    weight = b.param(f"{name}.weight", (channels,), module=name)
    bias = b.param(f"{name}.bias", (channels,), module=name)
    shape = b.tensors[x].shape
    return b.compute(name, "BatchNorm2d", [x, weight, bias], shape, module=name, saved=[x, weight])


def _layernorm(b: _Builder, name: str, x: str, hidden: int) -> str:
    weight = b.param(f"{name}.weight", (hidden,), module=name)
    bias = b.param(f"{name}.bias", (hidden,), module=name)
    shape = b.tensors[x].shape
    return b.compute(name, "LayerNorm", [x, weight, bias], shape, module=name, saved=[x, weight])


def _relu(b: _Builder, name: str, x: str) -> str:
    return b.inplace(name, "ReLU", x, module=name)


def _double_conv(b: _Builder, prefix: str, x: str, cin: int, cout: int, size: int) -> str:
    h, _ = _conv(b, f"{prefix}.conv1", x, cin, cout, 3, 1, size)
    h = _relu(b, f"{prefix}.relu1", h)
    h, _ = _conv(b, f"{prefix}.conv2", h, cout, cout, 3, 1, size)
    return _relu(b, f"{prefix}.relu2", h)


def _down(size: int) -> int:
    return max(1, size // 2)

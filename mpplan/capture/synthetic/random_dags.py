"""Random layered DAGs with skip edges, drawn from a seed (no shapes: sizes and costs are drawn too)."""

from __future__ import annotations

import math
import random

from mpplan.capture.synthetic.arguments import check_common, positive
from mpplan.capture.synthetic.builder import Builder
from mpplan.graph import Graph


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
    check_common("random_layered", "float32", train, optimizer, seed, name)
    if seed is None:
        raise ValueError("random_layered: seed: expected an integer, got None")
    width = max(1, round(math.sqrt(n))) if width is None else width
    positive("random_layered", n=n, width=width, span=span, min_bytes=min_bytes, max_bytes=max_bytes)
    for key, value, low, high in (("degree", degree, 0.0, float(n)), ("param_prob", param_prob, 0.0, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"random_layered: {key}: expected a number in [{low:g}, {high:g}], got {value!r}")
    if min_bytes > max_bytes:
        raise ValueError(f"random_layered: min_bytes ({min_bytes}) exceeds max_bytes ({max_bytes})")
    rng = random.Random(seed)
    b = Builder("float32", None, train)
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


def _binomial(rng: random.Random, trials: int, p: float) -> int:
    return sum(rng.random() < p for _ in range(trials))

"""The simplest synthetic family: a chain of Linear layers, the smallest graph with parameters."""

from __future__ import annotations

import random

from mpplan.capture.synthetic.arguments import check_common, positive
from mpplan.capture.synthetic.builder import Builder
from mpplan.capture.synthetic.layers import linear
from mpplan.graph import Graph


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
    ['layers.0', 'layers.1', 'layers.2', 'loss',
     'loss.backward', 'layers.2.backward', 'layers.1.backward', 'layers.0.backward']
    """
    check_common("chain", dtype, train, optimizer, seed, name)
    positive("chain", n=n, batch=batch, width=width)
    b = Builder(dtype, seed, train)
    widths = [width] * (n + 1)
    if seed is not None:
        shapes = random.Random(f"chain-widths-{seed}")
        widths = [width] + [shapes.randint(max(1, width // 2), 2 * width) for _ in range(n)]
    h = b.input("x", (batch, widths[0]))
    for i in range(n):
        h = linear(b, f"layers.{i}", h, widths[i], widths[i + 1], bias=False)
    if train:
        target = b.input("target", (batch, widths[n]))
        b.loss("MSELoss", [h, target])
    return b.graph(name or f"chain{n}", h, optimizer=optimizer)

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
from collections.abc import Callable, Mapping
from types import MappingProxyType

from mpplan.capture.synthetic.builder import BYTES_PER_US, FLOPS_PER_US, MIN_COST_US, OPTIMIZER_STATES, Key
from mpplan.capture.synthetic.chains import chain
from mpplan.capture.synthetic.convnets import residual_cnn, unet
from mpplan.capture.synthetic.decoder import transformer
from mpplan.capture.synthetic.random_dags import random_layered
from mpplan.graph import Graph
from mpplan.units import DTYPE_BYTES

__all__ = [
    "BYTES_PER_US",
    "DTYPE_BYTES",
    "FLOPS_PER_US",
    "GENERATORS",
    "MIN_COST_US",
    "OPTIMIZER_STATES",
    "Key",
    "chain",
    "random_layered",
    "residual_cnn",
    "synthetic_graph",
    "transformer",
    "unet",
]

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

"""The roofline cost of a captured op, in microseconds (the model ``capture.synthetic`` uses)."""

from __future__ import annotations

import torch
from torch import fx
from torch.utils.flop_counter import flop_registry

#: A GPU doing 100 TFLOP/s and 2 TB/s, as FLOPs and bytes per microsecond, and a floor of one
#: microsecond (a kernel launch) per op.
FLOPS_PER_US = 100e6
BYTES_PER_US = 2e6
MIN_COST_US = 1.0


def logical_bytes(t: torch.Tensor) -> int:
    """The bytes ``t``'s elements take, whatever its strides: what an op reads or writes of it."""
    return t.numel() * t.element_size()


def op_cost(node: fx.Node, moved_bytes: int) -> float:
    """Roofline microseconds: ``max(FLOPs / FLOPS_PER_US, bytes moved / BYTES_PER_US, MIN_COST_US)``.

    FLOPs come from ``torch.utils.flop_counter``'s formula where one exists (matmul,
    conv, attention), else count as 0; bytes moved are the logical sizes read and
    written.
    """
    flops = 0.0
    packet = getattr(node.target, "overloadpacket", None)
    if packet is not None and packet in flop_registry:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
        try:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=node.meta.get("val")))
        except (TypeError, ValueError, IndexError, AttributeError, RuntimeError):
            flops = 0.0  # a formula that does not fit this overload's arguments: bytes decide
    return max(flops / FLOPS_PER_US, moved_bytes / BYTES_PER_US, MIN_COST_US)

"""The fixed placements: everything on one device, or anchors from a ``device_map`` or the ops' own devices."""

from __future__ import annotations

from typing import Mapping, Sequence

from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.place.complete import complete, forward_ops


def place_single(graph: Graph, device: str) -> tuple[str, ...]:
    return tuple(device for _ in graph.ops)


def place_manual(
    graph: Graph, order: Sequence[int], devices: Sequence[str], device_map: Mapping[str, str] | None
) -> tuple[str, ...]:
    """Anchors from ``device_map`` (longest module-path prefix wins; "" matches all) or ``Op.device``."""
    anchors: dict[int, str] = {}
    if device_map:
        prefixes = sorted(device_map, key=len, reverse=True)
        for k in forward_ops(graph, order):
            module = graph.ops[k].module or ""
            for prefix in prefixes:
                if prefix == "" or module == prefix or module.startswith(prefix + "."):
                    anchors[k] = device_map[prefix]
                    break
    else:
        anchors = {k: op.device for k, op in enumerate(graph.ops) if op.device is not None}
    unknown = sorted({d for d in anchors.values() if d not in devices})
    if unknown:
        raise InfeasibleError(f"placement names unknown device {unknown[0]!r}; devices are {', '.join(devices)}")
    if not anchors:
        anchors = {order[0]: devices[0]}
    return complete(graph, order, anchors)

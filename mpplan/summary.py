"""What ``mpplan inspect`` reports about a graph, as one record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from mpplan import sim
from mpplan.graph import Graph


@dataclass(frozen=True, slots=True)
class GraphSummary:
    """Sizes that bound every plan of a graph.

    ``max_op_working_set_bytes``: the most dynamic bytes one op touches (its
    inputs and outputs), a lower bound on LOAD for any order.
    ``as_given_peak_bytes``: static + LOAD of the as-given order when every
    storage is freed right after its last use (a perfect allocator).
    """

    name: str
    hash: str
    ops: int
    tensors: int
    bytes_by_kind: dict[str, int]
    static_bytes: int
    dynamic_bytes: int
    max_op_working_set_bytes: int
    as_given_peak_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(graph: Graph) -> GraphSummary:
    topo = graph.topology
    by_kind: dict[str, int] = {}
    for s in topo.storages:
        kind = graph.tensors[s].kind.value
        by_kind[kind] = by_kind.get(kind, 0) + topo.nbytes[s]
    static = sim.static_bytes(graph)
    return GraphSummary(
        name=graph.name,
        hash=graph.content_hash,
        ops=len(graph.ops),
        tensors=len(graph.tensors),
        bytes_by_kind=dict(sorted(by_kind.items())),
        static_bytes=static,
        dynamic_bytes=sim.no_sharing_bytes(graph),
        max_op_working_set_bytes=sim.max_op_working_set(graph),
        as_given_peak_bytes=static + sim.order_load(graph, range(len(graph.ops))),
    )

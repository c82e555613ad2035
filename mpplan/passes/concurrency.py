"""Happens-before in the op DAG, for plans that any parallel executor can run.

Memonger's DAG rule: two storages may share memory only if every op touching one
is an ancestor of the op that creates the other, so no executor that respects the
graph's edges can run them at the same time.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mpplan.graph import Graph


def ancestor_sets(graph: Graph) -> list[int]:
    """Bitset of strict ancestors per op (bit ``p`` set when ``p`` must run first)."""
    topo = graph.topology
    ancestors = [0] * topo.num_ops
    for k in range(topo.num_ops):  # the as-given order is topological
        bits = 0
        for p in topo.preds[k]:
            bits |= ancestors[p] | (1 << p)
        ancestors[k] = bits
    return ancestors


def dag_may_share(graph: Graph, storages: Sequence[int]) -> Callable[[int, int], bool]:
    """Predicate over indices into ``storages``: True when the DAG orders the two storages."""
    topo = graph.topology
    ancestors = ancestor_sets(graph)
    users: dict[int, int] = {}
    birth: dict[int, int] = {}
    for k, touched in enumerate(topo.op_storages):
        for s in touched:
            users[s] = users.get(s, 0) | (1 << k)
            birth.setdefault(s, k)

    def before(a: int, b: int) -> bool:
        return users[a] & ~ancestors[birth[b]] == 0

    def may_share(i: int, j: int) -> bool:
        a, b = storages[i], storages[j]
        return before(a, b) or before(b, a)

    return may_share

"""The one topological sort: Kahn's algorithm over dense integer ids, with the ready set as a parameter.

The IR's validation, the node-link reader and the DFS/BFS schedulers all walk a DAG
in dependency order and differ only in which ready node runs next; each picks a
discipline here instead of writing its own loop.  It is on the hot path (validating
a 100k-op graph, scheduling it), so it is a plain loop over lists, not networkx.

``ready``:

- ``"fifo"``: nodes run in the order they become ready, ties by id (breadth first);
- ``"lifo"``: the node enabled last runs first, the lowest id first among those one
  node enables (depth first);
- a sequence of ranks: the ready node of least rank runs next (lexicographic by rank).

A node on or behind a cycle never becomes ready: the order returned is then shorter
than the graph, and the caller names a node it lacks.

>>> succs = [[1, 2], [3], [3], []]
>>> topological_order(succs, [0, 1, 1, 2])
[0, 1, 2, 3]
>>> topological_order(succs, [0, 1, 1, 2], ready=[0, 2, 1, 3])
[0, 2, 1, 3]
>>> topological_order([[1], [0]], [1, 1])
[]
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Literal


def topological_order(
    succs: Sequence[Sequence[int]],
    indegree: Sequence[int],
    *,
    ready: Literal["fifo", "lifo"] | Sequence[int] = "fifo",
) -> list[int]:
    """Node ids in a dependency order (see the module docstring); ``succs`` ascending per node for ``lifo``.

    ``indegree[k]`` counts ``k``'s predecessors, each edge once; it is copied, not consumed.
    """
    remaining = list(indegree)
    sources = [k for k, d in enumerate(remaining) if not d]
    order: list[int] = []
    append = order.append
    if ready == "fifo":
        queue = deque(sources)
        pop, push = queue.popleft, queue.append
        while queue:
            k = pop()
            append(k)
            for t in succs[k]:
                remaining[t] -= 1
                if not remaining[t]:
                    push(t)
    elif ready == "lifo":
        stack = sources[::-1]
        while stack:
            k = stack.pop()
            append(k)
            enabled = []
            for t in succs[k]:
                remaining[t] -= 1
                if not remaining[t]:
                    enabled.append(t)
            stack.extend(reversed(enabled))  # the lowest id ends on top
    else:
        rank = ready
        heap = [(rank[k], k) for k in sources]
        heapq.heapify(heap)
        while heap:
            _, k = heapq.heappop(heap)
            append(k)
            for t in succs[k]:
                remaining[t] -= 1
                if not remaining[t]:
                    heapq.heappush(heap, (rank[t], t))
    return order

"""The cheap scheduling heuristics: as given, memonger's longest path, DFS, BFS and two greedy list schedulers.

Each is linear or O(E log V) and deterministic (ties by op id); ``auto`` runs them all
and keeps the best (``HEURISTICS`` lists them in the order it prefers them on equal LOAD).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Literal

from mpplan.graph import Graph
from mpplan.passes.schedule.given import keeps_given_order, queue_keeps_given_order
from mpplan.passes.schedule.memory import TIME_LIMIT, Memory, Order
from mpplan.topo import topological_order


def _as_given(mem: Memory) -> Order:
    return tuple(range(mem.num_ops))


def _dfs(mem: Memory) -> Order:
    """Depth first: the op enabled last runs first, lowest id first among siblings.
    The given order where its choice steps show the walk keeps it (``given``)."""
    return _walk(mem, "lifo")


def _bfs(mem: Memory) -> Order:
    """Breadth first: ops run in the order they become ready, ties by id.
    The given order where its choice steps show the walk keeps it (``given``)."""
    return _walk(mem, "fifo")


def _walk(mem: Memory, ready: Literal["fifo", "lifo"]) -> Order:
    if queue_keeps_given_order(mem, ready):
        return tuple(range(mem.num_ops))
    return tuple(topological_order(mem.succs, [len(p) for p in mem.preds], ready=ready))


def _longest_path(mem: Memory) -> Order:
    """Memonger's ordering, in linear time.

    Memonger finds, for every source, its longest path to a (virtual) single sink,
    merges those paths into a tree rooted at the sink, orders each node's children
    by the height of their subtrees and reads the sources off the leaves; it then
    emits the reverse post-order of a depth-first search started from the sources
    in that order, so the source with the longest path runs first.  Here one
    longest-path successor per op (ties to the lowest id) makes the paths a tree by
    construction, found by dynamic programming instead of one Bellman-Ford per source.
    """
    sources = [v for v in range(mem.num_ops) if not mem.preds[v]]
    # One source is its own tree's only leaf: the heights order nothing.  A training step's graph
    # often has one source (the 100k-op synthetic transformer: 0.20 -> 0.08 CPU s without them).
    return _reverse_postorder(mem, _by_longest_path(mem, sources) if len(sources) > 1 else sources)


def _by_longest_path(mem: Memory, sources: Sequence[int]) -> list[int]:
    """``sources`` as memonger starts them: the leaves of the tree their longest paths form, read
    lowest subtree first (the reverse post-order then runs the longest path first)."""
    n = mem.num_ops
    succs = mem.succs
    # Longest path to the virtual sink ``n``, and the next op on it; ids are a topological order.
    height = [0] * n
    parent = [n] * n
    for v in reversed(range(n)):
        best, best_height = n, 0
        for s in succs[v]:
            if height[s] > best_height:
                best, best_height = s, height[s]
        height[v] = best_height + 1
        parent[v] = best
    # The tree: the union of the sources' paths.
    in_tree = [False] * (n + 1)
    in_tree[n] = True
    for v in sources:
        while not in_tree[v]:
            in_tree[v] = True
            v = parent[v]
    tree_height = [0] * (n + 1)
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for v in range(n):  # a child's id is below its parent's
        if in_tree[v]:
            p = parent[v]
            tree_height[p] = max(tree_height[p], tree_height[v] + 1)
            children[p].append(v)
    leaves = []
    stack = [n]
    while stack:
        v = stack.pop()
        if not children[v]:
            leaves.append(v)
        # Lowest subtree first (ties: lower id, as children are listed); the stack pops the last pushed.
        kids = children[v]
        if len(kids) > 1:
            kids.sort(key=tree_height.__getitem__)
        stack.extend(reversed(kids))
    return leaves if n else []


def _reverse_postorder(mem: Memory, roots: Sequence[int]) -> Order:
    """Reverse post-order of an iterative depth-first search from ``roots`` in turn; lower ids
    first (successors are visited highest id first, so they finish first and come out last)."""
    n = mem.num_ops
    visited = [False] * n
    finished: list[int] = []
    for root in roots:
        if visited[root]:
            continue
        visited[root] = True
        stack = [(root, reversed(mem.succs[root]))]
        while stack:
            v, it = stack[-1]
            for s in it:
                if not visited[s]:
                    visited[s] = True
                    stack.append((s, reversed(mem.succs[s])))
                    break
            else:
                stack.pop()
                finished.append(v)
    return tuple(reversed(finished))


# --- greedy list schedulers ---------------------------------------------------------------------------


def _list_schedule(mem: Memory, peak_first: bool) -> Order:
    """Greedy list scheduling on what each ready op would allocate and free if it ran now.

    ``allocated[k]``: bytes of ``k``'s storages no op has touched yet; ``freed[k]``:
    bytes of its storages whose only remaining toucher is ``k`` (not outputs).  Both
    change only when an op sharing a storage runs; each change re-pushes the op
    (lazy heap updates: only an op's latest entry counts) unless its key came out
    the same, so the whole run is O(E log V).  The last remaining toucher of a storage is the XOR
    of the ids of those that have not run yet.  When the keys at the steps with a choice show
    the run would keep the given order (``given.keeps_given_order``), that order is returned
    without the run.
    """
    n = mem.num_ops
    if keeps_given_order(mem, peak_first):
        return tuple(range(n))
    nbytes, to_end, touchers, storages, succs = mem.nbytes, mem.to_end, mem.touchers, mem.storages, mem.succs
    remaining = [len(t) for t in touchers]
    started = [False] * len(touchers)
    unrun = list(mem.start_unrun)
    allocated = list(mem.start_allocated)
    freed = list(mem.start_freed)
    indegree = [len(p) for p in mem.preds]
    done = [False] * n
    # The op's live heap entry; older entries for it are stale and skipped when popped.
    latest: list[tuple[int, ...] | None] = [None] * n
    heap: list[tuple[int, ...]] = []
    heappush, heappop = heapq.heappush, heapq.heappop
    order = []
    changed = [k for k in range(n) if not indegree[k]]  # ops whose entry may be out of date
    while True:
        for t in changed:
            if not indegree[t] and not done[t]:
                # greedy_free: (-net freed, id); least_peak: (allocated, -net freed, id).
                net = allocated[t] - freed[t]
                pushed: tuple[int, ...] = (allocated[t], net, t) if peak_first else (net, t)
                if pushed != latest[t]:  # an equal live entry is in the heap already (most re-pushes)
                    latest[t] = pushed
                    heappush(heap, pushed)
        while heap:  # the first live entry; entries no longer an op's latest are skipped
            entry = heappop(heap)
            k = entry[-1]
            if entry is latest[k]:
                break
        else:
            break
        latest[k] = None
        done[k] = True
        order.append(k)
        changed = []
        for s in storages[k]:
            if not started[s]:
                started[s] = True
                b = nbytes[s]
                for t in touchers[s]:
                    if t != k:
                        allocated[t] -= b
                        changed.append(t)
            remaining[s] -= 1
            unrun[s] ^= k
            if remaining[s] == 1 and not to_end[s]:
                last = unrun[s]
                freed[last] += nbytes[s]
                changed.append(last)
        for t in succs[k]:
            indegree[t] -= 1
            if not indegree[t]:
                changed.append(t)
    return tuple(order)


def _greedy_free(mem: Memory) -> Order:
    return _list_schedule(mem, peak_first=False)


def _least_peak(mem: Memory) -> Order:
    return _list_schedule(mem, peak_first=True)


#: The cheap heuristics ``auto`` runs, in the order it prefers them on equal LOAD.
HEURISTICS: dict[str, Callable[[Memory], Order]] = {
    "as_given": _as_given,
    "greedy_free": _greedy_free,
    "least_peak": _least_peak,
    "longest_path": _longest_path,
    "dfs": _dfs,
    "bfs": _bfs,
}


# --- local search ---------------------------------------------------------------------------------------


def as_given(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """The graph's own order, 0..n-1 (always valid: ``Graph.validate`` demands it)."""
    return tuple(range(graph.topology.num_ops))


def longest_path(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Caffe2 memonger's longest-path ordering (see ``_longest_path``); O(V + E)."""
    return _longest_path(Memory.of(graph))


def greedy_free(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Mesh TensorFlow's list scheduler: the ready op freeing the most bytes net runs next,
    ties by id; O(E log V)."""
    return _greedy_free(Memory.of(graph))


def least_peak(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """The ready op with the smallest step (live bytes while it runs) runs next, ties by the
    fewest bytes live after it, then by id; O(E log V)."""
    return _least_peak(Memory.of(graph))


def dfs(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Depth-first topological order: the op enabled last runs first, lower ids first; O(V + E)."""
    return _dfs(Memory.of(graph))


def bfs(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Breadth-first topological order: ops run as they become ready, lower ids first; O(V + E)."""
    return _bfs(Memory.of(graph))

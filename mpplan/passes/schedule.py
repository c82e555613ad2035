"""schedule(graph) -> order: a topological order of the ops that keeps few bytes live.

The score of an order is its LOAD, ``mpplan.sim.order_load``: the most dynamic bytes
live at one step, where a storage is live, inclusively, from the first op that
touches it through the last one (graph outputs to the end), so while op ``k`` runs
its inputs, its outputs and everything needed later are all resident.  Static
storage is the same under every order and plays no part.  Every method thinks in
storages, not tensor names: a view or an in-place update touches its base's storage,
and a storage read by several ops dies with the last of them.

Methods (``SCHEDULERS``; all deterministic, ``auto`` for a given seed):

``as_given``
    the graph's own op order.
``longest_path``
    Caffe2 memonger's ordering: sources whose longest path to the end is longer run
    first, grouped by the tree their longest paths form, then a depth-first
    topological order from them.
``greedy_free``
    Mesh TensorFlow's greedy list scheduler: run the ready op that frees the most
    bytes net (bytes whose last use it is, minus bytes it allocates).
``least_peak``
    run the ready op whose own step is smallest (bytes live while it runs), then
    the one leaving the fewest bytes live after it.
``dfs`` / ``bfs``
    depth-first (last enabled, first run) and breadth-first topological orders.
``exact``
    a best-first search over frontiers (``schedule_exact``): the least LOAD, for
    graphs up to a few dozen ops; wider graphs raise ``SearchLimitError``.
``auto``
    every heuristic above, the best kept; then, on graphs of up to
    ``AUTO_EXACT_SMALL_OPS`` ops, the exact search; on larger ones a local search
    bounded by work (hill climbing with single-op moves across the peak steps and
    exact reorderings of short segments around them, then random kicks), and on
    graphs of up to ``AUTO_EXACT_MAX_OPS`` ops a short exact search bounded by its
    result.  Never worse than any heuristic; exact on small graphs; near-linear on
    large ones.

Example: ``A`` makes a large tensor that only ``C`` reads, so ``C`` should run
before ``B`` adds its own output.

>>> from mpplan.graph import Graph, Kind, Op, Tensor
>>> from mpplan.sim import order_load
>>> g = Graph(
...     "fork",
...     (Tensor("x", 8, Kind.INPUT), Tensor("a", 100), Tensor("b", 10), Tensor("c", 1)),
...     (Op("A", "f", ("x",), ("a",)), Op("B", "f", ("x",), ("b",)), Op("C", "f", ("a",), ("c",))),
...     outputs=("b", "c"),
... )
>>> order_load(g, schedule(g, "as_given")), order_load(g, schedule(g, "auto"))
(111, 101)
>>> [g.ops[k].name for k in schedule(g)]
['A', 'C', 'B']
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.passes.schedule_exact import DEFAULT_STATE_LIMIT, SearchLimitError, exact_search, min_peak_order

__all__ = [
    "SCHEDULERS",
    "Order",
    "Scheduler",
    "SearchLimitError",
    "as_given",
    "auto",
    "bfs",
    "dfs",
    "exact",
    "greedy_free",
    "least_peak",
    "longest_path",
    "schedule",
]

Order = tuple[int, ...]

#: Default wall-clock cap, in seconds, on the searching methods (``exact``, ``auto``).
TIME_LIMIT = 10.0

#: ``auto``'s local search stops after this many units of work, so its result does not
#: depend on machine speed.  Units are roughly microseconds of this module's Python:
#: building the search state costs ``BUILD_WORK`` per op, scoring a single-op move
#: ``MOVE_WORK`` plus 2 per step it spans, and an exact reordering of ``SEGMENT_OPS``
#: consecutive steps ``STATE_WORK`` per frontier it generates (at most ``SEGMENT_STATES``).
#: Segments are tried at up to ``SEGMENT_TRIES`` peak steps once single moves fail.
IMPROVE_WORK = 1_000_000
BUILD_WORK = 3
MOVE_WORK = 30
STATE_WORK = 15
SEGMENT_OPS = 12
SEGMENT_STATES = 5_000
SEGMENT_TRIES = 4

#: How far (in steps) the local search looks around a peak step and moves an op.
IMPROVE_RADIUS = 64

#: The iterated local search kicks the order with this many random moves and gives up
#: after this many kicks in a row bring nothing better.
KICK_MOVES = 3
KICK_PATIENCE = 40

#: ``auto`` runs the exact search first on graphs of up to ``AUTO_EXACT_SMALL_OPS``
#: ops, generating up to ``AUTO_EXACT_SMALL_STATES`` frontiers; and last, to polish
#: the local search's order, on graphs of up to ``AUTO_EXACT_MAX_OPS`` ops, generating
#: up to ``AUTO_EXACT_WORK`` / n frontiers.
AUTO_EXACT_SMALL_OPS = 20
AUTO_EXACT_SMALL_STATES = 50_000
AUTO_EXACT_MAX_OPS = 400
AUTO_EXACT_WORK = 500_000


class Scheduler(Protocol):
    """A scheduling method: a valid op order of ``graph``.  ``seed`` and ``time_limit``
    steer the searching methods and are accepted, unused, by the others."""

    def __call__(self, graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order: ...


def schedule(graph: Graph, method: str = "auto", *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """A topological order of ``graph``'s op ids chosen by ``method`` (see the module docstring).

    ``time_limit`` caps the seconds ``exact`` and ``auto`` search; ``auto`` is
    bounded by work first, so the cap only binds on very slow machines, and then its
    result may depend on machine speed.  Raises ``ConfigError`` for an unknown method
    and ``SearchLimitError`` when ``exact`` meets a graph too wide for it.
    """
    if method not in SCHEDULERS:
        raise ConfigError(f"schedule method: expected one of {', '.join(SCHEDULERS)}, got {method!r}")
    if time_limit <= 0:
        raise ConfigError(f"schedule time_limit: expected a positive number of seconds, got {time_limit!r}")
    return SCHEDULERS[method](graph, seed=seed, time_limit=time_limit)


# --- the memory model every method scores against ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Memory:
    """The op DAG and the dynamic storages each op touches, in dense local storage ids.

    Static storages are dropped: they are live under every order.  ``touchers[s]``
    lists, ascending, the ops that touch storage ``s``; ``to_end[s]`` marks graph
    outputs, which stay live once made.
    """

    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    storages: tuple[tuple[int, ...], ...]
    nbytes: tuple[int, ...]
    touchers: tuple[tuple[int, ...], ...]
    to_end: tuple[bool, ...]

    @staticmethod
    def of(graph: Graph) -> _Memory:
        topo = graph.topology
        is_static, nbytes_of, outputs = topo.is_static, topo.nbytes, topo.output_storages
        local = [-1] * len(is_static)
        storages: list[tuple[int, ...]] = []
        touchers: list[list[int]] = []
        nbytes: list[int] = []
        to_end: list[bool] = []
        for k, ids in enumerate(topo.op_storages):
            mine = []
            for s in ids:
                if is_static[s]:
                    continue
                i = local[s]
                if i < 0:
                    i = local[s] = len(nbytes)
                    touchers.append([])
                    nbytes.append(nbytes_of[s])
                    to_end.append(s in outputs)
                mine.append(i)
                touchers[i].append(k)
            storages.append(tuple(mine))
        return _Memory(
            preds=topo.preds,
            succs=topo.succs,
            storages=tuple(storages),
            nbytes=tuple(nbytes),
            touchers=tuple(map(tuple, touchers)),
            to_end=tuple(to_end),
        )

    @property
    def num_ops(self) -> int:
        return len(self.preds)

    def profile(self, order: Sequence[int]) -> list[int]:
        """Bytes live at each step of ``order``; equals ``sim.live_profile`` of its ranges."""
        nbytes, to_end = self.nbytes, self.to_end
        remaining = [len(t) for t in self.touchers]
        started = [False] * len(remaining)
        live = 0
        steps = []
        for k in order:
            storages = self.storages[k]
            for s in storages:
                if not started[s]:
                    started[s] = True
                    live += nbytes[s]
            steps.append(live)
            for s in storages:
                remaining[s] -= 1
                if not remaining[s] and not to_end[s]:
                    live -= nbytes[s]
        return steps

    def load(self, order: Sequence[int]) -> int:
        """LOAD of ``order``; equals ``sim.order_load`` without building live ranges."""
        return max(self.profile(order), default=0)


# --- traversals -----------------------------------------------------------------------------------------


def _as_given(mem: _Memory) -> Order:
    return tuple(range(mem.num_ops))


def _dfs(mem: _Memory) -> Order:
    """Kahn's algorithm with a stack: the op enabled last runs first, lowest id first among siblings."""
    indegree = [len(p) for p in mem.preds]
    stack = [k for k in reversed(range(mem.num_ops)) if not indegree[k]]
    order = []
    while stack:
        k = stack.pop()
        order.append(k)
        enabled = []
        for t in mem.succs[k]:
            indegree[t] -= 1
            if not indegree[t]:
                enabled.append(t)
        stack.extend(reversed(enabled))  # succs ascend, so the lowest id is on top
    return tuple(order)


def _bfs(mem: _Memory) -> Order:
    """Kahn's algorithm with a queue: ops run in the order they become ready, ties by id."""
    indegree = [len(p) for p in mem.preds]
    queue = deque(k for k in range(mem.num_ops) if not indegree[k])
    order = []
    while queue:
        k = queue.popleft()
        order.append(k)
        for t in mem.succs[k]:
            indegree[t] -= 1
            if not indegree[t]:
                queue.append(t)
    return tuple(order)


def _longest_path(mem: _Memory) -> Order:
    """Memonger's ordering, in linear time.

    Memonger finds, for every source, its longest path to a (virtual) single sink,
    merges those paths into a tree rooted at the sink, orders each node's children
    by the height of their subtrees and reads the sources off the leaves; it then
    emits the reverse post-order of a depth-first search started from the sources
    in that order, so the source with the longest path runs first.  Here one
    longest-path successor per op (ties to the lowest id) makes the paths a tree by
    construction, found by dynamic programming instead of one Bellman-Ford per source.
    """
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
    sources = [v for v in range(n) if not mem.preds[v]]
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
    return _reverse_postorder(mem, leaves if n else [])


def _reverse_postorder(mem: _Memory, roots: Sequence[int]) -> Order:
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


def _list_schedule(mem: _Memory, peak_first: bool) -> Order:
    """Greedy list scheduling on what each ready op would allocate and free if it ran now.

    ``allocated[k]``: bytes of ``k``'s storages no op has touched yet; ``freed[k]``:
    bytes of its storages whose only remaining toucher is ``k`` (not outputs).  Both
    change only when an op sharing a storage runs; each change re-pushes the op
    (lazy heap updates: only an op's latest entry counts), so the whole run is
    O(E log V).  The last remaining toucher of a storage is the XOR
    of the ids of those that have not run yet.
    """
    n = mem.num_ops
    nbytes, to_end, touchers, storages, succs = mem.nbytes, mem.to_end, mem.touchers, mem.storages, mem.succs
    remaining = [len(t) for t in touchers]
    started = [False] * len(touchers)
    unrun = [0] * len(touchers)
    for s, ts in enumerate(touchers):
        x = 0
        for t in ts:
            x ^= t
        unrun[s] = x
    allocated = [sum([nbytes[s] for s in st]) for st in storages]
    freed = [sum([nbytes[s] for s in st if remaining[s] == 1 and not to_end[s]]) for st in storages]
    indegree = [len(p) for p in mem.preds]
    done = [False] * n
    # The op's live heap entry; older entries for it are stale and skipped when popped.
    latest: list[tuple[int, ...] | None] = [None] * n
    heap: list[tuple[int, ...]] = []

    def push(k: int) -> None:
        # greedy_free: (-net freed, id); least_peak: (allocated, -net freed, id).
        net = allocated[k] - freed[k]
        entry = (allocated[k], net, k) if peak_first else (net, k)
        latest[k] = entry
        heapq.heappush(heap, entry)

    for k in range(n):
        if not indegree[k]:
            push(k)
    order = []
    while heap:
        entry = heapq.heappop(heap)
        k = entry[-1]
        if entry is not latest[k]:
            continue
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
        for t in changed:
            if not indegree[t] and not done[t]:
                push(t)
    return tuple(order)


def _greedy_free(mem: _Memory) -> Order:
    return _list_schedule(mem, peak_first=False)


def _least_peak(mem: _Memory) -> Order:
    return _list_schedule(mem, peak_first=True)


#: The cheap heuristics ``auto`` runs, in the order it prefers them on equal LOAD.
_HEURISTICS: dict[str, Callable[[_Memory], Order]] = {
    "as_given": _as_given,
    "greedy_free": _greedy_free,
    "least_peak": _least_peak,
    "longest_path": _longest_path,
    "dfs": _dfs,
    "bfs": _bfs,
}


# --- local search ---------------------------------------------------------------------------------------


class _MaxTree:
    """A segment tree over the step profile: range maximum and point updates in O(log n)."""

    def __init__(self, values: Sequence[int]) -> None:
        size = 1
        while size < max(1, len(values)):
            size *= 2
        tree = [-1] * (2 * size)
        tree[size : size + len(values)] = values
        for i in range(size - 1, 0, -1):
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
        self.size, self.tree = size, tree

    @property
    def top(self) -> int:
        return self.tree[1]

    def set(self, i: int, value: int) -> None:
        tree = self.tree
        i += self.size
        tree[i] = value
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2

    def max(self, lo: int, hi: int) -> int:
        """Largest value in ``[lo, hi)``; -1 when empty."""
        tree = self.tree
        best = -1
        lo += self.size
        hi += self.size
        while lo < hi:
            if lo & 1:
                best = max(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = max(best, tree[hi])
            lo //= 2
            hi //= 2
        return best

    def first_at_least(self, start: int, value: int) -> int:
        """The first index ``>= start`` holding at least ``value``; -1 when none."""
        tree, size = self.tree, self.size
        i = start + size
        while True:
            if tree[i] >= value:
                while i < size:
                    i = 2 * i if tree[2 * i] >= value else 2 * i + 1
                return i - size
            while i & 1:
                i //= 2
            if not i:
                return -1
            i += 1


@dataclass(frozen=True, slots=True)
class _Move:
    """A new order of the steps from ``lo`` on (``ops``), their profile (``window``), the
    storages whose first or last toucher may change, and the score it gives (see ``_Climber``)."""

    lo: int
    ops: tuple[int, ...]
    window: list[int]
    storages: tuple[int, ...]
    score: tuple[int, int, int]


class _Climber:
    """One order under local search, with what makes a move cheap to score.

    The profile (bytes live per step) sits in a max segment tree and a histogram,
    and each storage remembers its first and last toucher.  Moving op ``k`` from
    position ``i`` to ``j`` changes the profile only between them, so a move is
    scored in O(|i - j| + touchers of ``k``'s storages + log n) without simulating
    the order again.  A move's score is (LOAD, steps at LOAD, change of the summed
    profile), lexicographically: lowering the peak is the goal, fewer peak steps and
    fewer byte-steps are progress towards it, and a strictly falling score cannot cycle.
    """

    def __init__(self, mem: _Memory, order: Sequence[int]) -> None:
        self.mem = mem
        self.order = list(order)
        self.pos = [0] * mem.num_ops
        for x, k in enumerate(self.order):
            self.pos[k] = x
        self.first = [-1] * len(mem.nbytes)
        self.last = [-1] * len(mem.nbytes)
        for k in self.order:
            for s in mem.storages[k]:
                if self.first[s] < 0:
                    self.first[s] = k
                self.last[s] = k
        self.profile = mem.profile(self.order)
        self.tree = _MaxTree(self.profile)
        self.histogram = Counter(self.profile)
        self.optimal_pieces: set[tuple[tuple[int, ...], tuple[bool, ...], tuple[bool, ...]]] = set()

    @property
    def score(self) -> tuple[int, int, int]:
        """The score of the current order; moves are compared with it."""
        peak = self.tree.top
        return peak, self.histogram[peak], 0

    def peak_steps(self, start: int) -> Iterator[int]:
        """Each step at the current LOAD once, from the first at or after ``start`` on, cyclically."""
        peak, at_peak, _ = self.score
        p = start
        for _ in range(at_peak):
            p = self.tree.first_at_least(p, peak)
            if p < 0:
                p = self.tree.first_at_least(0, peak)
            yield p
            p += 1
            if p == len(self.order):
                p = 0

    def window(self, k: int) -> tuple[int, int]:
        """Positions ``k`` may move to: after its last predecessor, before its first successor."""
        pos = self.pos
        lo = max((pos[p] for p in self.mem.preds[k]), default=-1) + 1
        hi = min((pos[s] for s in self.mem.succs[k]), default=len(pos)) - 1
        return lo, hi

    def candidates(self, p: int, radius: int) -> list[tuple[int, int]]:
        """Moves that may lower step ``p``: ops starting a storage that outlives ``p`` moved after
        it, ops ending one that was born before ``p`` moved before it, and ``p``'s own op."""
        mem, order, pos, first, last = self.mem, self.order, self.pos, self.first, self.last
        n = len(order)
        moves: list[tuple[int, int]] = []
        for x in range(max(0, p - radius), p):
            y = order[x]
            if any(first[s] == y and (mem.to_end[s] or pos[last[s]] > p) for s in mem.storages[y]):
                hi = self.window(y)[1]
                if hi >= p:
                    moves.append((y, p))
                    if min(hi, p + radius) > p:
                        moves.append((y, min(hi, p + radius)))
        for x in range(p + 1, min(n, p + radius + 1)):
            y = order[x]
            if any(last[s] == y and not mem.to_end[s] and pos[first[s]] < p for s in mem.storages[y]):
                lo = self.window(y)[0]
                if lo <= p:
                    moves.append((y, p))
                    if max(lo, p - radius) < p:
                        moves.append((y, max(lo, p - radius)))
        y = order[p]
        lo, hi = self.window(y)
        for to in (max(lo, p - radius), min(hi, p + radius)):
            if to != p:
                moves.append((y, to))
        return moves

    def evaluate(self, k: int, j: int) -> _Move:
        """Score moving op ``k`` to position ``j`` (inside its window) without making the move."""
        mem, order, pos, profile, first, last = self.mem, self.order, self.pos, self.profile, self.first, self.last
        n = len(order)
        i = pos[k]
        lo, hi = min(i, j), max(i, j)

        def moved(p: int) -> int:
            if i < j:
                return p - 1 if i < p <= j else p
            return p + 1 if j <= p < i else p

        # Each of k's storages: bytes, old live steps [of, ol], new live steps [nf, nl].
        ranges = []
        for s in mem.storages[k]:
            f, l_ = first[s], last[s]
            of, ol = pos[f], pos[l_]
            if f != k:
                nf = min(moved(of), j)
            else:
                nf = min([moved(pos[t]) for t in mem.touchers[s] if t != k] + [j])
            if l_ != k:
                nl = max(moved(ol), j)
            else:
                nl = max([moved(pos[t]) for t in mem.touchers[s] if t != k] + [j])
            if mem.to_end[s]:
                ol = nl = n - 1
            ranges.append((mem.nbytes[s], of, ol, nf, nl))
        own = sum(r[0] for r in ranges)
        # k's step: what outlives its new neighbour on the near side, plus its own storages.
        neighbour = order[j]
        gap = profile[j] - sum(b for b, of, ol, _, _ in ranges if of <= j <= ol)
        mine = mem.storages[k]
        if i < j:  # k runs right after ``neighbour``: drop what dies there
            gap -= sum(
                mem.nbytes[s]
                for s in mem.storages[neighbour]
                if s not in mine and not mem.to_end[s] and last[s] == neighbour
            )
        else:  # k runs right before ``neighbour``: drop what is born there
            gap -= sum(mem.nbytes[s] for s in mem.storages[neighbour] if s not in mine and first[s] == neighbour)
        window = []
        shift = 1 if i < j else -1
        for x in range(lo, hi + 1):
            if x == j:
                window.append(gap + own)
                continue
            old = x + shift
            v = profile[old]
            for b, of, ol, nf, nl in ranges:
                if of <= old <= ol:
                    v -= b
                if nf <= x <= nl:
                    v += b
            window.append(v)
        ops = order[lo : hi + 1]
        if i < j:
            ops = ops[1:] + [k]
        else:
            ops = [k] + ops[:-1]
        return self._move(lo, ops, window, mem.storages[k])

    def reorder(self, lo: int, hi: int, budget: _Budget) -> _Move | None:
        """The best reordering of steps ``lo..hi`` if it lowers their largest step, found by
        the exact search on that piece (``schedule_exact.min_peak_order``), else None.
        Pieces known to be optimal already are skipped for free."""
        mem, pos, first, last = self.mem, self.pos, self.first, self.last
        ops = self.order[lo : hi + 1]
        local = {k: i for i, k in enumerate(ops)}
        storages = list(dict.fromkeys(s for k in ops for s in mem.storages[k]))
        index = {s: i for i, s in enumerate(storages)}
        before = [pos[first[s]] < lo for s in storages]
        after = [mem.to_end[s] or pos[last[s]] > hi for s in storages]
        # The piece is the whole subproblem: same ops, order and boundary, same answer.
        key = (tuple(ops), tuple(before), tuple(after))
        if key in self.optimal_pieces:
            return None
        # The piece's own bytes at each step; the rest lives across it and is the same for every order.
        own = self._piece_profile(ops, storages, before, after)
        base = self.profile[lo] - own[0]
        limit = min(SEGMENT_STATES, budget.units // STATE_WORK + 1)
        try:
            better, generated = min_peak_order(
                [[local[q] for q in mem.preds[k] if q in local] for k in ops],
                [[index[s] for s in mem.storages[k]] for k in ops],
                [mem.nbytes[s] for s in storages],
                before=before,
                after=after,
                bound=max(own),
                state_limit=limit,
            )
        except SearchLimitError:
            budget.units -= STATE_WORK * limit
            return None
        budget.units -= STATE_WORK * generated
        if better is None:
            self.optimal_pieces.add(key)
            return None
        new_ops = [ops[i] for i in better]
        window = [base + v for v in self._piece_profile(new_ops, storages, before, after)]
        return self._move(lo, new_ops, window, tuple(storages))

    def _piece_profile(
        self, ops: Sequence[int], storages: Sequence[int], before: Sequence[bool], after: Sequence[bool]
    ) -> list[int]:
        """Bytes of ``storages`` live at each step of ``ops`` run in that order (see ``reorder``)."""
        mem = self.mem
        index = {s: i for i, s in enumerate(storages)}
        remaining = [0] * len(storages)
        for k in ops:
            for s in mem.storages[k]:
                remaining[index[s]] += 1
        started = list(before)
        live = sum(mem.nbytes[s] for s, b in zip(storages, before) if b)
        steps = []
        for k in ops:
            for s in mem.storages[k]:
                i = index[s]
                if not started[i]:
                    started[i] = True
                    live += mem.nbytes[s]
            steps.append(live)
            for s in mem.storages[k]:
                i = index[s]
                remaining[i] -= 1
                if not remaining[i] and not after[i]:
                    live -= mem.nbytes[s]
        return steps

    def _move(self, lo: int, ops: Sequence[int], window: list[int], storages: Sequence[int]) -> _Move:
        hi = lo + len(ops) - 1
        before = self.profile[lo : hi + 1]
        peak = max(self.tree.max(0, lo), self.tree.max(hi + 1, len(self.order)), max(window))
        at_peak = self.histogram[peak] - before.count(peak) + window.count(peak)
        return _Move(lo, tuple(ops), window, tuple(storages), (peak, at_peak, sum(window) - sum(before)))

    def apply(self, move: _Move) -> _Move:
        """Make ``move``; returns the move that undoes it."""
        mem, order, pos = self.mem, self.order, self.pos
        lo, hi = move.lo, move.lo + len(move.ops)
        undo = _Move(lo, tuple(order[lo:hi]), self.profile[lo:hi], move.storages, self.score)
        order[lo:hi] = move.ops
        for x, (k, value) in enumerate(zip(move.ops, move.window), start=lo):
            pos[k] = x
            old = self.profile[x]
            self.histogram[old] -= 1
            if not self.histogram[old]:
                del self.histogram[old]
            self.histogram[value] += 1
            self.profile[x] = value
            self.tree.set(x, value)
        for s in move.storages:
            self.first[s] = min(mem.touchers[s], key=pos.__getitem__)
            self.last[s] = max(mem.touchers[s], key=pos.__getitem__)
        return undo


@dataclass(slots=True)
class _Budget:
    """What the local search may still spend: work units (roughly microseconds of this
    module's Python, counted so results do not depend on machine speed) and a deadline."""

    units: int
    deadline: float

    @property
    def exhausted(self) -> bool:
        return self.units <= 0 or time.monotonic() >= self.deadline


def _climb(climber: _Climber, rng: random.Random, budget: _Budget) -> list[_Move]:
    """Hill-climb until no move lowers the score (see ``_Climber``) or the budget runs out.

    At the peak steps, from a random one on, try first the single-op moves around
    each, then an exact reordering of the ``SEGMENT_OPS`` steps around each; make the
    best improving move found at the first step that has one.  Returns the inverses of
    the moves made, in order, so a caller can undo them.
    """
    n = len(climber.order)
    undo: list[_Move] = []
    while not budget.exhausted:
        current = climber.score
        best: _Move | None = None
        for p in climber.peak_steps(rng.randrange(n)):
            for k, j in climber.candidates(p, IMPROVE_RADIUS):
                budget.units -= MOVE_WORK + 2 * abs(climber.pos[k] - j)
                move = climber.evaluate(k, j)
                if move.score < (best.score if best is not None else current):
                    best = move
            if best is not None or budget.exhausted:
                break
        if best is None:
            for p in itertools.islice(climber.peak_steps(rng.randrange(n)), SEGMENT_TRIES):
                if budget.exhausted:
                    break
                lo = max(0, min(p - SEGMENT_OPS // 2, n - SEGMENT_OPS))
                reordered = climber.reorder(lo, min(n, lo + SEGMENT_OPS) - 1, budget)
                if reordered is not None and reordered.score < current:
                    best = reordered
                    break
        if best is None:
            break
        undo.append(climber.apply(best))
    return undo


def _kick(climber: _Climber, rng: random.Random, budget: _Budget) -> list[_Move]:
    """Perturb the order: ``KICK_MOVES`` random valid moves of ops near a random peak step.
    Returns the inverses of the moves made."""
    n = len(climber.order)
    p = next(climber.peak_steps(rng.randrange(n)))
    undo = []
    for _ in range(KICK_MOVES):
        x = rng.randint(max(0, p - IMPROVE_RADIUS), min(n - 1, p + IMPROVE_RADIUS))
        k = climber.order[x]
        lo, hi = climber.window(k)
        j = rng.randint(max(lo, x - IMPROVE_RADIUS), min(hi, x + IMPROVE_RADIUS))
        if j != x:
            budget.units -= MOVE_WORK + 2 * abs(x - j)
            undo.append(climber.apply(climber.evaluate(k, j)))
    return undo


def _local_search(mem: _Memory, starts: Sequence[Order], rng: random.Random, budget: _Budget) -> tuple[Order, int]:
    """Improve the best of ``starts`` (ascending LOAD) within ``budget``; its order and LOAD.

    Each start is hill-climbed in turn (building a climber costs ``BUILD_WORK`` units
    per op); then an iterated local search kicks the best one and climbs again,
    keeping the result unless it is worse, until ``KICK_PATIENCE`` rounds in a row
    bring nothing better.
    """
    best: _Climber | None = None
    for start in starts:
        if budget.exhausted and best is not None:
            break
        budget.units -= BUILD_WORK * mem.num_ops
        climber = _Climber(mem, start)
        _climb(climber, rng, budget)
        if best is None or climber.tree.top < best.tree.top:
            best = climber
    assert best is not None, "at least one start"
    best_load = best.tree.top
    stale = 0
    while stale < KICK_PATIENCE and not budget.exhausted:
        undo = _kick(best, rng, budget)
        undo += _climb(best, rng, budget)
        load = best.tree.top
        if load < best_load:
            best_load, stale = load, 0
            continue
        stale += 1
        if load > best_load:
            for move in reversed(undo):
                best.apply(move)
    return tuple(best.order), best_load


# --- public methods -----------------------------------------------------------------------------------


def as_given(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """The graph's own order, 0..n-1 (always valid: ``Graph.validate`` demands it)."""
    return tuple(range(graph.topology.num_ops))


def longest_path(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Caffe2 memonger's longest-path ordering (see ``_longest_path``); O(V + E)."""
    return _longest_path(_Memory.of(graph))


def greedy_free(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Mesh TensorFlow's list scheduler: the ready op freeing the most bytes net runs next,
    ties by id; O(E log V)."""
    return _greedy_free(_Memory.of(graph))


def least_peak(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """The ready op with the smallest step (live bytes while it runs) runs next, ties by the
    fewest bytes live after it, then by id; O(E log V)."""
    return _least_peak(_Memory.of(graph))


def dfs(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Depth-first topological order: the op enabled last runs first, lower ids first; O(V + E)."""
    return _dfs(_Memory.of(graph))


def bfs(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """Breadth-first topological order: ops run as they become ready, lower ids first; O(V + E)."""
    return _bfs(_Memory.of(graph))


def exact(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """An order of least LOAD, found by ``schedule_exact.exact_search`` bounded by the best
    greedy order.  Raises ``SearchLimitError`` past ``DEFAULT_STATE_LIMIT`` frontiers or
    ``time_limit`` seconds: exact for graphs of up to a few dozen ops, or narrow larger ones."""
    mem = _Memory.of(graph)
    bound = min((_greedy_free(mem), _least_peak(mem)), key=mem.load)
    return exact_search(
        graph, upper_bound=bound, state_limit=DEFAULT_STATE_LIMIT, deadline=time.monotonic() + time_limit
    )


def auto(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """The best order the heuristics, a local search and the exact search find.

    Runs every heuristic and keeps the lowest LOAD, so it is never worse than any of
    them.  Graphs of up to ``AUTO_EXACT_SMALL_OPS`` ops then get the exact search
    (optimal unless the graph is too wide for ``AUTO_EXACT_SMALL_STATES`` frontiers).
    Otherwise a local search spends ``IMPROVE_WORK`` units on the heuristics' orders,
    and graphs of up to ``AUTO_EXACT_MAX_OPS`` ops get a short exact search bounded by
    its result (``AUTO_EXACT_WORK`` / n frontiers).  Everything past the heuristics is
    bounded by work, so ``auto`` is near-linear and, for a given ``seed``, deterministic
    unless ``time_limit`` cuts it short.
    """
    deadline = time.monotonic() + time_limit
    mem = _Memory.of(graph)
    n = mem.num_ops
    found: dict[Order, int] = {}
    for heuristic in _HEURISTICS.values():
        order = heuristic(mem)
        if order not in found:
            found[order] = mem.load(order)
    ranked = sorted(found, key=found.__getitem__)  # stable: ties keep _HEURISTICS' preference
    best, best_load = ranked[0], found[ranked[0]]
    if n <= AUTO_EXACT_SMALL_OPS:
        try:
            return exact_search(graph, upper_bound=best, state_limit=AUTO_EXACT_SMALL_STATES, deadline=deadline)
        except SearchLimitError:
            pass  # too wide: search locally instead
    if n >= 2:
        order, load = _local_search(mem, ranked, random.Random(seed), _Budget(IMPROVE_WORK, deadline))
        if load < best_load:
            best, best_load = order, load
    if AUTO_EXACT_SMALL_OPS < n <= AUTO_EXACT_MAX_OPS:
        try:
            best = exact_search(graph, upper_bound=best, state_limit=AUTO_EXACT_WORK // n, deadline=deadline)
        except SearchLimitError:
            pass  # too wide for an exact order: keep the local search's
    return best


#: Every method by name, all with the ``Scheduler`` signature.
SCHEDULERS: dict[str, Scheduler] = {
    "as_given": as_given,
    "longest_path": longest_path,
    "greedy_free": greedy_free,
    "least_peak": least_peak,
    "dfs": dfs,
    "bfs": bfs,
    "exact": exact,
    "auto": auto,
}

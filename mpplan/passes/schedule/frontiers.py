"""The exact scheduler: a best-first search over frontiers for the order of least LOAD.

Which ops have run (a *frontier*, a down-closed set of ops) decides which storages
are live, so the search walks sets of executed ops rather than orders: n ops have
at most 2**n frontiers, usually far fewer, while they have up to n! orders.  The
cost of a path is the largest step it takes (the LOAD of the order it spells), so
the search is Dijkstra's algorithm for minimax paths, guided by a lower bound on
the steps still to come (A*), pruned by the LOAD of a known order (branch and
bound), and memoised on the frontier.

Exactness does not need the search to branch on every ready op: an op whose
dynamic storages are all live already allocates nothing, so running it at once
never raises a later step (its storages can only die earlier) and its own step is
no larger than the next one would be anyway.  Such *free* ops run as soon as they
are ready, which collapses views, in-place updates and last readers.

The frontier count explodes with the width of the graph (k independent branches
give ``len ** k`` frontiers); ``state_limit`` (frontiers generated, each one op run
after a known frontier: the unit of the search's work) and ``deadline`` bound it and a
search that exceeds them raises ``SearchLimitError`` instead of returning a guess.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from mpplan.errors import MpplanError
from mpplan.graph import Graph

#: Frontiers the exact search may generate before it gives up (some tens of seconds).
DEFAULT_STATE_LIMIT = 2_000_000

#: Graphs with more ops are refused at once: their frontiers (bitsets of n bits) would
#: not fit in memory long before the search could finish.
MAX_OPS = 2_000


class SearchLimitError(MpplanError, RuntimeError):
    """The exact search needed more frontiers or time than allowed.

    The graph is too wide for an exact order; use a heuristic (``auto`` falls back
    on its own) or raise the limit.
    """


def exact_search(
    graph: Graph,
    *,
    upper_bound: Sequence[int] | None = None,
    state_limit: int = DEFAULT_STATE_LIMIT,
    deadline: float | None = None,
) -> tuple[int, ...]:
    """An order of ``graph``'s ops with the least LOAD (``mpplan.sim.order_load``).

    ``upper_bound`` is a valid order known beforehand; the search then only looks
    for strictly better orders and returns ``upper_bound`` itself when none exists,
    which proves it optimal.  ``deadline`` is a ``time.monotonic()`` instant.
    Raises ``SearchLimitError`` when more than ``state_limit`` generated frontiers or the
    deadline would be needed, or the graph has more than ``MAX_OPS`` ops.  The result
    depends on nothing but the arguments.
    """
    topo = graph.topology
    if topo.num_ops > MAX_OPS:
        raise SearchLimitError(
            f"exact schedule: graph {graph.name!r} has {topo.num_ops} ops, more than the {MAX_OPS} "
            "an exact search can hold; use a heuristic such as 'auto'"
        )
    dynamic = [s for s in topo.storages if not topo.is_static[s]]
    local = {s: i for i, s in enumerate(dynamic)}
    frontiers = _Frontiers(
        topo.preds,
        [[local[s] for s in storages if s in local] for storages in topo.op_storages],
        [topo.nbytes[s] for s in dynamic],
        before=[False] * len(dynamic),
        after=[s in topo.output_storages for s in dynamic],
    )
    if frontiers.num_ops == 0:
        return ()
    bound = frontiers.load(upper_bound) if upper_bound is not None else None
    best = frontiers.search(bound, state_limit, deadline)
    if best is None:
        assert upper_bound is not None, "without a bound the search always reaches the full frontier"
        return tuple(upper_bound)
    return best


def min_peak_order(
    preds: Sequence[Sequence[int]],
    storages: Sequence[Sequence[int]],
    nbytes: Sequence[int],
    *,
    before: Sequence[bool],
    after: Sequence[bool],
    bound: int | None = None,
    state_limit: int = DEFAULT_STATE_LIMIT,
    deadline: float | None = None,
) -> tuple[tuple[int, ...] | None, int]:
    """The order of ops ``0..n-1`` whose largest step is least, if it is below ``bound``,
    and how many frontiers the search generated (its cost).

    This is the exact search on a piece of a schedule: op ``k`` waits for
    ``preds[k]`` (ids below ``k``: the ops are numbered in a valid order) and touches
    the storages ``storages[k]`` (ids into ``nbytes``); ``before[s]`` says storage
    ``s`` is already live when the piece starts, and ``after[s]`` that it must stay
    live when the piece ends (touched later, or an output).  A step counts only the
    storages the piece touches: what merely lives across it adds the same bytes to
    every order.  The order is None when no order has a largest step below
    ``bound``; raises ``SearchLimitError`` like ``exact_search``.
    """
    if len(preds) > MAX_OPS:
        raise SearchLimitError(f"exact schedule: {len(preds)} ops, more than the {MAX_OPS} an exact search can hold")
    frontiers = _Frontiers(preds, storages, nbytes, before=before, after=after)
    if frontiers.num_ops == 0:
        return (), 0
    order = frontiers.search(bound, state_limit, deadline)
    return order, frontiers.generated


class _Frontiers:
    """Bitset view of the ops to order: op ``k`` is bit ``1 << k``.

    A storage's *touchers* mask also holds two pseudo-ops: the past (bit ``n``, done
    in every frontier) when it is live before the first op, and the future (bit
    ``n + 1``, never done) when it must outlive the last one; so "no toucher done"
    means "not yet allocated" and "all touchers done" means "dead" without special
    cases.
    """

    def __init__(
        self,
        preds: Sequence[Sequence[int]],
        storages: Sequence[Sequence[int]],
        nbytes: Sequence[int],
        *,
        before: Sequence[bool],
        after: Sequence[bool],
    ) -> None:
        self.num_ops = n = len(preds)
        self.generated = 0  # frontiers the last search generated
        if any(p >= k for k, ps in enumerate(preds) for p in ps):
            raise ValueError("exact schedule: ops must be numbered in a topological order (each pred below its op)")
        past, future = 1 << n, 1 << (n + 1)
        self.start = past
        self.full = (1 << n) - 1 | past
        self.pred_mask = [_mask(ps) for ps in preds]
        succs: list[list[int]] = [[] for _ in range(n)]
        for k, ps in enumerate(preds):
            for p in ps:
                succs[p].append(k)
        self.succs = succs
        touchers = [(past if b else 0) | (future if a else 0) for b, a in zip(before, after)]
        for k, ids in enumerate(storages):
            for s in ids:
                touchers[s] |= 1 << k
        # Per op: (bytes, touchers) of each storage it touches.
        self.storages = [tuple((nbytes[s], touchers[s]) for s in dict.fromkeys(ids)) for ids in storages]
        self.live0 = sum(nbytes[s] for s in {s for ids in storages for s in ids} if before[s])
        working_set = [sum(b for b, _ in st) for st in self.storages]
        self.by_working_set = sorted(range(n), key=lambda k: (-working_set[k], k))
        self.working_set = working_set
        # Ops that can ever be free: each storage has a toucher that may run first (or the past).
        descendants = [0] * n
        for k in reversed(range(n)):
            for t in succs[k]:
                descendants[k] |= (1 << t) | descendants[t]
        self.may_be_free = 0
        for k, st in enumerate(self.storages):
            later = descendants[k] | (1 << k) | future
            if all(touchers & ~later for _, touchers in st):
                self.may_be_free |= 1 << k
        # Whatever must outlive the last op is live at the last step, whatever the order.
        self.end_bytes = sum(nbytes[s] for s in {s for ids in storages for s in ids} if after[s])

    def step(self, done: int, live: int, k: int) -> tuple[int, int]:
        """Bytes live while ``k`` runs after ``done``, and bytes live after it."""
        allocated = freed = 0
        after = done | (1 << k)
        for nbytes, touchers in self.storages[k]:
            if not done & touchers:
                allocated += nbytes
            if after & touchers == touchers:
                freed += nbytes
        return live + allocated, live + allocated - freed

    def newly_ready(self, k: int, done: int) -> int:
        ready = 0
        for t in self.succs[k]:
            if self.pred_mask[t] & done == self.pred_mask[t]:
                ready |= 1 << t
        return ready

    def settle(self, done: int, live: int, ready: int) -> tuple[int, int, int, tuple[int, ...]]:
        """Run free ready ops (lowest id first) until none is left; see the module docstring."""
        ran: list[int] = []
        storages = self.storages
        while True:
            r = ready & self.may_be_free
            while r:
                low = r & -r
                k = low.bit_length() - 1
                for _, touchers in storages[k]:
                    if not done & touchers:
                        break
                else:
                    break  # every storage of k is live already: k is free
                r ^= low
            if not r:
                return done, live, ready, tuple(ran)
            _, live = self.step(done, live, k)
            done |= low
            ready = (ready ^ low) | self.newly_ready(k, done)
            ran.append(k)

    def remaining_bound(self, done: int, live: int) -> int:
        """A lower bound on the largest step still to come after ``done``."""
        bound = live
        for k in self.by_working_set:
            if not done >> k & 1:
                bound = max(bound, self.working_set[k])
                break
        return bound

    def load(self, order: Sequence[int]) -> int:
        done, live, peak = self.start, self.live0, 0
        for k in order:
            step, live = self.step(done, live, k)
            peak = max(peak, step)
            done |= 1 << k
        return peak

    def search(self, bound: int | None, state_limit: int, deadline: float | None) -> tuple[int, ...] | None:
        """The best order with LOAD below ``bound`` (any order when None), or None if there is none."""
        limit = float("inf") if bound is None else bound
        ready0 = 0
        for k in range(self.num_ops):
            if not self.pred_mask[k]:
                ready0 |= 1 << k
        start, live0, ready0, ran0 = self.settle(self.start, self.live0, ready0)
        # Per frontier: best peak so far, live bytes, ready ops, and how it was reached.
        peak_of = {start: 0}
        self.generated = 1
        live_of = {start: live0}
        ready_of = {start: ready0}
        came_from: dict[int, tuple[int, tuple[int, ...]]] = {}
        heap = [(max(self.end_bytes, self.remaining_bound(start, live0)), -start.bit_count(), start, 0)]
        expanded = 0
        while heap:
            _, _, done, peak = heapq.heappop(heap)
            if peak > peak_of[done]:
                continue
            if done == self.full:
                return ran0 + self._path(came_from, done)
            expanded += 1
            if deadline is not None and expanded % 256 == 0 and time.monotonic() > deadline:
                raise SearchLimitError(f"exact schedule: time limit reached after {expanded} frontiers")
            live, ready = live_of[done], ready_of[done]
            r = ready
            while r:
                low = r & -r
                k = low.bit_length() - 1
                r ^= low
                self.generated += 1
                if self.generated > state_limit:
                    raise SearchLimitError(
                        f"exact schedule: more than {state_limit} frontiers of {self.num_ops} ops; "
                        "the graph is too wide for an exact order, use a heuristic or raise the limit"
                    )
                step, after = self.step(done, live, k)
                new_peak = max(peak, step)
                if new_peak >= limit:
                    continue
                nxt = done | low
                nxt, after, nxt_ready, ran = self.settle(nxt, after, (ready ^ low) | self.newly_ready(k, nxt))
                if new_peak >= peak_of.get(nxt, limit):
                    continue
                estimate = max(new_peak, self.end_bytes, self.remaining_bound(nxt, after))
                if estimate >= limit:
                    continue
                peak_of[nxt], live_of[nxt], ready_of[nxt] = new_peak, after, nxt_ready
                came_from[nxt] = (done, (k, *ran))
                heapq.heappush(heap, (estimate, -nxt.bit_count(), nxt, new_peak))
        return None

    @staticmethod
    def _path(came_from: dict[int, tuple[int, tuple[int, ...]]], done: int) -> tuple[int, ...]:
        pieces: list[tuple[int, ...]] = []
        while done in came_from:
            done, ran = came_from[done]
            pieces.append(ran)
        return tuple(k for piece in reversed(pieces) for k in piece)


def _mask(ids: Sequence[int]) -> int:
    mask = 0
    for i in ids:
        mask |= 1 << i
    return mask

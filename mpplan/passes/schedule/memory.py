"""The memory model every scheduling method scores against: which dynamic storages each op touches.

Static storage is live under every order and plays no part; a storage is live,
inclusively, from the first op that touches it through the last one (graph outputs
to the end).  ``Memory.load`` is the fast twin of ``mpplan.sim.order_load``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from mpplan.graph import Graph
from mpplan.sim import live_profile_array
from mpplan.units import MAX_BYTES

Order = tuple[int, ...]

#: Default wall-clock cap, in seconds, on the searching methods (``exact``, ``auto``).
TIME_LIMIT = 10.0


class Scheduler(Protocol):
    """A scheduling method: a valid op order of ``graph``.  ``seed`` and ``time_limit``
    steer the searching methods and are accepted, unused, by the others."""

    def __call__(self, graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order: ...


@dataclass(frozen=True)
class Memory:
    """The op DAG and the dynamic storages each op touches, in dense local storage ids.

    Static storages are dropped: they are live under every order.  ``touchers[s]``
    lists, ascending, the ops that touch storage ``s``; ``to_end[s]`` marks graph
    outputs, which stay live once made.

    ``start_allocated[k]``, ``start_freed[k]`` and ``start_unrun[s]`` are the list
    schedulers' starting totals (before any op runs), derived once here so each
    scheduler run copies them instead of rebuilding them over every storage.
    ``ready_from[k]``: the step of the given order ``0..n-1`` from which ``k`` is ready
    (one past its last predecessor), which the heuristics' checks for keeping that
    order share (``given``), as they share ``rivals``, made on first use and kept: ``auto``
    runs four such checks on one model.
    """

    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    storages: tuple[tuple[int, ...], ...]
    nbytes: tuple[int, ...]
    touchers: tuple[tuple[int, ...], ...]
    to_end: tuple[bool, ...]
    start_allocated: tuple[int, ...]
    start_freed: tuple[int, ...]
    start_unrun: tuple[int, ...]
    ready_from: tuple[int, ...]

    @staticmethod
    def of(graph: Graph) -> Memory:
        """The memory model of ``graph``: by arrays (``by_arrays``) unless byte sums could
        overflow 64-bit integers, then by loops over Python ints (``by_loops``); both give
        the same model, which ``test_schedule`` checks on random graphs."""
        topo = graph.topology
        entries = sum(map(len, topo.op_storages))
        if max(topo.nbytes, default=0) * max(entries, 1) < MAX_BYTES:  # bounds every sum by_arrays makes
            return Memory.by_arrays(graph)
        return Memory.by_loops(graph)

    @staticmethod
    def by_arrays(graph: Graph) -> Memory:
        """``of`` by numpy: one flat array of (op, storage) touches instead of a loop over them.

        A storage's local id is its rank by first touch (op, then position in the op), as
        ``by_loops`` numbers them; its touchers come out of a stable sort by local id, so
        in op order, repeats kept.  Byte sums are exact: the caller checks they fit int64.
        """
        topo = graph.topology
        counts = np.fromiter(map(len, topo.op_storages), dtype=np.int64, count=len(topo.op_storages))
        flat = np.fromiter(itertools.chain.from_iterable(topo.op_storages), dtype=np.int64, count=int(counts.sum()))
        op_of = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        keep = ~np.array(topo.is_static, dtype=bool)[flat] if len(flat) else np.zeros(0, dtype=bool)
        flat, op_of = flat[keep], op_of[keep]
        kept_counts = np.bincount(op_of, minlength=len(counts))
        ids, first_touch, inverse = np.unique(flat, return_index=True, return_inverse=True)
        by_first = np.argsort(first_touch, kind="stable")  # local id -> index into ids
        rank = np.empty(len(ids), dtype=np.int64)
        rank[by_first] = np.arange(len(ids), dtype=np.int64)
        local = rank[inverse]
        owner = ids[by_first]  # the tensor id of each local storage
        nbytes_arr = np.array(topo.nbytes, dtype=np.int64)[owner]
        to_end_arr = np.isin(owner, np.fromiter(topo.output_storages, dtype=np.int64))
        by_local = np.argsort(local, kind="stable")
        toucher_ops = op_of[by_local]
        toucher_counts = np.bincount(local, minlength=len(ids))
        toucher_starts = np.concatenate(([0], np.cumsum(toucher_counts)[:-1])).astype(np.int64)
        unrun = np.bitwise_xor.reduceat(toucher_ops, toucher_starts) if len(ids) else toucher_ops
        freeable = np.where((toucher_counts == 1) & ~to_end_arr, nbytes_arr, 0)
        op_ends = np.cumsum(kept_counts)
        allocated = _segment_sums(nbytes_arr[local], op_ends)
        freed = _segment_sums(freeable[local], op_ends)
        nbytes = nbytes_arr.tolist()
        return Memory(
            preds=topo.preds,
            succs=topo.succs,
            storages=_split(local.tolist(), op_ends.tolist()),
            nbytes=tuple(nbytes),
            touchers=_split(toucher_ops.tolist(), np.cumsum(toucher_counts).tolist()),
            to_end=tuple(to_end_arr.tolist()),
            start_allocated=tuple(allocated.tolist()),
            start_freed=tuple(freed.tolist()),
            start_unrun=tuple(unrun.tolist()),
            ready_from=_ready_from(topo.preds),
        )

    @staticmethod
    def by_loops(graph: Graph) -> Memory:
        """``of`` by one loop over every op's storages, in Python ints (any byte sizes)."""
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
        unrun = [0] * len(touchers)
        for s, ts in enumerate(touchers):
            x = 0
            for t in ts:
                x ^= t  # the XOR of the ops that have not run yet: the last one, once one remains
            unrun[s] = x
        # bytes an op would allocate (storages nobody touched yet) and free (its storages it alone touches)
        freeable = [b if len(ts) == 1 and not end else 0 for b, ts, end in zip(nbytes, touchers, to_end)]
        return Memory(
            preds=topo.preds,
            succs=topo.succs,
            storages=tuple(storages),
            nbytes=tuple(nbytes),
            touchers=tuple(map(tuple, touchers)),
            to_end=tuple(to_end),
            start_allocated=tuple([sum([nbytes[s] for s in st]) for st in storages]),
            start_freed=tuple([sum([freeable[s] for s in st]) for st in storages]),
            start_unrun=tuple(unrun),
            ready_from=_ready_from(topo.preds),
        )

    @property
    def num_ops(self) -> int:
        return len(self.preds)

    @cached_property
    def rivals(self) -> dict[int, tuple[int, ...]] | None:
        """For each step ``i`` of the given order where another op is ready, those ops (``t > i``),
        ascending; ``None`` when there are more (step, rival) pairs than ops (``_rivals``)."""
        return _rivals(self.ready_from)

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

    def profiles(self, orders: Sequence[Order]) -> list[list[int]]:
        """``profile`` of each of ``orders``, by numpy columns where every order runs all ops
        and the byte sums fit int64 (``auto``'s six heuristic orders of a 100k-op graph: 0.68 s
        of Python steps, 0.15 s so); by ``profile`` otherwise.

        A storage is live from the step of its first toucher through that of its last (outputs:
        through the last step), so each order's profile is a running sum of +bytes at the first
        step and -bytes just past the last (``sim.live_profile_array``).  That holds only for an
        order that runs every op once and storages that some op touches: any other input goes
        to ``profile``.
        """
        n = self.num_ops
        counts = np.fromiter(map(len, self.touchers), dtype=np.int64, count=len(self.touchers))
        if sum(self.nbytes) >= MAX_BYTES or not self.nbytes or not counts.all():
            return [self.profile(order) for order in orders]
        touches = np.fromiter(itertools.chain.from_iterable(self.touchers), dtype=np.int64, count=int(counts.sum()))
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        nbytes = np.array(self.nbytes, dtype=np.int64)
        to_end = np.array(self.to_end, dtype=bool)
        found = []
        for order in orders:
            step = _steps_of(order, n)
            if step is None:
                found.append(self.profile(order))
                continue
            at = step[touches]
            last = np.maximum.reduceat(at, starts)
            last[to_end] = n - 1
            found.append(live_profile_array(nbytes, np.minimum.reduceat(at, starts), last, n).tolist())
        return found

    def load(self, order: Sequence[int]) -> int:
        """LOAD of ``order``; equals ``sim.order_load`` without building live ranges."""
        return max(self.profile(order), default=0)


def _ready_from(preds: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """One past each op's last predecessor: the step of the given order from which it is ready."""
    return tuple([max(p) + 1 if p else 0 for p in preds])


def _rivals(ready_from: Sequence[int]) -> dict[int, tuple[int, ...]] | None:
    """``Memory.rivals`` from ``ready_from``: op ``t`` is a rival at each step from ``ready_from[t]``
    up to, not including, its own."""
    n = len(ready_from)
    waits = np.arange(n, dtype=np.int64) - np.array(ready_from, dtype=np.int64)
    if int(waits.sum()) > n:
        return None
    rivals: dict[int, list[int]] = {}
    for t in np.flatnonzero(waits).tolist():
        for i in range(ready_from[t], t):
            rivals.setdefault(i, []).append(t)
    return {i: tuple(ops) for i, ops in rivals.items()}


def _segment_sums(values: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Sums of ``values`` over consecutive segments ending (exclusive) at ``ends``."""
    running = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
    return running[ends] - running[np.concatenate(([0], ends[:-1]))] if len(ends) else ends


def _split(values: list[int], ends: list[int]) -> tuple[tuple[int, ...], ...]:
    """``values`` cut into consecutive tuples ending (exclusive) at ``ends``."""
    return tuple([tuple(values[lo:hi]) for lo, hi in zip([0, *ends], ends)])


def _steps_of(order: Sequence[int], n: int) -> np.ndarray | None:
    """Each op's step in ``order``, or ``None`` unless ``order`` runs each of the ``n`` ops once."""
    ops = np.fromiter(order, dtype=np.int64, count=len(order))
    if len(ops) != n or (n and (ops.min() < 0 or ops.max() >= n)):
        return None
    step = np.full(n, -1, dtype=np.int64)
    step[ops] = np.arange(n, dtype=np.int64)
    return step if n == 0 or step.min() >= 0 else None

"""The memory model every scheduling method scores against: which dynamic storages each op touches.

Static storage is live under every order and plays no part; a storage is live,
inclusively, from the first op that touches it through the last one (graph outputs
to the end).  ``Memory.load`` is the fast twin of ``mpplan.sim.order_load``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from mpplan.graph import Graph

Order = tuple[int, ...]

#: Default wall-clock cap, in seconds, on the searching methods (``exact``, ``auto``).
TIME_LIMIT = 10.0


class Scheduler(Protocol):
    """A scheduling method: a valid op order of ``graph``.  ``seed`` and ``time_limit``
    steer the searching methods and are accepted, unused, by the others."""

    def __call__(self, graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order: ...


@dataclass(frozen=True, slots=True)
class Memory:
    """The op DAG and the dynamic storages each op touches, in dense local storage ids.

    Static storages are dropped: they are live under every order.  ``touchers[s]``
    lists, ascending, the ops that touch storage ``s``; ``to_end[s]`` marks graph
    outputs, which stay live once made.

    ``start_allocated[k]``, ``start_freed[k]`` and ``start_unrun[s]`` are the list
    schedulers' starting totals (before any op runs), derived once here so each
    scheduler run copies them instead of rebuilding them over every storage.
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

    @staticmethod
    def of(graph: Graph) -> Memory:
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

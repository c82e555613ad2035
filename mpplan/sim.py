"""The peak simulator: the single source of every predicted peak and lower bound.

``load`` is the largest number of dynamic bytes live at one step; no assignment of
offsets can use a smaller arena, so ``static + load`` bounds every plan's peak
from below.  Schedulers score candidate orders with ``order_load``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Iterable, Sequence

from mpplan.graph import Graph
from mpplan.liveness import LiveRange, spans

if TYPE_CHECKING:  # numpy is imported where a fast path runs: the CLI starts without it
    import numpy as np


def live_profile(ranges: Iterable[LiveRange], num_steps: int) -> list[int]:
    """Live dynamic bytes at each step (a difference array over the inclusive ranges)."""
    delta = [0] * (num_steps + 1)
    for r in ranges:
        delta[r.first] += r.nbytes
        delta[r.last + 1] -= r.nbytes
    profile, running = [], 0
    for step in range(num_steps):
        running += delta[step]
        profile.append(running)
    return profile


def live_profile_array(nbytes: np.ndarray, first: np.ndarray, last: np.ndarray, num_steps: int) -> np.ndarray:
    """``live_profile`` by int64 columns: bytes live at each step ``0..num_steps-1`` of ranges
    ``nbytes[j]`` live in steps ``first[j]..last[j]`` (inclusive, within the steps).

    One sweep the planner's fast paths share (the scheduler's ``Memory.profiles``, the
    assigner's ``sweep_load``), where a loop per range would cost a Python step each.  The
    caller checks every running sum fits int64 (``units.MAX_BYTES``).

    >>> import numpy as np
    >>> live_profile_array(np.array([10, 20]), np.array([0, 1]), np.array([1, 2]), 4).tolist()
    [10, 30, 20, 0]
    """
    import numpy as np

    change = np.zeros(num_steps + 1, dtype=np.int64)
    np.add.at(change, first, nbytes)
    np.add.at(change, last + 1, -nbytes)
    return np.cumsum(change[:num_steps])


def load(ranges: Iterable[LiveRange], num_steps: int) -> int:
    """LOAD: the maximum over steps of live dynamic bytes."""
    return max(live_profile(ranges, num_steps), default=0)


def held_peak(spans: Iterable[tuple[int, int, int]], extra: Sequence[int]) -> int:
    """The most bytes held at one step: allocations ``(first, last, nbytes)`` live in steps
    ``first..last`` (inclusive), plus ``extra[step]`` held during that step alone.

    A device whose arena is cut into blocks peaks at static + this, with the blocks as
    the allocations and each op's scratch as ``extra``.

    >>> held_peak([(0, 1, 10), (1, 2, 5)], [0, 3, 0])
    18
    """
    num_steps = len(extra)
    profile = live_profile((LiveRange(0, n, f, l) for f, l, n in spans), num_steps)
    return max((held + more for held, more in zip(profile, extra)), default=0)


def order_load(graph: Graph, order: Sequence[int]) -> int:
    """LOAD of ``order`` with every storage freed right after its last use."""
    return max(order_profile(graph, order), default=0)


def given_peak(graph: Graph) -> int:
    """``static_bytes`` plus LOAD of ``graph``'s as-given op order: the peak a remat budget bounds."""
    return static_bytes(graph) + order_load(graph, range(len(graph.ops)))


def order_profile(graph: Graph, order: Sequence[int]) -> list[int]:
    """Live dynamic bytes at each step of ``order``: ``live_profile`` of ``live_ranges(graph, order)``,
    from the storages' first and last steps without a ``LiveRange`` record each."""
    topo = graph.topology
    first, last = spans(graph, order)
    delta = [0] * (len(order) + 1)
    for s, (begin, nbytes, static) in enumerate(zip(first, topo.nbytes, topo.is_static)):
        if begin >= 0 and not static:  # touched, so a storage (ops touch storages, never their views)
            delta[begin] += nbytes
            delta[last[s] + 1] -= nbytes
    return list(itertools.accumulate(delta[:-1]))


def static_bytes(graph: Graph) -> int:
    """Bytes of the storages resident for the whole step (those some op touches)."""
    topo = graph.topology
    touched = {s for storages in topo.op_storages for s in storages}
    return sum(topo.nbytes[s] for s in topo.storages if topo.is_static[s] and s in touched)


def no_sharing_bytes(graph: Graph) -> int:
    """Dynamic bytes if every storage had memory of its own for the whole step."""
    topo = graph.topology
    return sum(topo.nbytes[s] for s in topo.storages if not topo.is_static[s])


def max_op_working_set(graph: Graph) -> int:
    """The most dynamic bytes a single op touches: LOAD of any order is at least this."""
    return largest_op(graph)[1]


def largest_op(graph: Graph) -> tuple[str | None, int]:
    """The op touching the most dynamic bytes, and those bytes: what no placement can split."""
    topo = graph.topology
    best: tuple[str | None, int] = (None, 0)
    for k, storages in enumerate(topo.op_storages):
        touched = sum(topo.nbytes[s] for s in storages if not topo.is_static[s])
        if touched > best[1]:
            best = (graph.ops[k].name, touched)
    return best

"""Fast offset heuristics for ``assign``: greedy by size and best fit in lifetime order.

Both take records already normalised by ``assign`` (sizes rounded up to the
alignment; zero-size records are left at offset 0 and never block anything) and
return one offset per record.  Neither knows about LOAD; ``assign`` scores them.

Conflicts: two records *conflict* when their inclusive live ranges overlap, or
when the optional ``may_share(i, j)`` predicate (always called with ``i < j``)
says False.  Conflicting records must not overlap in memory.  Time overlaps are
found with sorted sweeps; the predicate is only consulted for records that a
candidate placement would actually put on top of each other in memory, so its
cost is paid where sharing really happens.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from mpplan.passes.assign.records import MayShare
from mpplan.passes.assign.skyline import breadth_order


def overlap_pairs(
    first: Sequence[int], last: Sequence[int], active: Sequence[int], *, stop_above: int | None = None
) -> int:
    """Number of pairs among ``active`` whose inclusive ranges overlap, in O(n log n).

    Callers use it to pick between an adjacency walk (cheap when ranges are short)
    and structures that never enumerate pairs.  With ``stop_above``, counting stops
    once the count is known to exceed it, and what is returned then is a number above
    ``stop_above`` but possibly below the full count: enough to compare with a limit.
    """
    starts = sorted(first[j] for j in active)
    same_start: dict[int, int] = {}
    for j in active:
        same_start[first[j]] = same_start.get(first[j], 0) + 1
    # pairs with equal starts are counted from both sides below: the excess to take off
    excess = sum(c * (c - 1) // 2 for c in same_start.values())
    pairs = -excess
    for j in active:
        # records starting in [first_j, last_j], minus j itself: each overlapping pair counted once
        # from the record that starts first (ties: both count each other, taken off above).  Every
        # term is >= 0, so a partial sum minus the excess never exceeds the full count.
        pairs += bisect.bisect_right(starts, last[j]) - bisect.bisect_left(starts, first[j]) - 1
        if stop_above is not None and pairs > stop_above:
            break
    return pairs


def time_neighbours(first: Sequence[int], last: Sequence[int], active: Sequence[int]) -> dict[int, list[int]]:
    """Adjacency lists of the interval-overlap graph over ``active``, by one sweep in O(n log n + pairs)."""
    nbrs: dict[int, list[int]] = {j: [] for j in active}
    live: dict[int, None] = {}
    ending: list[tuple[int, int]] = []
    for j in sorted(active, key=lambda k: (first[k], k)):
        while ending and ending[0][0] < first[j]:
            del live[heapq.heappop(ending)[1]]
        mine = nbrs[j]
        for k in live:
            mine.append(k)
            nbrs[k].append(j)
        live[j] = None
        heapq.heappush(ending, (last[j], j))
    return nbrs


class _MemoryIndex:
    """Placed records sorted by offset, to find who sits in a memory range (predicate checks only)."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._max_size = 0

    def add(self, offset: int, size: int, j: int) -> None:
        bisect.insort(self._keys, (offset, j))
        self._max_size = max(self._max_size, size)

    def overlapping(self, lo: int, hi: int, sizes: Sequence[int]) -> list[int]:
        """Placed records whose memory meets ``[lo, hi)``, in offset order."""
        start = bisect.bisect_left(self._keys, (lo - self._max_size + 1, -1))
        out = []
        for i in range(start, len(self._keys)):
            offset, k = self._keys[i]
            if offset >= hi:
                break
            if offset + sizes[k] > lo:
                out.append(k)
        return out


def _forbidden(j: int, k: int, may_share: MayShare) -> bool:
    return not (may_share(j, k) if j < k else may_share(k, j))


def _best_gap(intervals: list[tuple[int, int]], size: int, fit: str) -> int:
    """Offset for ``size`` bytes among occupied ``intervals`` (sorted by start).

    ``fit="best"``: the smallest gap that fits (ties: lowest); ``"first"``: the lowest
    gap that fits; with no gap, the top of the occupied space.
    """
    prev_end = 0
    best, best_gap = -1, -1
    for lo, hi in intervals:
        gap = lo - prev_end
        if gap >= size and (best < 0 or gap < best_gap):
            best, best_gap = prev_end, gap
            if fit == "first" or gap == size:
                return best
        prev_end = max(prev_end, hi)
    return prev_end if best < 0 else best


def greedy_by_size(
    sizes: Sequence[int],
    first: Sequence[int],
    last: Sequence[int],
    *,
    order: str = "size",
    fit: str = "best",
    may_share: MayShare | None = None,
    neighbours: dict[int, list[int]] | None = None,
) -> list[int]:
    """TFLite's greedy by size: largest record first, into the best gap among placed conflicting records.

    ``order="size"`` sorts by size descending, ties by index; ``"size_length"`` breaks size
    ties by longer lifetime first; ``"breadth"`` is TFLite's greedy by breadth: the records
    live at the busiest steps first (``skyline.breadth_order``).  ``fit`` is ``"best"`` (smallest gap that fits, as in
    TFLite) or ``"first"`` (lowest gap).  Cost: O(n log n + p) where p counts overlapping
    pairs, plus predicate checks on memory neighbours when ``may_share`` is given.
    ``neighbours`` may pass ``time_neighbours`` of the non-empty records, to share it
    between runs.
    """
    n = len(sizes)
    active = [j for j in range(n) if sizes[j] > 0]
    if order == "size":
        sequence = sorted(active, key=lambda j: (-sizes[j], j))
    elif order == "size_length":
        sequence = sorted(active, key=lambda j: (-sizes[j], first[j] - last[j], j))
    elif order == "breadth":
        local = breadth_order([sizes[j] for j in active], [first[j] for j in active], [last[j] for j in active])
        sequence = [active[i] for i in local]  # active is by index: local ties are ties by index
    else:
        raise ValueError(f"greedy_by_size: expected order 'size', 'size_length' or 'breadth', got {order!r}")
    if fit not in ("best", "first"):
        raise ValueError(f"greedy_by_size: expected fit 'best' or 'first', got {fit!r}")
    nbrs = time_neighbours(first, last, active) if neighbours is None else neighbours
    offsets = [0] * n
    placed = [False] * n
    memory = _MemoryIndex() if may_share is not None else None
    for j in sequence:
        size = sizes[j]
        blockers = [k for k in nbrs[j] if placed[k]]
        while True:
            occupied = sorted((offsets[k], offsets[k] + sizes[k]) for k in blockers)
            offset = _best_gap(occupied, size, fit)
            if memory is None or may_share is None:
                break
            clash = [k for k in memory.overlapping(offset, offset + size, sizes) if _forbidden(j, k, may_share)]
            if not clash:
                break
            # a record that may not share with j acts as a conflict: retry with it in the way
            blockers.extend(clash)
        offsets[j] = offset
        placed[j] = True
        if memory is not None:
            memory.add(offset, size, j)
    return offsets


def best_fit(
    sizes: Sequence[int],
    first: Sequence[int],
    last: Sequence[int],
    *,
    may_share: MayShare | None = None,
) -> list[int]:
    """Best fit in lifetime order: a sweep over steps that puts each record in the smallest free block.

    Records are taken by first step (ties by index); at that step the records still
    live are exactly the placed ones it conflicts with in time, so the free blocks of
    the sweep are the gaps it may use.  With no block large enough it extends the
    block at the top of the arena.  O(n log n) plus list moves on the free-block index.

    A range that ends before the current record starts began before it too, so it is
    already placed: freeing ranges in (last step, index) order from one pre-sorted list
    frees exactly what a heap of the placed ranges would, in the same order.
    Free blocks are maximal (``add_free`` merges neighbours), so the rest of a block a
    record takes part of keeps the block's place among the starts and merges with
    nothing: the hot loop updates it in place instead of dropping and re-adding it.
    """
    n = len(sizes)
    # by first step, ties by index (a stable sort of the indices); and by last step, likewise
    active = [j for j in sorted(range(n), key=first.__getitem__) if sizes[j] > 0]
    ending = [j for j in sorted(range(n), key=last.__getitem__) if sizes[j] > 0]
    offsets = [0] * n
    free_by_size: list[tuple[int, int]] = []  # (size, start)
    free_starts: list[int] = []
    free_end: dict[int, int] = {}
    top = 0  # high-water mark: nothing placed so far reaches above it
    ended = 0  # records ending[:ended] are freed: every range that ends before the current one starts
    memory = _MemoryIndex() if may_share is not None else None
    bisect_left, insort = bisect.bisect_left, bisect.insort

    def add_free(lo: int, hi: int) -> None:
        i = bisect_left(free_starts, lo)
        if i > 0 and free_end[free_starts[i - 1]] == lo:  # merge with the block below
            i -= 1
            below = free_starts.pop(i)
            del free_by_size[bisect_left(free_by_size, (lo - below, below))]
            del free_end[below]
            lo = below
        if i < len(free_starts) and free_starts[i] == hi:  # and with the block above
            above_end = free_end.pop(hi)
            del free_starts[i]
            del free_by_size[bisect_left(free_by_size, (above_end - hi, hi))]
            hi = above_end
        free_starts.insert(i, lo)
        free_end[lo] = hi
        insort(free_by_size, (hi - lo, lo))

    def allowed(j: int, lo: int) -> bool:
        if memory is None or may_share is None:
            return True
        return not any(_forbidden(j, k, may_share) for k in memory.overlapping(lo, lo + sizes[j], sizes))

    for j in active:
        start = first[j]
        while ended < len(ending) and last[ending[ended]] < start:
            k = ending[ended]
            ended += 1
            add_free(offsets[k], offsets[k] + sizes[k])
        size = sizes[j]
        i = bisect_left(free_by_size, (size, -1))
        if memory is not None:
            while i < len(free_by_size) and not allowed(j, free_by_size[i][1]):
                i += 1
        if i < len(free_by_size):
            block, chosen = free_by_size.pop(i)
            where = bisect_left(free_starts, chosen)
            if block > size:  # the rest of the block stays free, in the block's place
                rest = chosen + size
                free_starts[where] = rest
                free_end[rest] = free_end.pop(chosen)
                insort(free_by_size, (block - size, rest))
            else:
                del free_starts[where]
                del free_end[chosen]
        else:
            # extend the arena: start in the free block that touches the top, if any and allowed
            chosen = top
            if free_starts and free_end[free_starts[-1]] == top and allowed(j, free_starts[-1]):
                chosen = free_starts.pop()
                del free_end[chosen]
                del free_by_size[bisect_left(free_by_size, (top - chosen, chosen))]
        if chosen + size > top:
            top = chosen + size
        offsets[j] = chosen
        if memory is not None:
            memory.add(chosen, size, j)
    return offsets

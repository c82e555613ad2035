"""The memory checks of ``memory`` on storage numbers, as numpy arrays: a fast yes, or a no without words.

``memory`` checks storages by name, in name order, so that its first violation is the
one reported; on a plan of 100k ops its dict lookups per name are most of the verifier's
time.  ``memory_holds`` asks the same questions of arrays indexed by storage number
(``replay.Replay``'s numbering): every buffer belongs to a dynamic storage, which has
exactly one, on its device, big enough, aligned, inside the arena; no two buffers live
at one step share bytes; each device's static, arena, peak and lower-bound bytes are
what the graph gives.  It answers only whether all of them hold: when one does not, the
caller runs ``memory``'s checks, which word the first violation exactly as always.

Values that do not fit the arrays' 64-bit integers (a hand-edited plan with huge or
fractional numbers) also answer no, leaving them to the checks by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from mpplan.plan import Plan

#: Every byte count and offset below this keeps sums of two, and of all sizes, inside int64.
_LIMIT = 1 << 62

_Ints = npt.NDArray[np.int64]
_OFFSET, _BYTES, _DEVICE = attrgetter("offset"), attrgetter("bytes"), attrgetter("device")


def memory_holds(plan: Plan, first: Sequence[int], last: Sequence[int], home: Sequence[int], size: Sequence[int],
                 static: Sequence[int], alignment: int, index: dict[str, int]) -> bool:
    """True when ``plan``'s buffers, overlaps and per-device bytes all check out.

    Per storage number: ``first`` and ``last`` step (-1 when never touched), ``home``
    (its device's position in ``plan.devices``, -1 when never touched) and ``size``
    (bytes); ``static`` lists the numbers of the storages resident all step;
    ``index`` numbers storage names.  ``plan.blocks`` is not checked here (the caller
    checks plans with blocks by name).
    """
    if not 0 < alignment < _LIMIT or sum(size) >= _LIMIT:
        return False
    sizes = _ints(size)
    starts, ends, homes = _ints(first), _ints(last), _ints(home)
    if sizes is None or starts is None or ends is None or homes is None:
        return False
    dynamic = homes >= 0
    dynamic[np.asarray(static, dtype=np.int64)] = False
    buffers = plan.buffers
    ids = np.fromiter(map(index.get, buffers, repeat(-1)), np.int64, len(buffers))  # map: no Python frame per name
    if len(ids) != int(dynamic.sum()) or (ids < 0).any() or not dynamic[ids].all():
        return False  # a stray buffer, or (buffer names being distinct) a dynamic storage without one
    devices = {d.name: i for i, d in enumerate(plan.devices)}
    values = buffers.values()
    offset, nbytes = _ints(list(map(_OFFSET, values))), _ints(list(map(_BYTES, values)))
    arena = _ints([d.arena_bytes for d in plan.devices])
    if offset is None or nbytes is None or arena is None:
        return False
    device = np.fromiter(map(devices.get, map(_DEVICE, values), repeat(-1)), np.int64, len(buffers))
    if (
        (device != homes[ids]).any()
        or (nbytes < sizes[ids]).any()
        or (offset < 0).any()
        or (offset % alignment).any()
        or (nbytes % alignment).any()
        or (offset + nbytes > arena[device]).any()
    ):
        return False
    is_static = homes >= 0
    is_static[dynamic] = False
    steps = len(plan.schedule)
    for i, d in enumerate(plan.devices):
        static_bytes = int(sizes[is_static & (homes == i)].sum())
        mine = device == i
        extent = int((offset[mine] + nbytes[mine]).max(initial=0))
        ids_mine = ids[mine]
        if (
            d.static_bytes != static_bytes
            or d.arena_bytes < extent
            or d.peak_bytes != d.static_bytes + d.arena_bytes + d.scratch_bytes
            or d.lower_bound_bytes != static_bytes + _load(starts[ids_mine], ends[ids_mine], sizes[ids_mine], steps)
        ):
            return False
        sized = mine & (nbytes > 0)
        if not _apart(starts[ids[sized]], ends[ids[sized]], offset[sized], nbytes[sized]):
            return False
    return True


def _ints(values: Sequence[int]) -> _Ints | None:
    """``values`` as int64, or None when some value is not an integer within ``_LIMIT``."""
    array = np.asarray(values)
    if array.dtype != np.int64:
        return None if len(array) else np.zeros(0, dtype=np.int64)
    if len(array) and (array.max() >= _LIMIT or array.min() <= -_LIMIT):
        return None
    return array


def _load(first: _Ints, last: _Ints, size: _Ints, steps: int) -> int:
    """The largest sum of the sizes live at one step (0 with nothing live)."""
    change = np.zeros(steps + 1, dtype=np.int64)
    np.add.at(change, first, size)
    np.add.at(change, last + 1, -size)
    return max(0, int(np.cumsum(change).max(initial=0)))


def _apart(first: _Ints, last: _Ints, offset: _Ints, nbytes: _Ints) -> bool:
    """No two of these (non-empty) buffers share bytes at a step when both are live.

    An interval tree over the steps, in arrays: each buffer sits at the node where its first
    and last step part (their leaves' lowest common ancestor), so the buffers of one node all
    hold the two steps around its middle and must be disjoint, and a buffer in the left
    (right) subtree of a node meets one of that node's buffers in time exactly when it ends
    after that buffer starts (starts before it ends).  A node's buffers, disjoint and sorted
    by offset, meet a byte range in one run of them; the run's earliest start or latest end
    comes from a sparse table.  Each buffer is compared with each of its node's ancestors
    this way: ``O(n log steps)`` work, all of it in numpy.
    """
    if len(first) < 2:
        return True
    end = offset + nbytes
    leaves = 1 << int(last.max()).bit_length()  # leaf ``leaves + t`` is step t; node k's children 2k, 2k + 1
    node = (first + leaves) >> _bit_length((first + leaves) ^ (last + leaves))
    coords = _distinct(np.concatenate((offset, end)))  # byte offsets by rank, so (node, rank) fits one int64
    width = len(coords) + 1
    low, high = np.searchsorted(coords, offset), np.searchsorted(coords, end)
    order = np.lexsort((offset, node))
    by_node, lows, highs = node[order], low[order], high[order]
    if ((by_node[1:] == by_node[:-1]) & (highs[:-1] > lows[1:])).any():
        return False  # two buffers of one node, neighbours by offset, share bytes
    starts_key, ends_key = by_node * width + lows, by_node * width + highs  # both sorted: a node's buffers are disjoint
    earliest, latest = _Sparse(first[order], np.minimum), _Sparse(last[order], np.maximum)
    below = node
    while True:
        side, below = below & 1, below >> 1  # 0: the buffer is in the left subtree of ``below``
        inside = below >= 1
        if not inside.any():
            return True
        b = np.flatnonzero(inside)
        ancestor = below[b] * width
        lo = np.searchsorted(ends_key, ancestor + low[b], side="right")  # the ancestor's buffers ending after b starts
        hi = np.searchsorted(starts_key, ancestor + high[b], side="left")  # ... and starting before b ends
        met = hi > lo
        b, lo, hi, left = b[met], lo[met], hi[met], side[b][met] == 0
        if (left & (earliest.query(lo, hi) <= last[b])).any() or (~left & (latest.query(lo, hi) >= first[b])).any():
            return False


def _distinct(values: _Ints) -> _Ints:
    """``np.unique(values)``: sorted, each value once.  By a sort: numpy's ``unique`` hashes, which
    takes tens of times longer on the 100k-300k integers of a large plan."""
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))] if len(ordered) else ordered


def _bit_length(values: _Ints) -> _Ints:
    """``int.bit_length`` of each (non-negative, below 2**53) value."""
    return np.frexp(values.astype(np.float64))[1].astype(np.int64)


class _Sparse:
    """Minimum (or maximum) of any run ``values[lo:hi]`` in constant time: ``table[k, i]`` reduces
    ``values[i : i + 2**k]``."""

    def __init__(self, values: _Ints, reduce: np.ufunc) -> None:
        rows = [values]
        while 2 ** len(rows) <= len(values):
            half = 2 ** (len(rows) - 1)
            prev = rows[-1]
            rows.append(np.concatenate((reduce(prev[:-half], prev[half:]), prev[len(prev) - half :])))
        self.table, self.reduce = np.stack(rows), reduce

    def query(self, lo: _Ints, hi: _Ints) -> _Ints:
        """The reduction of each non-empty run ``[lo, hi)``."""
        k = _bit_length(hi - lo) - 1
        return self.reduce(self.table[k, lo], self.table[k, hi - (1 << k)])

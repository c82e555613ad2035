"""Buffer assignment's records: live-range records in, offsets or shared objects out.

Input is a list of live-range *records* ``(size, first, last)``: ``size`` bytes
live from step ``first`` through step ``last``, inclusive (so ``[a, b]`` and
``[b, c]`` overlap at ``b``).  Two records *conflict* when their ranges overlap
or when the optional ``may_share(i, j)`` says False; conflicting records must not
overlap in memory.  LOAD, the most bytes live at one step (after rounding sizes up
to the alignment), bounds every arena from below.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpplan.sim import live_profile_array
from mpplan.units import MAX_BYTES

Record = tuple[int, int, int]
MayShare = Callable[[int, int], bool]


@dataclass(frozen=True, slots=True)
class OffsetAssignment:
    """One offset per record (same order) in an arena of ``arena`` bytes.

    Invariant: records that conflict never overlap in memory; every offset and
    every rounded size is a multiple of the alignment; ``load <= arena``.
    ``optimal`` says the arena is proven minimal (it meets ``load``, or an
    exhaustive search found nothing smaller).  Unpacks as ``offsets, arena``.
    """

    offsets: tuple[int, ...]
    arena: int
    load: int
    algorithm: str
    optimal: bool

    def __iter__(self) -> Iterator[Any]:
        yield self.offsets
        yield self.arena


@dataclass(frozen=True, slots=True)
class SharedObjects:
    """Records grouped into objects: ``object_of[j]`` per record, ``object_sizes`` per object.

    Invariant: members of an object never conflict; an object is as large as its
    largest (rounded) member; ``total == sum(object_sizes) >= load``.
    """

    object_of: tuple[int, ...]
    object_sizes: tuple[int, ...]
    total: int
    load: int
    algorithm: str
    optimal: bool

    def offsets(self) -> tuple[int, ...]:
        """Per record, the offset of its object when objects are laid out back to back."""
        base, running = [], 0
        for size in self.object_sizes:
            base.append(running)
            running += size
        return tuple(base[o] for o in self.object_of)


def records_load(records: Sequence[Record], alignment: int = 1) -> int:
    """LOAD: the most bytes live at one step, sizes rounded up to ``alignment``.

    >>> records_load([(10, 0, 1), (20, 1, 2), (30, 3, 3)])
    30
    """
    sizes, first, last = normalise(records, alignment)
    return sweep_load(sizes, first, last)


def normalise(records: Sequence[Record], alignment: int) -> tuple[list[int], list[int], list[int]]:
    """Check the records and alignment; sizes rounded up to the alignment."""
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"assign: expected a positive integer alignment, got {alignment!r}")
    if records and set(map(type, records)) == {tuple}:
        # the common case, checked column by column in C; any doubt goes to the loop below,
        # which finds the first bad record and says what is wrong with it
        try:
            columns = tuple(map(list, zip(*records, strict=True)))
        except ValueError:
            columns = ()
        if len(columns) == 3 and _fine(*columns):
            sizes, first, last = columns
            return [-(-size // alignment) * alignment for size in sizes] if alignment > 1 else sizes, first, last
    sizes, first, last = [], [], []
    for j, record in enumerate(records):
        try:
            size, lo, hi = record
        except (TypeError, ValueError):
            raise ValueError(f"assign: record #{j}: expected (size, first, last), got {record!r}") from None
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (size, lo, hi)):
            raise ValueError(f"assign: record #{j}: expected integers (size, first, last), got {record!r}")
        if size < 0:
            raise ValueError(f"assign: record #{j}: expected size >= 0, got {size}")
        if lo > hi:
            raise ValueError(f"assign: record #{j}: expected first <= last, got {lo}..{hi}")
        sizes.append(-(-size // alignment) * alignment)
        first.append(lo)
        last.append(hi)
    return sizes, first, last


def _fine(sizes: list[int], first: list[int], last: list[int]) -> bool:
    """True when every entry is a plain ``int``, every size >= 0 and every first <= last."""
    return (
        set(map(type, sizes)) | set(map(type, first)) | set(map(type, last)) == {int}
        and min(sizes) >= 0
        and not any(map(operator.gt, first, last))
    )


def sweep_load(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> int:
    """Peak of live bytes over steps, by a sweep over range ends (steps need not be dense).

    By int64 columns where every sum fits (every size, step and total below ``units.MAX_BYTES``;
    the 100k-op plan's 140k records: 0.10 s -> 0.03 s), else by a loop over Python ints
    (``sweep_load_by_loop``)."""
    bound = MAX_BYTES
    if sizes and sum(map(abs, sizes)) < bound and -bound < min(first) and max(last) < bound:
        # the steps where a range starts or ends, numbered densely: ``at`` is each end's number
        ends, at = np.unique(np.concatenate((np.array(first, dtype=np.int64), np.array(last, dtype=np.int64) + 1)),
                             return_inverse=True)
        m = len(sizes)
        profile = live_profile_array(np.array(sizes, dtype=np.int64), at[:m], at[m:] - 1, len(ends))
        return int(profile.max())  # the last sum is 0: never below it, as the loop starts
    return sweep_load_by_loop(sizes, first, last)


def sweep_load_by_loop(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> int:
    """``sweep_load`` by a dict of the change at each range end, in Python ints (any sizes)."""
    events: dict[int, int] = {}
    for s, lo, hi in zip(sizes, first, last):
        if s:
            events[lo] = events.get(lo, 0) + s
            events[hi + 1] = events.get(hi + 1, 0) - s
    running = peak = 0
    for step in sorted(events):
        running += events[step]
        peak = max(peak, running)
    return peak


def arena_end(offsets: Sequence[int], sizes: Sequence[int], members: Sequence[int] | None = None) -> int:
    if members is None:
        return max([o + s for o, s in zip(offsets, sizes) if s], default=0)
    return max([offsets[j] + sizes[j] for j in members if sizes[j]], default=0)


def offset_result(
    offsets: Sequence[int], sizes: Sequence[int], load: int, algorithm: str, proven: bool
) -> OffsetAssignment:
    clean = tuple(o if s else 0 for o, s in zip(offsets, sizes))
    arena = arena_end(clean, sizes)
    return OffsetAssignment(clean, arena, load, algorithm, proven or arena == load)

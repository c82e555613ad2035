"""Arena blocks: each device's arena cut into allocations that live only while their buffers do.

A one-block arena is allocated for the whole step, so at the op holding the most
scratch (a result computed outside the arena, then copied in) the device holds the
full arena plus that scratch.  ``cut_blocks`` cuts it twice over:

* in offsets, wherever no buffer's bytes straddle the cut;
* then each such group in time, wherever no buffer of it is live across the cut.

A block is allocated at the first step of its buffers and freed after their last
step.  Every block's bytes and steps lie within the whole arena's, and blocks cut
from one group in time never hold memory at the same step, so the bytes held can
only go down at every step; a block's top is its highest buffer's last byte, so no
alignment padding is held.

A buffer whose producer computes outside the arena anyway can instead be that
producer's own result, a block of its own (``Block.adopts``): no copy, no scratch.
Which producers those are is the runtime's knowledge (``scratch.plan_with_scratch``),
as is whether adopting them lowers the peak.

Pure functions over the plan's buffers and the placed graph's liveness.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Set as AbstractSet

from mpplan.liveness import live_ranges
from mpplan.passes.copies import Placed
from mpplan.plan import Block, Buffer

__all__ = ["Lives", "alone", "buffer_lives", "buffer_sizes", "cut_blocks", "own_blocks"]

#: Steps ``(first, last)`` (inclusive) each dynamic storage is live in, by root tensor name.
Lives = Mapping[str, tuple[int, int]]


def buffer_sizes(placed: Placed) -> dict[str, int]:
    """Bytes of every storage root of the placed graph, by name: what a buffer's tensor really spans."""
    return {t.name: t.nbytes for t in placed.graph.tensors if t.alias_of is None}


def buffer_lives(placed: Placed) -> dict[str, tuple[int, int]]:
    """The steps each dynamic storage of the placed graph is live in, by name (the planner's liveness)."""
    liveness = live_ranges(placed.graph, range(len(placed.graph.ops)))
    tensors = placed.graph.tensors
    return {tensors[r.storage].name: (r.first, r.last) for r in liveness.ranges}


def cut_blocks(buffers: Mapping[str, Buffer], sizes: Mapping[str, int], lives: Lives,
               adopted: AbstractSet[str] = frozenset()) -> tuple[Block, ...]:
    """Every device's buffers cut into blocks in offsets, then in time, wherever no buffer straddles a cut.

    A buffer spans ``[offset, offset + sizes[name])`` (its tensor's bytes, not the
    aligned size) in steps ``lives[name]``; empty ones need no memory and join no
    block.  Each buffer in ``adopted`` is a block of its own (``Block.adopts``) and
    joins no cut.  Blocks come in (device, offset, first) order, the adopted ones last.

    >>> bufs = {"a": Buffer("d", 0, 64), "b": Buffer("d", 0, 64), "c": Buffer("d", 64, 64)}
    >>> lives = {"a": (0, 1), "b": (3, 4), "c": (1, 2)}
    >>> [(b.offset, b.bytes, b.first, b.last) for b in cut_blocks(bufs, {"a": 60, "b": 30, "c": 8}, lives)]
    [(0, 60, 0, 1), (0, 30, 3, 4), (64, 8, 1, 2)]
    """
    own = [Block(buffers[n].device, buffers[n].offset, sizes[n], *lives[n], adopts=n) for n in sorted(adopted)
           if sizes[n]]
    return (*(block for block, _ in _parts(buffers, sizes, lives, adopted)), *own)


def own_blocks(buffers: Mapping[str, Buffer], sizes: Mapping[str, int], lives: Lives,
               adopted: AbstractSet[str] = frozenset()) -> tuple[Block, ...]:
    """One block per non-empty buffer, held exactly while it lives: the finest cut, no-arena mode's memory.

    >>> [(b.offset, b.bytes, b.first, b.adopts) for b in own_blocks({"a": Buffer("d", 0, 64)}, {"a": 8}, {"a": (2, 3)})]
    [(0, 8, 2, None)]
    """
    return tuple(Block(buffers[n].device, buffers[n].offset, sizes[n], *lives[n], adopts=n if n in adopted else None)
                 for n in sorted(buffers) if sizes[n])


def alone(buffers: Mapping[str, Buffer], sizes: Mapping[str, int], lives: Lives) -> set[str]:
    """The buffers ``cut_blocks`` (adopting none) leaves alone in a block of their own."""
    return {names[0] for _, names in _parts(buffers, sizes, lives, frozenset()) if len(names) == 1}


def _parts(buffers: Mapping[str, Buffer], sizes: Mapping[str, int], lives: Lives,
           adopted: AbstractSet[str]) -> list[tuple[Block, list[str]]]:
    """The blocks of ``cut_blocks`` but the adopted ones, each with the buffers it holds."""
    by_device: dict[str, list[str]] = defaultdict(list)
    for name in sorted(buffers):
        if sizes[name] and name not in adopted:
            by_device[buffers[name].device].append(name)
    parts = []
    for device in sorted(by_device):
        for group in _split(by_device[device], lambda n: buffers[n].offset, lambda n: buffers[n].offset + sizes[n]):
            for part in _split(group, lambda n: lives[n][0], lambda n: lives[n][1] + 1):
                start = min(buffers[n].offset for n in part)
                end = max(buffers[n].offset + sizes[n] for n in part)
                first, last = min(lives[n][0] for n in part), max(lives[n][1] for n in part)
                parts.append((Block(device, start, end - start, first, last), part))
    return parts


def _split(names: list[str], low: Callable[[str], int], high: Callable[[str], int]) -> list[list[str]]:
    """``names`` in groups whose intervals ``[low, high)`` chain by overlapping, in ``low`` order."""
    groups: list[list[str]] = []
    end = 0
    for name in sorted(names, key=low):
        if not groups or low(name) >= end:
            groups.append([name])
            end = high(name)
        else:
            groups[-1].append(name)
            end = max(end, high(name))
    return groups

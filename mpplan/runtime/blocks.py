"""Arena blocks: each device's arena cut into allocations that live only while their buffers do.

A one-block arena is allocated for the whole step, so at the op holding the most
scratch (a result computed outside the arena, then copied in) the device holds the
full arena plus that scratch.  Cutting the arena at an offset no buffer straddles
gives two blocks, each allocated at the first step of a buffer in it and freed
after the last step of any: both lifetimes lie inside the whole arena's, so the
bytes held can only go down at every step.  ``cut_blocks`` makes every such cut
(the finest blocks the offsets allow; fewer blocks would only hold more), and a
block's top is its highest buffer's last byte, so no alignment padding is held.

A block holding one buffer whose producer computes outside the arena can be that
producer's own result (``Block.adopted``): no copy, no scratch, the same bytes.
Which producers those are is the runtime's knowledge (``scratch.plan_with_scratch``).

Pure functions over the plan's buffers and the placed graph's liveness.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping

from mpplan.liveness import live_ranges
from mpplan.passes.copies import Placed
from mpplan.plan import Block, Buffer

__all__ = ["BlockSpan", "block_spans", "buffer_sizes", "cut_blocks", "members"]

#: A block and the steps it is allocated in: ``(block, first, last)``, inclusive.
BlockSpan = tuple[Block, int, int]


def buffer_sizes(placed: Placed) -> dict[str, int]:
    """Bytes of every storage root of the placed graph, by name: what a buffer's tensor really spans."""
    graph = placed.graph
    return {t.name: t.nbytes for t in graph.tensors if t.alias_of is None}


def cut_blocks(buffers: Mapping[str, Buffer], sizes: Mapping[str, int]) -> tuple[Block, ...]:
    """Every device's buffers cut into blocks wherever no buffer's bytes straddle the cut.

    A buffer spans ``[offset, offset + sizes[name])`` (its tensor's bytes, not the
    aligned size); empty ones need no memory and join no block.  Blocks are in
    (device, offset) order.

    >>> bufs = {"a": Buffer("d", 0, 64), "b": Buffer("d", 0, 64), "c": Buffer("d", 64, 64)}
    >>> [(b.offset, b.bytes) for b in cut_blocks(bufs, {"a": 60, "b": 30, "c": 8})]
    [(0, 60), (64, 8)]
    """
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for name, buffer in buffers.items():
        if sizes[name]:
            spans[buffer.device].append((buffer.offset, buffer.offset + sizes[name]))
    blocks = []
    for device in sorted(spans):
        start, end = -1, -1
        for offset, stop in sorted(spans[device]):
            if offset >= end:
                if end > start >= 0:
                    blocks.append(Block(device, start, end - start))
                start, end = offset, stop
            else:
                end = max(end, stop)
        blocks.append(Block(device, start, end - start))
    return tuple(blocks)


def members(blocks: tuple[Block, ...], buffers: Mapping[str, Buffer],
            sizes: Mapping[str, int]) -> dict[Block, list[str]]:
    """The non-empty buffers inside each block (by name, in name order); ``ValueError`` for one in none."""
    starts: dict[str, list[int]] = defaultdict(list)
    by_start: dict[tuple[str, int], Block] = {}
    for block in sorted(blocks, key=lambda b: (b.device, b.offset)):
        starts[block.device].append(block.offset)
        by_start[block.device, block.offset] = block
    inside: dict[Block, list[str]] = {b: [] for b in blocks}
    for name in sorted(buffers):
        buffer, size = buffers[name], sizes[name]
        if not size:
            continue
        mine = starts.get(buffer.device, [])
        i = bisect.bisect_right(mine, buffer.offset) - 1
        home = by_start.get((buffer.device, mine[i])) if i >= 0 else None
        if home is None or buffer.offset + size > home.offset + home.bytes:
            raise ValueError(f"buffer of {name!r} on {buffer.device} lies in no block of the plan")
        inside[home].append(name)
    return inside


def block_spans(placed: Placed, blocks: tuple[Block, ...], buffers: Mapping[str, Buffer]) -> tuple[BlockSpan, ...]:
    """Each block with the steps it is allocated in: from its buffers' first step to their last."""
    liveness = live_ranges(placed.graph, range(len(placed.graph.ops)))
    names = placed.graph.tensors
    steps = {names[r.storage].name: (r.first, r.last) for r in liveness.ranges}
    spans = []
    for block, inside in members(blocks, buffers, buffer_sizes(placed)).items():
        lives = [steps[n] for n in inside if n in steps]
        if lives:
            spans.append((block, min(f for f, _ in lives), max(last for _, last in lives)))
    return tuple(spans)

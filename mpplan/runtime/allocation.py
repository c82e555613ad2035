"""What the CUDA caching allocator counts for a plan's memory: every allocation rounded up to 512 bytes.

``max_memory_allocated`` counts the allocator's blocks, not the bytes asked for: each
request is rounded up to a multiple of 512 bytes (``kMinBlockSize``), so a 4-byte step
counter holds 512 and a 128-byte bias 512.  The plan and the storage meter count exact
storage bytes; on a model of many small tensors (biases, norms, Adam's per-parameter
state), the allocator read 4.1% above them on an H200 (a tiny GPT, arena blocks).
A run makes one allocation per static storage (sources cloned to their device, one
buffer per gradient), per block of the arena (or the whole arena), and, without an
arena, per dynamic storage: ``allocated`` counts those as the allocator does.

Not modelled: a cached block up to 1 MiB larger than a large request, handed out whole
when the remainder is too small to split; that depends on what the cache holds.
"""

from __future__ import annotations

import dataclasses

from mpplan.liveness import spans
from mpplan.passes.copies import Placed
from mpplan.plan import Plan

__all__ = ["CUDA_BLOCK_BYTES", "allocated", "cuda_block_bytes"]

#: The CUDA caching allocator's smallest block and rounding unit (``kMinBlockSize``).
CUDA_BLOCK_BYTES = 512


def cuda_block_bytes(nbytes: int) -> int:
    """The bytes the CUDA caching allocator counts for a request of ``nbytes`` (none for an empty one).

    >>> cuda_block_bytes(0), cuda_block_bytes(4), cuda_block_bytes(512), cuda_block_bytes(513)
    (0, 512, 512, 1024)
    """
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES if nbytes > 0 else 0


def allocated(plan: Plan, placed: Placed) -> Plan:
    """``plan`` with each allocation a run of it makes counted as the CUDA allocator counts it.

    Pure: a new plan whose devices' ``static_bytes`` sum their static storages rounded one
    by one (the storages ``placed`` touches, as the plan's static does), whose ``arena_bytes``
    and ``blocks`` are rounded, and whose ``lower_bound_bytes`` holds the rounded static.  The
    peaks are left for ``scratch.held_by_run`` (or ``held_without_arena``) to recompute.
    """
    topo = placed.graph.topology
    first, _ = spans(placed.graph, range(topo.num_ops))
    static = {d.name: 0 for d in plan.devices}
    for s in topo.storages:
        if topo.is_static[s] and first[s] >= 0:
            static[placed.storage_device[s]] += cuda_block_bytes(topo.nbytes[s])
    devices = tuple(
        dataclasses.replace(
            d,
            static_bytes=static[d.name],
            arena_bytes=cuda_block_bytes(d.arena_bytes),
            lower_bound_bytes=d.lower_bound_bytes - d.static_bytes + static[d.name],
        )
        for d in plan.devices
    )
    blocks = tuple(dataclasses.replace(b, bytes=cuda_block_bytes(b.bytes)) for b in plan.blocks)
    return dataclasses.replace(plan, devices=devices, blocks=blocks)

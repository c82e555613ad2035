"""The memory of a plan's arena blocks over a run: each allocated at its first step, freed after its last.

In arena mode with ``plan.blocks`` (see ``blocks``) the executor asks ``BlockMemory``
for the allocation holding a planned offset at the current step, instead of one
arena held all step.  A block is a plain ``uint8`` tensor on its device, registered
with the run's meter; it is freed when the executor drops it and the last view of it
(its buffers' values, released by the schedule at their last step) is gone.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from mpplan.errors import PlanError
from mpplan.plan import Block
from mpplan.runtime.devices import DeviceMap
from mpplan.runtime.schedule import Schedule, Step
from mpplan.runtime.tracking import StorageMeter

__all__ = ["BlockMemory"]


class BlockMemory:
    """The arena blocks of a plan (``plan.blocks``) over a run: allocated at their first step, freed after their last.

    An adopted block is never allocated here: it is its producer's own result.
    """

    def __init__(self, schedule: Schedule) -> None:
        blocks = schedule.plan.blocks
        self.adopted = frozenset(b.adopts for b in blocks if b.adopts is not None)
        self._opens: dict[int, list[Block]] = defaultdict(list)
        self._closes: dict[int, list[Block]] = defaultdict(list)
        for block in blocks:
            if block.adopts is None:
                self._opens[block.first].append(block)
                self._closes[block.last].append(block)
        self._live: dict[str, dict[Block, torch.Tensor]] = defaultdict(dict)

    def open(self, step: Step, device_map: DeviceMap, meter: StorageMeter) -> None:
        """Allocate the blocks whose first buffer ``step`` makes."""
        for block in self._opens.get(step.index, ()):
            memory = torch.empty(block.bytes, dtype=torch.uint8, device=device_map.torch_device(block.device))
            meter.register(memory, block.device)
            self._live[block.device][block] = memory
        if step.index in self._opens:
            meter.sample()

    def close(self, step: Step) -> None:
        """Drop the blocks whose last buffer died at ``step`` (their memory goes with the views of it)."""
        for block in self._closes.get(step.index, ()):
            del self._live[block.device][block]

    def holding(self, device: str, offset: int) -> tuple[torch.Tensor, int]:
        """The allocated block holding arena offset ``offset`` of ``device`` now, and the offset within it.

        Blocks allocated together never share offsets (``plan.Block``), so at most one holds it.
        """
        for block, memory in self._live[device].items():
            if block.offset <= offset < block.offset + block.bytes:
                return memory, offset - block.offset
        raise PlanError(f"plan: offset {offset} of {device} is in no block allocated at this step")

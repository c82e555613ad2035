"""Kernel workspaces: memory a CUDA kernel allocates and frees again inside one ATen call.

cuDNN's convolutions, the efficient-attention backward and CUDA's multi-block
reductions take working memory from the caching allocator for the length of one
call.  The dispatcher sees only a call's results, so neither the traced graph nor
the storage meter knows these bytes, while the allocator counts them.  Measured
on an H100 (torch 2.11): a ``sum.dim_IntList`` over a (1024, 512) bias gradient
4,194,816 bytes, the efficient-attention backward of the zoo GPT (8x128, d 128)
2,113,536, a zoo ResNet ``convolution_backward`` 2,506,752.  Which algorithm, and
so how much, is cuDNN's and the GPU's choice: only a run can tell.

``WorkspaceProbe`` measures them: around each kernel call the allocator's peak is
reset and read back, and what it reached above the bytes held before and after
the call is that call's workspace.  Resetting the peak spoils a measurement window,
so the executor probes in its warm-up step only; the prediction then holds each
op's largest workspace at the op's step, beside its blocks (``scratch.held_by_run``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

__all__ = ["AllocatorReading", "WorkspaceProbe", "cuda_reading"]

T = TypeVar("T")

#: ``(allocated now, allocated peak since the last reset)`` of one device, and the reset: the allocator's view.
AllocatorReading = tuple[Callable[[torch.device], tuple[int, int]], Callable[[torch.device], None]]


def _cuda_read(device: torch.device) -> tuple[int, int]:
    return int(torch.cuda.memory_allocated(device)), int(torch.cuda.max_memory_allocated(device))


def _cuda_reset(device: torch.device) -> None:
    torch.cuda.reset_peak_memory_stats(device)


#: The CUDA caching allocator's reading (the only allocator that counts a kernel's workspace).
cuda_reading: AllocatorReading = (_cuda_read, _cuda_reset)


@dataclass
class WorkspaceProbe:
    """The largest workspace each op's kernels took, by op name (``found``), on the devices ``reading`` sees."""

    reading: AllocatorReading = cuda_reading
    found: dict[str, int] = field(default_factory=dict)

    def call(self, op: str, device: torch.device, kernel: Callable[[], T]) -> T:
        """Run ``kernel`` (one ATen call of ``op`` on ``device``) and note what it held only while it ran."""
        read, reset = self.reading
        before, _ = read(device)
        reset(device)
        result = kernel()
        after, peak = read(device)
        hidden = peak - max(before, after)
        if hidden > self.found.get(op, 0):
            self.found[op] = hidden
        return result

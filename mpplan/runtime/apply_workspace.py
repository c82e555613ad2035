"""Kernel workspaces in a user's loop: probed in one step, placed at their ops' steps by ``apply``'s prediction.

The executor probes each IR op's kernels by the op's name (``workspace``); in a user's
loop eager PyTorch calls the kernels and no IR op is running.  So a probed step keys
each ATen call by what decides its kernel, and so its workspace: the overload and the
shapes, strides and dtypes of its tensors (``call_key``).  An IR op's key is the same
function of its fx node's traced values (``op_keys``), so ``op_workspaces`` finds each
op's workspace without the calls and the ops ever being lined up.  A recompute's
kernel is its original's: ``predict_apply`` reads the workspace through ``recompute_of``.

Measured on an H200: the tiny zoo GPT of ``tests/test_apply_remat.py`` ran 1.1 MB
above ``apply``'s prediction (2,224,640 bytes against 1,100,952) with cuBLAS's
workspaces already in the base: memory only a kernel's allocations show.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.runtime.workspace import WorkspaceProbe

__all__ = ["call_key", "op_keys", "op_workspaces", "probing_calls"]


def call_key(func: Any, args: Any, kwargs: Any) -> str:
    """The overload and each tensor's shape, stride and dtype, in order: most of what decides a call's kernel.

    Other arguments (a convolution's stride, a reduction's dims) are left out, so calls that differ only
    there share a key, and each takes the largest workspace probed for it: an over-prediction, never under.
    """
    tensors = [
        f"{tuple(leaf.shape)}/{tuple(leaf.stride())}/{leaf.dtype}"
        for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)
    ]
    return f"{func}({', '.join(tensors)})"


def op_keys(program: CapturedProgram) -> dict[str, str]:
    """IR op -> ``call_key`` of the call eager makes for it (``CapturedProgram.eager_call``)."""
    return {op: call_key(*program.eager_call(op)) for op in program.op_nodes}


def op_workspaces(program: CapturedProgram, found: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """IR op -> the workspace a probed step found for calls like its own (``found``: call key -> bytes), and
    the workspaces of calls like no op's (call key -> bytes: the optimizer's, moves between devices)."""
    keys = op_keys(program)
    known = set(keys.values())
    return ({op: found[key] for op, key in keys.items() if found.get(key)},
            {key: nbytes for key, nbytes in found.items() if nbytes and key not in known})


class _ProbingMode(TorchDispatchMode):
    """Every ATen call on a device of ``device_types`` run under ``probe``, keyed by ``call_key``."""

    def __init__(self, probe: WorkspaceProbe, device_types: tuple[str, ...]) -> None:
        super().__init__()
        self.probe = probe
        self.device_types = device_types

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device") or next(  # where a call names it (a factory, a copy), else its first tensor's
            (leaf.device for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)), None)
        if device is None or torch.device(device).type not in self.device_types:
            return func(*args, **kwargs)
        return self.probe.call(call_key(func, args, kwargs), torch.device(device), lambda: func(*args, **kwargs))


@contextmanager
def probing_calls(probe: WorkspaceProbe, device_types: tuple[str, ...] = ("cuda",)) -> Iterator[WorkspaceProbe]:
    """Probe the workspace of every kernel run inside on a device of ``device_types`` (only a GPU's allocator
    counts workspaces), forward and backward: autograd carries the mode to its device threads.  Probing
    resets the allocator's peak statistics around each call: probe a warm-up step.  One GPU at a time:
    with several, autograd's threads for them run at once, and a reading on one device may count another
    thread's copy onto it."""
    with _ProbingMode(probe, device_types):
        yield probe

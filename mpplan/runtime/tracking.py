"""Live storage accounting: the bytes really held, per device, each storage counted once.

The executor and the eager baseline measure memory the same way on virtual
devices (and, as a cross-check, on GPUs): every tensor storage that comes into
existence is registered with the device it belongs to and counted until the
storage is actually freed.  Nothing here trusts the plan's lifetimes; a storage
that stays alive because something still refers to it keeps counting, which is
exactly the point.

How a storage's death is seen: torch keeps one Python object per live storage
(``t.untyped_storage()`` returns the same object for as long as the storage
lives, even when no Python code holds it), so a plain ``weakref`` to that object
fires exactly when the storage is freed, and its callback takes the bytes off.
The registry holds no raw ``StorageImpl`` pointers and no manually counted C++
weak references (``StorageWeakRef``): nothing here can touch freed memory, and an
entry is gone before its id could be reused.  (The GPU segfault of issue 14 was not
this registry: on an H100 runs without it crashed the same way, in
``cudnn_batch_norm.out``, which ``arena.out_variant`` no longer uses.)

``StorageMeter`` keeps the registry and the running peaks; ``MeteringMode`` is a
``TorchDispatchMode`` that registers the outputs of every ATen call made while it
is active (forward, backward and optimizer ops alike) under the meter's current
device, and samples the peak right after each call that created storage, while
its inputs and all of its outputs are alive (live bytes grow only then, so no
peak is missed).  It sees what reaches the dispatcher: a kernel's internal
scratch memory (a cuBLAS workspace) shows only in the CUDA allocator's numbers.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["MeteringMode", "StorageMeter", "tensor_leaves"]


@dataclass(slots=True)
class _Entry:
    ref: weakref.ref
    device: str
    nbytes: int
    transient: bool


class StorageMeter:
    """Registry of live storages with per-device running peaks.

    ``device`` is the tag new registrations get by default (the executor sets it to
    the planned device of the op it runs).  ``transient`` registrations (results an
    arena executor computes outside the arena and then copies in) are summed
    separately: ``peaks`` are the planned storages' bytes, ``transient_peaks`` the
    transients', and ``total_peaks`` both at once, which is what an allocator
    holding every storage (the CUDA one) counts.  Peaks only move in ``sample``;
    ``reset_peaks`` starts a new measurement window from what is live now.
    """

    def __init__(self, device: str = "") -> None:
        if not _storages_are_preserved():
            raise RuntimeError(
                f"torch {torch.__version__} does not keep one Python object per live storage, which the storage "
                "meter follows: use a torch release that does (2.1 or later)"
            )
        self.device = device
        self.enabled = True
        self._entries: dict[int, _Entry] = {}
        self._live: dict[str, int] = {}
        self._transient: dict[str, int] = {}
        self.peaks: dict[str, int] = {}
        self.transient_peaks: dict[str, int] = {}
        self.total_peaks: dict[str, int] = {}

    def register(
        self, values: Any, device: str | None = None, *, transient: bool = False, pinned: bool = False
    ) -> int:
        """Count the storages of every tensor in ``values`` (nested lists, tuples, dicts) under ``device``.

        A storage already registered keeps its first device and category.
        ``pinned`` (storages the caller holds for the meter's whole life: an
        executor's parameters, arenas) is accepted for callers' clarity; every
        storage is counted until it dies, pinned or not.  Returns the bytes added.
        """
        del pinned  # deaths are reported by weakref callbacks: nothing is polled, so nothing needs exempting
        tag = self.device if device is None else device
        added = 0
        for tensor in tensor_leaves(values):
            if tensor.device.type == "meta" or tensor.is_sparse or tensor.is_nested:
                continue  # no bytes of their own, or no single storage to follow
            storage = tensor.untyped_storage()
            nbytes = int(storage.nbytes())
            key = id(storage)
            if nbytes == 0 or key in self._entries:
                continue
            try:
                ref = weakref.ref(storage, self._dead_callback(key))
            except TypeError:
                continue  # a storage torch cannot follow (no Python object of its own): not counted
            self._entries[key] = _Entry(ref, tag, nbytes, transient)
            bucket = self._transient if transient else self._live
            bucket[tag] = bucket.get(tag, 0) + nbytes
            added += nbytes
        return added

    def _dead_callback(self, key: int) -> Any:
        """A weakref callback that takes storage ``key``'s bytes off when it dies (holding the meter weakly)."""
        meter = weakref.ref(self)

        def dead(_ref: weakref.ref) -> None:
            owner = meter()
            if owner is None:
                return
            entry = owner._entries.pop(key, None)
            if entry is not None and entry.ref is _ref:
                bucket = owner._transient if entry.transient else owner._live
                bucket[entry.device] -= entry.nbytes
            elif entry is not None:
                owner._entries[key] = entry  # an entry for a newer storage under a reused id: keep it

        return dead

    def register_results(self, values: Any, device: torch.device, *, transient: bool = False) -> int:
        """Register op results made for a planned device running on torch ``device``.

        Results a kernel leaves in host memory while running on a GPU (attention's
        RNG seed and offset, for one) are not GPU memory: they are counted under
        ``"<device>@host"``.
        """
        added = 0
        for tensor in tensor_leaves(values):
            if tensor.device.type == device.type:
                added += self.register(tensor, transient=transient)
            else:
                added += self.register(tensor, f"{self.device}@host", transient=transient)
        return added

    def sample(self) -> None:
        """Raise the peaks to what is live now (dead storages were already taken off when they died)."""
        if not self.enabled:
            return
        for tag in set(self._live) | set(self._transient):
            live, transient = self._live.get(tag, 0), self._transient.get(tag, 0)
            self.peaks[tag] = max(self.peaks.get(tag, 0), live)
            self.transient_peaks[tag] = max(self.transient_peaks.get(tag, 0), transient)
            self.total_peaks[tag] = max(self.total_peaks.get(tag, 0), live + transient)

    def live_bytes(self, device: str) -> int:
        """Non-transient bytes live on ``device`` now."""
        return self._live.get(device, 0)

    def reset_peaks(self) -> None:
        """Start a new window: peaks become what is live right now."""
        self.peaks, self.transient_peaks, self.total_peaks = {}, {}, {}
        self.sample()


class MeteringMode(TorchDispatchMode):
    """Register every ATen call's outputs with ``meter`` and sample its peak after each call."""

    def __init__(self, meter: StorageMeter, device: torch.device) -> None:
        super().__init__()
        self.meter = meter
        self.device = device

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.meter.register_results(out, self.device):
            self.meter.sample()  # live bytes only grow when something new appears
        return out


@functools.cache
def _storages_are_preserved() -> bool:
    """Whether a storage's Python object lives as long as the storage (what the weakref callbacks rely on)."""
    tensor = torch.empty(1)
    ref = weakref.ref(tensor.untyped_storage())
    alive = ref() is not None
    del tensor
    return alive and ref() is None


def tensor_leaves(values: Any) -> Iterable[torch.Tensor]:
    """Every tensor in a nest of lists, tuples and dicts."""
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, (list, tuple)):
        for v in values:
            yield from tensor_leaves(v)
    elif isinstance(values, dict):
        for v in values.values():
            yield from tensor_leaves(v)

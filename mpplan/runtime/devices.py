"""Which torch device each planned device runs on: real GPUs, or virtual devices in CPU memory.

A plan names devices (``cuda:0``, ``cuda:1``, ``gpu_a``...).  The executor needs a
``torch.device`` for each.  With enough GPUs, planned device ``i`` runs on
``cuda:i``; with too few, or none, every planned device is *virtual*: its tensors
live in CPU memory and the executor tags them with the planned device they belong
to, so per-device accounting, copies and arenas are exercised on any laptop.
Several planned devices may also share one GPU (``{"cuda:0": "cuda:0",
"cuda:1": "cuda:0"}``); their allocator peaks then cannot be told apart, so the
measurement falls back to tracked live bytes per planned device.

On a GPU the allocator's numbers are read over a window: ``allocator_base``
first creates the cuBLAS/cuBLASLt workspaces a run would otherwise create inside
the window (the calling thread's and autograd's device thread's), then records
what the device already holds; ``reset_peak`` opens the window and
``allocator_window`` closes it.  A run's measured peak is the window's
``max_memory_allocated`` less that base: memory the run did not allocate (other
tensors of the process, library workspaces) is not the run's.

This module (with the rest of ``mpplan.runtime``) is the only place that touches
``torch.cuda``.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from mpplan.errors import PlanError

__all__ = [
    "AllocatorBase",
    "AllocatorWindow",
    "DeviceMap",
    "DevicesArg",
    "allocator_base",
    "allocator_window",
    "cuda_available",
    "map_devices",
    "reset_peak",
    "synchronize",
    "warm_up",
]

logger = logging.getLogger("mpplan")

#: What callers may pass as ``devices``: ``None`` (auto), ``"virtual"``/``"cpu"``, ``"cuda"``,
#: a sequence of torch devices (one per planned device) or a mapping planned name -> torch device.
DevicesArg = None | str | Sequence[str] | Mapping[str, str]


def cuda_available() -> bool:
    """Whether at least one CUDA device can be used."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@dataclass(frozen=True)
class DeviceMap:
    """Planned device name -> the torch device it runs on (``cpu`` means virtual)."""

    physical: Mapping[str, str]

    def torch_device(self, planned: str) -> torch.device:
        return torch.device(self.physical[planned])

    def is_virtual(self, planned: str) -> bool:
        return self.torch_device(planned).type == "cpu"

    @property
    def virtual(self) -> bool:
        """True when every planned device is virtual (CPU memory)."""
        return all(self.is_virtual(d) for d in self.physical)

    @property
    def cuda_devices(self) -> tuple[torch.device, ...]:
        """The distinct CUDA devices in use, in first-use order."""
        seen: dict[str, None] = {}
        for name in self.physical.values():
            if torch.device(name).type == "cuda":
                seen[str(torch.device(name))] = None
        return tuple(torch.device(d) for d in seen)

    def sharing(self, planned: str) -> tuple[str, ...]:
        """The planned devices (``planned`` included) that run on the same torch device as ``planned``."""
        mine = self.torch_device(planned)
        return tuple(d for d in self.physical if self.torch_device(d) == mine)

    def to_dict(self) -> dict[str, str]:
        return dict(self.physical)


def map_devices(planned: Sequence[str], devices: DevicesArg = None) -> DeviceMap:
    """Map the plan's device names onto torch devices.

    * ``None``: ``cuda:i`` for planned device ``i`` when CUDA has at least as many
      devices as the plan, else every device virtual (CPU memory).
    * ``"virtual"`` or ``"cpu"``: every device virtual.
    * ``"cuda"``: round-robin over the visible GPUs (several planned devices may share one).
    * a sequence: one torch device per planned device, in plan order.
    * a mapping: planned name -> torch device, covering every planned device.
    """
    names = list(planned)
    if not names:
        raise PlanError("the plan lists no devices")
    if devices is None:
        count = torch.cuda.device_count() if cuda_available() else 0
        if count >= len(names):
            physical = {d: f"cuda:{i}" for i, d in enumerate(names)}
        else:
            if count:
                logger.info("plan needs %d devices, %d GPUs visible: running on virtual devices", len(names), count)
            physical = {d: "cpu" for d in names}
    elif isinstance(devices, str):
        if devices in ("virtual", "cpu"):
            physical = {d: "cpu" for d in names}
        elif devices == "cuda":
            if not cuda_available():
                raise PlanError("devices='cuda': no CUDA device is available; use devices='virtual'")
            count = torch.cuda.device_count()
            physical = {d: f"cuda:{i % count}" for i, d in enumerate(names)}
        else:
            raise PlanError(f"devices: expected None, 'virtual', 'cuda', a list or a mapping, got {devices!r}")
    elif isinstance(devices, Mapping):
        missing = [d for d in names if d not in devices]
        if missing:
            raise PlanError(f"devices: no torch device given for planned device(s) {', '.join(missing)}")
        physical = {d: str(devices[d]) for d in names}
    else:
        given = list(devices)
        if len(given) != len(names):
            raise PlanError(f"devices: expected {len(names)} torch devices (one per planned device), got {len(given)}")
        physical = {d: str(t) for d, t in zip(names, given)}
    physical = {planned_name: _check_torch_device(planned_name, name) for planned_name, name in physical.items()}
    return DeviceMap(MappingProxyType(physical))


def _check_torch_device(planned: str, name: str) -> str:
    """``name`` checked and normalised: a bare ``cuda`` becomes ``cuda:<current device>``.

    Normalising matters: ``torch.device("cuda") != torch.device("cuda:0")``, so
    without it two planned devices on the same GPU would not be seen as sharing it
    and would each report the whole GPU's allocator peak as their own.
    """
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise PlanError(f"devices: {planned!r} -> {name!r} is not a torch device ({exc})") from None
    if device.type not in ("cpu", "cuda"):
        raise PlanError(f"devices: {planned!r} -> {name!r}: expected a cpu (virtual) or cuda device")
    if device.type == "cuda":
        if not cuda_available():
            raise PlanError(f"devices: {planned!r} -> {name!r}: CUDA is not available")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise PlanError(f"devices: {planned!r} -> {name!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return f"cuda:{index}"
    return "cpu"


def synchronize(device_map: DeviceMap) -> None:
    """Wait for every CUDA device in use (a no-op on virtual devices)."""
    for device in device_map.cuda_devices:
        torch.cuda.synchronize(device)


@dataclass(frozen=True, slots=True)
class AllocatorBase:
    """What one CUDA device held before a run was built: not the run's memory."""

    allocated: int
    requested: int | None


@dataclass(frozen=True, slots=True)
class AllocatorWindow:
    """One CUDA device's caching-allocator peaks over a measurement window, and the base before the run.

    ``peak_allocated`` is ``max_memory_allocated`` (block sizes: requests rounded up
    to 512 bytes, and a cached block up to 1 MiB larger than asked for is handed out
    whole), ``peak_requested`` the peak of the bytes actually asked for, and
    ``peak_reserved`` ``max_memory_reserved`` (segments obtained from ``cudaMalloc``).
    """

    device: str
    base: AllocatorBase
    peak_allocated: int
    peak_reserved: int
    peak_requested: int | None

    @property
    def measured(self) -> int:
        """The run's peak: ``max_memory_allocated`` less what the device held before the run."""
        return max(self.peak_allocated - self.base.allocated, 0)

    @property
    def measured_requested(self) -> int | None:
        """The run's peak of requested bytes (no allocator rounding), less the base (``None``: torch lacks the stat)."""
        if self.peak_requested is None or self.base.requested is None:
            return None
        return max(self.peak_requested - self.base.requested, 0)


def warm_up(device: torch.device) -> None:
    """Create the cuBLAS and cuBLASLt handles and workspaces a step on ``device`` will use.

    torch allocates a workspace per (handle, stream) through the caching allocator
    (several MiB: by default about 8 MiB, 32 MiB on Hopper), so it counts in
    ``memory_allocated``; handles are per thread, and autograd runs backward on a
    device thread of its own, so eager training holds two.  Creating them now (a tiny
    ``addmm``/``mm`` and its backward) puts them in the base both the planned run and
    the eager baseline are measured against, instead of in one run's window and not
    the other's.  Idempotent.
    """
    with torch.inference_mode(False), torch.enable_grad():
        a = torch.ones((16, 16), device=device, requires_grad=True)
        bias = torch.ones((16,), device=device)
        torch.addmm(bias, a, a).mm(a).sum().backward()
    del a, bias
    torch.cuda.synchronize(device)


def allocator_base(device_map: DeviceMap) -> dict[str, AllocatorBase]:
    """Warm up every CUDA device in use, let go of garbage, and record what each holds now."""
    gc.collect()
    bases = {}
    for device in device_map.cuda_devices:
        warm_up(device)
    for device in device_map.cuda_devices:
        torch.cuda.synchronize(device)
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        stats = torch.cuda.memory_stats(device)
        bases[str(device)] = AllocatorBase(
            allocated=int(torch.cuda.memory_allocated(device)),
            requested=_stat(stats, "requested_bytes.all.current"),
        )
    return bases


def reset_peak(device: torch.device) -> None:
    """Open a measurement window on one CUDA device: wait for its work, flush the cache, reset its peaks."""
    torch.cuda.synchronize(device)
    with torch.cuda.device(device):
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)


def allocator_window(device: torch.device, base: AllocatorBase) -> AllocatorWindow:
    """Close the window ``reset_peak`` opened on ``device`` (after a synchronize) and read its peaks."""
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    return AllocatorWindow(
        device=str(device),
        base=base,
        peak_allocated=int(torch.cuda.max_memory_allocated(device)),
        peak_reserved=int(torch.cuda.max_memory_reserved(device)),
        peak_requested=_stat(stats, "requested_bytes.all.peak"),
    )


def _stat(stats: Mapping[str, object], key: str) -> int | None:
    """One ``torch.cuda.memory_stats`` entry (``requested_bytes`` exists from torch 2.1 on)."""
    value = stats.get(key)
    return None if value is None else int(value)  # type: ignore[call-overload]

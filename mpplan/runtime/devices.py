"""Which torch device each planned device runs on: real GPUs, or virtual devices in CPU memory.

A plan names devices (``cuda:0``, ``cuda:1``, ``gpu_a``...).  The executor needs a
``torch.device`` for each.  With enough GPUs, planned device ``i`` runs on
``cuda:i``; with too few, or none, every planned device is *virtual*: its tensors
live in CPU memory and the executor tags them with the planned device they belong
to, so per-device accounting, copies and arenas are exercised on any laptop.
Several planned devices may also share one GPU (``{"cuda:0": "cuda:0",
"cuda:1": "cuda:0"}``); their allocator peaks then cannot be told apart, so the
measurement falls back to tracked live bytes per planned device.

This module (with the rest of ``mpplan.runtime``) is the only place that touches
``torch.cuda``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import torch

from mpplan.errors import PlanError

__all__ = [
    "DeviceMap",
    "DevicesArg",
    "allocator_peak",
    "allocator_peaks",
    "cuda_available",
    "map_devices",
    "reset_peak",
    "synchronize",
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
    for planned_name, name in physical.items():
        _check_torch_device(planned_name, name)
    return DeviceMap(MappingProxyType(physical))


def _check_torch_device(planned: str, name: str) -> None:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise PlanError(f"devices: {planned!r} -> {name!r} is not a torch device ({exc})") from None
    if device.type not in ("cpu", "cuda"):
        raise PlanError(f"devices: {planned!r} -> {name!r}: expected a cpu (virtual) or cuda device")
    if device.type == "cuda":
        if not cuda_available():
            raise PlanError(f"devices: {planned!r} -> {name!r}: CUDA is not available")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise PlanError(f"devices: {planned!r} -> {name!r}: only {torch.cuda.device_count()} CUDA device(s)")


def synchronize(device_map: DeviceMap) -> None:
    """Wait for every CUDA device in use (a no-op on virtual devices)."""
    for device in device_map.cuda_devices:
        torch.cuda.synchronize(device)


def allocator_peaks(device_map: DeviceMap) -> dict[str, tuple[int, int]]:
    """CUDA device -> (max allocated, max reserved) bytes since the last ``reset_peaks``."""
    return {
        str(d): (int(torch.cuda.max_memory_allocated(d)), int(torch.cuda.max_memory_reserved(d)))
        for d in device_map.cuda_devices
    }


def allocator_peak(device: torch.device) -> tuple[int, int]:
    """(max allocated, max reserved) bytes of one CUDA device since its last reset."""
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def reset_peak(device: torch.device) -> None:
    """Reset one CUDA device's peak statistics (after a synchronize and cache flush)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)

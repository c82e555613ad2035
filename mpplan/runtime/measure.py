"""Measurement records: what ``evaluate`` found, predicted against measured, as JSON-able data.

``Measurement.to_dict()`` is ``measurement.json``::

    {"devices": [{"name", "predicted_peak_bytes", "measured_peak_bytes", "error_pct", ...}],
     "step_time_s", "eager": {"devices": [...], "step_time_s"},
     "numerics": {"ok", "max_abs_diff", "first_bad_op"}, ...}

Which prediction a device is held to depends on how it ran.  In arena mode the
device holds its static tensors plus one arena of ``arena_bytes`` and, while an
op that has no ``out=`` overload runs, its results computed outside the arena
before they are copied in (``scratch_bytes``, the largest such result, known from
the traced kernels before the run).  A plan made with ``scratch.plan_with_scratch``
counts that scratch in its own ``peak_bytes``, which is then the prediction; for a
plan made without it, the prediction is its ``peak_bytes`` plus the scratch the plan
leaves out.  Without an arena every tensor is its own
allocation, freed after its last use, so what the device can need is the plan's
``lower_bound_bytes`` (static + LOAD, the simulator's live-bytes maximum; no
fragmentation, no alignment padding).  Both plan numbers are kept in the record.

What is measured depends on where a planned device ran (``source``):

* ``"allocator"``: the planned device had a GPU to itself.  ``measured_peak_bytes``
  is the CUDA caching allocator's ``max_memory_allocated`` over the timed steps
  less ``allocator_base_bytes``, what the GPU held before the run was built (other
  tensors of the process, and the cuBLAS/cuBLASLt workspaces, created first on
  purpose so that neither the plan nor eager is charged for them).  It includes
  the allocator's rounding (512-byte blocks, which the prediction counts for each
  static storage, arena block and, without an arena, each storage:
  ``runtime/allocation.py``), results computed
  outside the arena and copied in (``transient_peak_bytes``), and scratch memory
  kernels allocate for themselves (cuDNN convolution workspaces, reductions' partial
  sums), which the warm-up step measures per op and the prediction places at the
  op's step, arena or not (``workspace_bytes``).  ``allocator_peak_bytes`` is the raw ``max_memory_allocated``,
  ``requested_peak_bytes`` the peak of bytes asked for (no rounding, base
  subtracted), ``reserved_peak_bytes`` the raw ``max_memory_reserved``.
* ``"tracked (shared GPU)"``: several planned devices ran on one GPU
  (``shared_with``).  The allocator cannot tell their memory apart, so
  ``measured_peak_bytes`` is ``tracked_peak_bytes``; the allocator fields are the
  whole GPU's, shared by all of them, and are repeated on each.
* ``"tracked"``: a virtual device (CPU memory); ``measured_peak_bytes`` is
  ``counted_peak_bytes``: every storage the device held at once, planned ones
  (``tracked_peak_bytes``) and transients alike, as the CUDA allocator counts them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DeviceMeasurement", "EagerDevice", "EagerMeasurement", "Measurement", "Numerics", "error_pct"]


def error_pct(predicted: int, measured: int) -> float:
    """``(measured - predicted) / predicted`` in percent (0 when both are 0)."""
    if predicted == 0:
        return 0.0 if measured == 0 else float("inf")
    return round(100.0 * (measured - predicted) / predicted, 4)


@dataclass(frozen=True, slots=True)
class DeviceMeasurement:
    """One planned device: predicted and measured peak memory.

    ``measured_peak_bytes`` is the CUDA allocator's ``max_memory_allocated`` less
    ``allocator_base_bytes`` when the planned device has a GPU to itself (see the
    module docstring), else ``counted_peak_bytes``: the most bytes of live tensor
    storages tagged with this device at once, each storage counted once, transients
    included.  ``tracked_peak_bytes`` is the same without transients (the plan's
    own storages); ``transient_peak_bytes`` is the most bytes held at once by
    results computed outside the arena and then copied in (ops with no ``out=``
    overload), and ``scratch_bytes`` the prediction of it.  ``copied_in_bytes`` are the bytes copies brought
    onto this device per step.  ``workspace_bytes`` is the largest workspace one of its ops' kernels took
    (measured on a GPU in the warm-up step, ``workspace.WorkspaceProbe``; 0 elsewhere): the prediction
    measured by the allocator holds each op's workspace at its step, with an arena or without.
    ``predicted_storage_bytes`` is the prediction of what the meter counts (``counted_peak_bytes``): the same without
    workspaces.
    """

    name: str
    torch_device: str
    predicted_peak_bytes: int
    measured_peak_bytes: int
    error_pct: float
    tracked_peak_bytes: int
    transient_peak_bytes: int
    plan_peak_bytes: int
    plan_lower_bound_bytes: int
    static_bytes: int
    arena_bytes: int
    copied_in_bytes: int
    allocator_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    source: str = "tracked"
    allocator_base_bytes: int | None = None
    requested_peak_bytes: int | None = None
    shared_with: tuple[str, ...] = ()
    counted_peak_bytes: int = 0
    scratch_bytes: int = 0
    workspace_bytes: int = 0
    predicted_storage_bytes: int = 0

    @property
    def exact(self) -> bool:
        return self.measured_peak_bytes == self.predicted_peak_bytes


@dataclass(frozen=True, slots=True)
class EagerDevice:
    """Peak memory of plain PyTorch on one device, measured like a planned device's.

    On a GPU ``measured_peak_bytes`` is ``max_memory_allocated`` over the timed steps
    less ``allocator_base_bytes`` (what the GPU held before the module was copied
    there), so the module's parameters, gradients, optimizer state and inputs count
    as the plan's static memory does; on a virtual device it is the tracked peak.
    """

    name: str
    measured_peak_bytes: int
    tracked_peak_bytes: int
    allocator_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    source: str = "tracked"
    allocator_base_bytes: int | None = None
    requested_peak_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class EagerMeasurement:
    """The eager baseline: the original module run by plain PyTorch on one device."""

    devices: tuple[EagerDevice, ...]
    step_time_s: float
    step_times_s: tuple[float, ...] = ()
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [asdict(d) for d in self.devices],
            "step_time_s": self.step_time_s,
            "step_times_s": list(self.step_times_s),
            "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class Numerics:
    """Planned execution against eager PyTorch after the first step.

    ``ok``: every compared tensor (outputs or loss, gradients, parameters and buffers
    after the update) is within ``rtol``/``atol`` of eager's; ``bitwise``: all are
    identical.  ``first_bad_op`` names the first op whose inputs or outputs differ
    from two op-by-op reference runs of the same schedule without arena beyond
    those runs' own noise (found only when ``ok`` is false); ``detail`` says what
    differed.  ``noise`` is the largest difference between eager runs from the same
    seed (the first and up to three more), which the tolerance allows for (``None``
    when eager ran once: the first comparison passed).
    """

    ok: bool
    max_abs_diff: float
    first_bad_op: str | None
    bitwise: bool
    compared: int
    rtol: float
    atol: float
    worst: str | None = None
    detail: str | None = None
    noise: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Measurement:
    """Everything one ``evaluate`` measured.

    ``step_time_s`` is the median of the timed steps; ``copied_bytes`` the bytes the
    plan's copies moved between devices per step; ``transient_bytes`` the bytes of
    results computed outside the arena and copied in, per step (0 without arena).
    """

    graph_hash: str
    mode: str
    arena: bool
    devices: tuple[DeviceMeasurement, ...]
    device_map: dict[str, str]
    step_time_s: float
    step_times_s: tuple[float, ...]
    copied_bytes: int
    transient_bytes: int
    eager: EagerMeasurement | None
    numerics: Numerics | None
    steps: int
    warmup: int

    @property
    def exact(self) -> bool:
        """True when every device's measured peak equals its prediction."""
        return all(d.exact for d in self.devices)

    def device(self, name: str) -> DeviceMeasurement:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "graph_hash": self.graph_hash,
            "mode": self.mode,
            "arena": self.arena,
            "device_map": dict(self.device_map),
            "devices": [asdict(d) for d in self.devices],
            "step_time_s": self.step_time_s,
            "step_times_s": list(self.step_times_s),
            "copied_bytes": self.copied_bytes,
            "transient_bytes": self.transient_bytes,
            "eager": None if self.eager is None else self.eager.to_dict(),
            "numerics": None if self.numerics is None else self.numerics.to_dict(),
            "steps": self.steps,
            "warmup": self.warmup,
            "exact": self.exact,
        }

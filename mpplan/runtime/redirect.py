"""The dispatch mode an executor runs each op under: metering, device retargeting, planned outputs.

Every ATen call's fresh results are registered with the run's ``StorageMeter``
under the planned device of the op being run.  In arena mode the op's own call is
redirected (``Redirect``): to its ``out=`` overload writing into the planned arena
views, to an exact rewrite (``arena.exact_rewrite``), or else computed and copied
in, its results counted as transient while they exist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mpplan.runtime.arena import Rewrite
from mpplan.runtime.schedule import Step, Target, flatten, unflatten
from mpplan.runtime.tracking import StorageMeter
from mpplan.runtime.workspace import WorkspaceProbe

__all__ = ["ExecMode", "Job", "Redirect"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Redirect:
    """Fresh results of one step that go to planned memory and their planned tensors.

    How they get there: the ``out=`` overload (``use_out``), an exact ``rewrite``, or
    else computed outside the arena and copied in, holding ``scratch`` bytes meanwhile.
    """

    targets: tuple[Target, ...]
    buffers: tuple[torch.Tensor, ...]
    use_out: bool
    rewrite: Rewrite | None = None
    scratch: int = 0


@dataclass
class Job:
    """The ATen call an op is about to make, and where its fresh results go."""

    step: Step
    redirect: Redirect
    consumed: bool = False
    transient_bytes: int = 0


class ExecMode(TorchDispatchMode):
    """Meters every ATen call; gives factory calls the op's device; redirects the op's call into planned memory.

    ``retarget``: factory calls (a traced ``device=`` argument names the device the
    graph was captured on) go to ``physical``, the op's torch device.  Off during a
    copy, whose executor code names its devices itself: a view of the source's bytes
    must stay on the source's device (``set_`` refuses a storage on another one).
    """

    def __init__(self, meter: StorageMeter) -> None:
        super().__init__()
        self.meter = meter
        self.physical: torch.device = torch.device("cpu")
        self.retarget = True
        self.job: Job | None = None
        #: The op running now ("" during a copy) and, in a warm-up step on a GPU, the probe of its kernels' workspaces.
        self.op = ""
        self.probe: WorkspaceProbe | None = None

    def _kernel(self, kernel: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``kernel(*args, **kwargs)``, the running op's kernel call; probed for its workspace when a probe is set
        on a GPU (no closure is made otherwise: this is the executor's hot path)."""
        if self.probe is None or not self.op or self.physical.type != "cuda":
            return kernel(*args, **kwargs)
        return self.probe.call(self.op, self.physical, lambda: kernel(*args, **kwargs))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if self.retarget and device is not None and torch.device(device) != self.physical:
            kwargs["device"] = self.physical
        job = self.job
        if job is None or job.consumed or func is not job.step.func:
            out = self._kernel(func, *args, **kwargs)
            if self.meter.register_results(out, self.physical):
                self.meter.sample()  # live bytes only grow when something new appears
            return out
        job.consumed = True
        redirect = job.redirect
        variant = job.step.out
        if redirect.use_out and variant is not None:
            out = self._kernel(variant.call, args, kwargs, redirect.buffers)
            self.meter.sample()
            return out
        if redirect.rewrite is not None:
            rewrite = redirect.rewrite
            out = self._kernel(rewrite, args, kwargs, redirect.buffers[0])
            if out is not None:
                self.meter.sample()
                return out
        out = self._kernel(func, *args, **kwargs)
        leaves = flatten(out)
        # Only results on the buffer's device move in; a host-resident result stays where the kernel put it.
        moves = [(t, b) for t, b in zip(redirect.targets, redirect.buffers) if leaves[t.leaf].device == b.device]
        self.meter.register_results([leaves[t.leaf] for t, _ in moves], self.physical, transient=True)
        self.meter.register_results(out, self.physical)
        self.meter.sample()
        for target, buffer in moves:
            buffer.copy_(leaves[target.leaf])
            job.transient_bytes += leaves[target.leaf].untyped_storage().nbytes()
            leaves[target.leaf] = buffer
        return unflatten(out, leaves)

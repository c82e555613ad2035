"""Run a compiled plan op by op on real tensors: planned devices, copies, frees, optional arenas.

An ``Executor`` owns the run's state: the program's sources (parameters, buffers,
inputs, optimizer state, constants), each cloned onto the home device of its
storage with a storage of exactly its size; the parameter gradients, resident
across steps like ``.grad``; and in arena mode one ``uint8`` arena per device, or,
when the plan cuts its arenas into blocks (``plan.blocks``), the blocks allocated
now (``block_memory.BlockMemory``): each from its first step through its last.
``run_step`` executes the schedule once:

* each op runs through ``CapturedProgram.run_node`` against an env of fx values; an
  op on device ``d`` sees ``d``'s *overlay* first, where copies put their values
  under the fx names of the tensor they copied, so consumers on ``d`` read the copy;
* a copy fills exactly the plan's ``copy.bytes`` on the destination (at its planned
  arena offset in arena mode): the copied tensor's root storage, with the tensor laid
  over it as the source lies over its root, or, for a slice of a larger storage, only
  the slice's elements, packed (``Tensor.copy_``, non-blocking between GPUs);
* after step ``k`` every storage whose last touching step is ``k`` is released: the
  fx values of all its aliases leave the env, so the memory really goes;
* in arena mode a dispatch mode (``redirect.ExecMode``) redirects the op's ATen call
  to its ``out=`` overload (or an exact rewrite onto one) writing into the planned
  arena views, or else
  computes the result and copies it in, counting the result as transient; factory
  ops get the op's device.  A result its plan adopts (``plan.Block.adopts``) is not
  redirected: the kernel's own allocation is its block.

Transients are real memory: a CUDA allocator holds them next to the arena, so the
meter counts them with everything else alive at that moment.  Which steps compute
outside the arena, and how big their results are, is known before anything runs
(the traced values' storages, ``scratch.landing``), so ``scratch_bytes`` says it per
device; a plan made with ``scratch.plan_with_scratch`` already counts it in its peak.

Every storage created is registered with a ``StorageMeter`` under the planned device
of the op that made it, so per-device peaks are measured, not assumed.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from mpplan.capture.torch_capture import SourceRole
from mpplan.errors import PlanError
from mpplan.runtime.arena import Layout, arena_view, layout_of, packed_stride, region_bytes
from mpplan.runtime.block_memory import BlockMemory
from mpplan.runtime.devices import DeviceMap
from mpplan.runtime.redirect import ExecMode, Job, Redirect
from mpplan.runtime.schedule import Schedule, Step
from mpplan.runtime.scratch import Landing, landing
from mpplan.runtime.tracking import StorageMeter
from mpplan.runtime.workspace import WorkspaceProbe

__all__ = ["CUDA_ALIGNMENT", "Executor", "StepValues", "Trace"]

_MISSING = object()

#: Byte alignment every arena offset on a GPU must have.  ``cudaMalloc`` and the caching
#: allocator hand out 512-byte-aligned blocks and some CUDA kernels rely on 16-byte-aligned
#: pointers (memory-efficient attention refuses others; vectorised loads fault on them).
CUDA_ALIGNMENT = 16


@dataclass(frozen=True)
class StepValues:
    """What one step produced: the program's outputs (the loss in train mode) and gradients by parameter.

    These are the executor's own tensors: in arena mode outputs are views of the
    arena and gradients the resident gradient buffers, valid until the next step;
    holding them across a step keeps memory alive that the next step's measurement
    will count.
    """

    outputs: tuple[Any, ...]
    grads: Mapping[str, torch.Tensor]
    copied_bytes: int
    transient_bytes: int


@dataclass(frozen=True)
class Trace:
    """One executed step, for lock-step comparison: input values before it ran, result values after."""

    step: Step
    reads: Mapping[str, torch.Tensor]
    writes: Mapping[str, torch.Tensor]


class Executor:
    """Execute ``schedule`` on ``device_map``'s devices, from ``model``'s state and ``example_inputs``."""

    def __init__(
        self,
        schedule: Schedule,
        model: torch.nn.Module,
        example_inputs: Any,
        device_map: DeviceMap,
        *,
        arena: bool,
        meter: StorageMeter | None = None,
    ) -> None:
        self.schedule = schedule
        self.program = schedule.program
        self.device_map = device_map
        self.arena = arena
        self.meter = meter or StorageMeter()
        self._mode = ExecMode(self.meter)
        self._sources = self._bind_sources(model, example_inputs)
        plan = schedule.plan
        self._blocks = BlockMemory(schedule) if arena and plan.blocks else None
        self._arenas = self._make_arenas() if arena and self._blocks is None else {}
        self._static = self._make_static_buffers() if arena else {}
        self._landings = self._target_landings() if arena else {}
        self.scratch_bytes: dict[str, int] = {d: 0 for d in schedule.devices}
        for index, how in self._landings.items():
            device = schedule.steps[index].device
            self.scratch_bytes[device] = max(self.scratch_bytes[device], how.scratch)
        self._carry = self._initial_grads()
        self._grad_nodes = dict(zip(self.program.grads, self.program.output_nodes[1:]))

    @property
    def probe(self) -> WorkspaceProbe | None:
        """The probe of the kernels' workspaces while steps run (set it for a warm-up step only)."""
        return self._mode.probe

    @probe.setter
    def probe(self, probe: WorkspaceProbe | None) -> None:
        self._mode.probe = probe

    @property
    def op_scratch(self) -> dict[str, int]:
        """Op -> bytes its results hold outside planned memory while computed and copied in (arena mode)."""
        return {self.schedule.steps[i].op: how.scratch for i, how in self._landings.items() if how.scratch}

    # ---- state ----------------------------------------------------------------------------------

    def state(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers by FQN, as they are now (updated in place by optimizer steps)."""
        return {
            src.key: self._sources[src.node]
            for src in self.program.sources
            if src.role in (SourceRole.PARAM, SourceRole.BUFFER) and src.node in self._sources
        }

    def _bind_sources(self, model: torch.nn.Module, example_inputs: Any) -> dict[str, Any]:
        """Every touched source, cloned onto its home device with a storage of exactly its size."""
        bound = self.program.bind(model, example_inputs)
        sources: dict[str, Any] = {}
        for node, value in bound.items():
            home = self.schedule.source_homes.get(node)
            if home is None:
                continue  # no op touches it: the plan does not count it, so it is not held
            if isinstance(value, torch.Tensor):
                with torch.no_grad():
                    value = _exact_clone(value, self.device_map.torch_device(home))
                self.meter.register(value, home, pinned=True)
            sources[node] = value
        return sources

    def _make_arenas(self) -> dict[str, torch.Tensor]:
        self._check_cuda_alignment()
        arenas = {}
        for d in self.schedule.plan.devices:
            arenas[d.name] = torch.empty(d.arena_bytes, dtype=torch.uint8, device=self.device_map.torch_device(d.name))
            self.meter.register(arenas[d.name], d.name, pinned=True)
        return arenas

    def _check_cuda_alignment(self) -> None:
        """Every buffer of an arena on a GPU starts at a multiple of ``CUDA_ALIGNMENT`` bytes."""
        for name, buffer in self.schedule.plan.buffers.items():
            if buffer.device not in self.device_map.physical or self.device_map.is_virtual(buffer.device):
                continue
            if buffer.offset % CUDA_ALIGNMENT:
                raise PlanError(
                    f"plan: buffer of {name!r} on {buffer.device} starts at offset {buffer.offset}, not a multiple "
                    f"of {CUDA_ALIGNMENT} bytes as CUDA kernels need; plan with planner.alignment >= {CUDA_ALIGNMENT} "
                    "(default 64) or run without arena"
                )

    def _make_static_buffers(self) -> dict[str, torch.Tensor]:
        """One resident buffer per parameter gradient: the arena executor's ``.grad``."""
        buffers = {}
        for root, (device, layout, _nodes) in self.schedule.static_roots.items():
            buffers[root] = _zeros_like_layout(layout, self.device_map.torch_device(device))
            self.meter.register(buffers[root], device, pinned=True)
        return buffers

    def _initial_grads(self) -> dict[str, torch.Tensor]:
        """Gradients are resident for the whole step (static), so they exist before the first step too."""
        carry = {}
        for root, (device, layout, nodes) in self.schedule.static_roots.items():
            if self.arena:
                value = self._static[root]
            else:
                value = _zeros_like_layout(layout, self.device_map.torch_device(device))
            self.meter.register(value, device)
            carry[nodes[0]] = value
        return carry

    def _target_landings(self) -> dict[int, Landing]:
        """For every step with fresh outputs to place, how they land (``scratch.landing``), checked against the plan."""
        plan = self.schedule.plan
        adopted = self._blocks.adopted if self._blocks is not None else frozenset()
        per_step: dict[int, Landing] = {}
        for step in self.schedule.steps:
            how = landing(self.program, step, self.device_map.torch_device(step.device).type, adopted)
            if how is None:
                continue
            for target in how.targets:
                if target.static:
                    continue
                buffer = plan.buffers.get(target.tensor)
                if buffer is None:
                    raise PlanError(f"plan: dynamic tensor {target.tensor!r} (op {step.op!r}) has no buffer")
                if buffer.device != step.device:
                    raise PlanError(
                        f"plan: buffer of {target.tensor!r} is on {buffer.device}, its producer {step.op!r} "
                        f"on {step.device}"
                    )
                if buffer.bytes < target.layout.span_bytes:
                    raise PlanError(
                        f"plan: buffer of {target.tensor!r} has {buffer.bytes} bytes, the tensor spans "
                        f"{target.layout.span_bytes}"
                    )
            per_step[step.index] = how
        return per_step

    def _redirect(self, step: Step, how: Landing) -> Redirect:
        """``how``'s targets with the planned tensors they go to, views of the memory allocated now."""
        views = []
        for target in how.targets:
            if target.static:
                views.append(self._static[target.tensor])
                continue
            buffer = self.schedule.plan.buffers[target.tensor]
            if target.layout.span_bytes == 0:  # no bytes, so in no block: any storage of its device holds it
                base, offset = torch.empty(0, dtype=torch.uint8, device=self.device_map.torch_device(step.device)), 0
            else:
                base, offset = self._memory(step.device, buffer.offset)
            views.append(arena_view(base, offset, target.layout, where=f"buffer {target.tensor!r}"))
        return Redirect(how.targets, tuple(views), how.use_out, how.rewrite, how.scratch)

    def _memory(self, device: str, offset: int) -> tuple[torch.Tensor, int]:
        """The allocation holding arena offset ``offset`` of ``device`` now, and the offset within it."""
        if self._blocks is None:
            return self._arenas[device], offset
        return self._blocks.holding(device, offset)

    # ---- one step -------------------------------------------------------------------------------

    def run_step(self) -> StepValues:
        """Run the whole schedule once."""
        gen = self.iter_step(observe=False)
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value

    def iter_step(self, *, observe: bool) -> Generator[Trace, None, StepValues]:
        """Run the schedule once, yielding a ``Trace`` after each step when ``observe`` (for lock-step checks).

        The dispatch mode is entered per op, never across a ``yield``, so two
        executors can be interleaved.
        """
        env: dict[str, Any] = dict(self._sources)
        env.update(self._carry)
        self._carry = {}
        overlays: dict[str, dict[str, Any]] = {d: {} for d in self.schedule.devices}
        copied = transient = 0
        for step in self.schedule.steps:
            for name in step.drop_before:
                env.pop(name, None)
            if self._blocks is not None:
                self._blocks.open(step, self.device_map, self.meter)
            view = _DeviceEnv(env, overlays[step.device])
            reads = _clone_all(view, step.inputs) if observe else {}
            self.meter.device = step.device
            self._mode.physical = self.device_map.torch_device(step.device)
            # A copy reads its source on the source's device: only an op's own factory calls are retargeted.
            self._mode.retarget = step.copy is None
            self._mode.op = step.op if step.copy is None else ""
            # The planned views are made outside the dispatch mode: they hold no new memory to meter.
            job = self._job(step) if step.copy is None else None
            with torch.no_grad(), self._mode:
                if step.copy is not None:
                    copied += self._copy(step, env, overlays[step.device])
                else:
                    transient += self._run_op(step, view, job)
            for name in step.containers:
                if isinstance(env.get(name), (list, tuple)):
                    del env[name]
            if observe:
                yield Trace(step, reads, {n: view[n] for n in step.results if n in view} if step.copy is None
                            else {n: overlays[step.device][n] for n in step.copy.nodes[:1]})
            for release in step.releases:
                for name in release.env_nodes:
                    env.pop(name, None)
                if release.overlay_device is not None:
                    overlay = overlays[release.overlay_device]
                    for name in release.overlay_nodes:
                        overlay.pop(name, None)
            if self._blocks is not None:
                self._blocks.close(step)
        self.meter.sample()
        for _device, _layout, nodes in self.schedule.static_roots.values():
            for name in nodes:
                if name in env:
                    self._carry[name] = env[name]
        outputs = tuple(env.get(n) if n is not None else None for n in self.program.output_nodes)
        if self.program.mode == "train":
            outputs = outputs[:1]
        grads = {fqn: env[node] for fqn, node in self._grad_nodes.items() if node is not None and node in env}
        return StepValues(outputs, MappingProxyType(grads), copied, transient)

    def _job(self, step: Step) -> Job | None:
        """Where ``step``'s fresh results go in arena mode (``None``: where the kernel puts them)."""
        how = self._landings.get(step.index) if self.arena else None
        return None if how is None else Job(step, self._redirect(step, how))

    def _run_op(self, step: Step, view: _DeviceEnv, job: Job | None) -> int:
        self._mode.job = job
        try:
            assert step.node is not None
            self.program.run_node(step.node, view, step.keys)
        finally:
            self._mode.job = None
        if job is not None and not job.consumed:
            raise RuntimeError(
                f"op {step.op!r}: its ATen call {step.func} was not seen by the executor's dispatch mode "
                "(a composite op?); its outputs cannot be placed in the arena"
            )
        return job.transient_bytes if job is not None else 0

    def _copy(self, step: Step, env: dict[str, Any], overlay: dict[str, Any]) -> int:
        """Put the copied tensor on the destination in the plan's ``copy.bytes``.

        Those bytes hold either the tensor's root storage, the tensor laid over them as
        the source lies over its root (a whole storage, or a view reaching over most
        of it), or only the tensor's own elements, packed (a slice of a larger storage:
        the copy pass moves just its elements).
        """
        c = step.copy
        assert c is not None
        source = _first_present(env, c.nodes, f"copy {c.name!r}: tensor {c.tensor!r}")
        root = source if c.root == c.tensor else _first_present(
            env, c.root_nodes, f"copy {c.name!r}: storage root {c.root!r}"
        )
        itemsize = source.element_size()
        rel = source.storage_offset() * itemsize - root.storage_offset() * root.element_size()
        span = layout_of(source).span_bytes - source.storage_offset() * itemsize
        whole_root = 0 <= rel and rel + span <= c.nbytes and rel % itemsize == 0
        if not whole_root and c.nbytes < source.numel() * itemsize:
            raise PlanError(
                f"copy {c.name!r}: {c.nbytes} bytes hold neither tensor {c.tensor!r} within its root {c.root!r} "
                f"nor its {source.numel() * itemsize} bytes of elements"
            )
        device = self.device_map.torch_device(step.device)
        region = self._copy_region(step, c.name, c.nbytes, itemsize, device)
        both_cuda = device.type == "cuda" and source.device.type == "cuda"
        value = torch.empty((0,), dtype=source.dtype, device=device)
        if whole_root:
            region.copy_(region_bytes(root, c.nbytes), non_blocking=both_cuda)
            offset = (region.storage_offset() + rel) // itemsize
            value.set_(region.untyped_storage(), offset, source.shape, source.stride())
        else:
            offset = region.storage_offset() // itemsize
            value.set_(region.untyped_storage(), offset, source.shape, packed_stride(source))
            value.copy_(source, non_blocking=both_cuda)
        for name in c.nodes:
            overlay[name] = value
        return c.nbytes

    def _copy_region(self, step: Step, name: str, nbytes: int, itemsize: int, device: torch.device) -> torch.Tensor:
        """The ``nbytes`` a copy lands in: its planned arena slot, or a fresh storage."""
        if not self.arena:
            return torch.empty((nbytes,), dtype=torch.uint8, device=device)
        buffer = self.schedule.plan.buffers.get(name)
        if buffer is None:
            raise PlanError(f"plan: copy {name!r} has no buffer")
        if buffer.offset % itemsize:
            raise PlanError(f"copy {name!r}: offset {buffer.offset} is not a multiple of the element size {itemsize}")
        base, offset = self._memory(step.device, buffer.offset)
        return arena_view(base, offset, Layout((nbytes,), (1,), 0, torch.uint8), where=f"copy {name!r}")


class _DeviceEnv(MutableMapping):
    """The env as an op on one device sees it: that device's overlay (copies) first, then the shared env."""

    def __init__(self, env: dict[str, Any], overlay: dict[str, Any]) -> None:
        self.env = env
        self.overlay = overlay

    def __getitem__(self, key: str) -> Any:
        value = self.overlay.get(key, _MISSING)
        return self.env[key] if value is _MISSING else value

    def __setitem__(self, key: str, value: Any) -> None:
        self.env[key] = value

    def __delitem__(self, key: str) -> None:
        del self.env[key]

    def __contains__(self, key: object) -> bool:
        return key in self.overlay or key in self.env

    def __iter__(self) -> Iterator[str]:
        return iter(self.env)

    def __len__(self) -> int:
        return len(self.env)


def _first_present(env: Mapping[str, Any], nodes: Any, what: str) -> torch.Tensor:
    for name in nodes:
        value = env.get(name)
        if isinstance(value, torch.Tensor):
            return value
    raise PlanError(f"{what} is not live when the plan needs it")


def _clone_all(view: _DeviceEnv, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    out = {}
    for name in names:
        value = view.get(name)
        if isinstance(value, torch.Tensor):
            out[name] = value.detach().clone()
    return out


def _exact_clone(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy of ``value`` on ``device`` whose storage holds exactly its elements, strides kept when dense."""
    layout = layout_of(value)
    dense = layout.storage_offset == 0 and layout.span_bytes == value.numel() * value.element_size()
    out = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device) if dense else \
        torch.empty(value.shape, dtype=value.dtype, device=device)
    out.copy_(value.detach())
    return out


def _zeros_like_layout(layout: Layout, device: torch.device) -> torch.Tensor:
    """Zeros laid out as ``layout`` in a storage of exactly its span."""
    storage = torch.zeros((max(layout.span_bytes, 0),), dtype=torch.uint8, device=device)
    return arena_view(storage, 0, layout, where="gradient buffer")

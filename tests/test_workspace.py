"""Kernel workspaces: the probe that measures them, and the prediction that holds them at their op's step.

On a GPU the probe reads the CUDA allocator (``tests/test_runtime.py``'s ``-m cuda`` tests hold the
arena-mode prediction, workspaces included, to the allocator within 2%).  Here an allocator is
simulated: kernels that take memory and give it back, and results that stay.
"""

from __future__ import annotations

import torch
from conftest import chain, device

from mpplan.plan import Block
from mpplan import sim
from mpplan.capture import synthetic
from mpplan.planner import PlannerSettings, placed_graph, plan
from mpplan.runtime.allocation import allocated, cuda_block_bytes
from mpplan.runtime.redirect import ExecMode
from mpplan.runtime.scratch import held_by_run, held_without_arena, with_blocks, with_scratch
from mpplan.runtime.tracking import StorageMeter
from mpplan.runtime.workspace import WorkspaceProbe
from mpplan.verify import verify


class FakeAllocator:
    """Bytes allocated now and the peak since the last reset, per device, as the CUDA allocator keeps them."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def take(self, nbytes: int) -> None:
        self.now += nbytes
        self.peak = max(self.peak, self.now)

    def reading(self):
        return (lambda _device: (self.now, self.peak), lambda _device: setattr(self, "peak", self.now))


def test_the_dispatch_mode_probes_an_ops_kernel_only_on_a_gpu_and_passes_every_argument_through() -> None:
    allocator = FakeAllocator()
    mode = ExecMode(StorageMeter())
    mode.probe = WorkspaceProbe(allocator.reading())
    mode.op = "conv_bwd"

    def kernel(take: int, *, kernel: int) -> tuple[int, int]:  # ``kernel=`` as a keyword: no clash with the mode's
        allocator.take(take)
        allocator.take(-take)
        return take, kernel

    assert mode._kernel(kernel, 300, kernel=7) == (300, 7)  # on the CPU: called, not probed
    assert mode.probe.found == {}
    mode.physical = torch.device("cuda", 0)  # a torch.device needs no GPU to exist
    assert mode._kernel(kernel, 300, kernel=7) == (300, 7)
    assert mode.probe.found == {"conv_bwd": 300}
    mode.op = ""  # a copy between ops is no op's kernel
    assert mode._kernel(kernel, 500, kernel=7) == (500, 7)
    assert mode.probe.found == {"conv_bwd": 300}


def test_the_probe_counts_what_a_kernel_frees_before_it_returns_and_not_its_results() -> None:
    allocator = FakeAllocator()
    allocator.take(1000)  # what is held before: not the kernel's
    probe = WorkspaceProbe(allocator.reading())
    gpu = torch.device("cuda", 0)

    def kernel(workspace: int, result: int) -> str:
        allocator.take(workspace)
        allocator.take(result)
        allocator.take(-workspace)
        return "done"

    assert probe.call("conv_bwd", gpu, lambda: kernel(300, 50)) == "done"
    assert probe.call("conv_bwd", gpu, lambda: kernel(200, 0)) == "done"  # the largest call is kept
    probe.call("relu", gpu, lambda: kernel(0, 80))
    probe.call("free", gpu, lambda: allocator.take(-500))  # a call that frees takes no workspace
    assert probe.found == {"conv_bwd": 300}


def test_a_workspace_is_held_at_its_ops_step_beside_what_lives_there() -> None:
    """Not "peak + largest workspace": a workspace at a quiet step may not raise the peak at all."""
    graph = chain(4, nbytes=64)
    base = plan(graph, [device()], PlannerSettings(alignment=1))
    ops = base.schedule
    quiet, busy = ops[0], ops[2]
    one_block = held_by_run(base, {}, {quiet: 10})
    assert one_block.devices[0].peak_bytes == base.devices[0].peak_bytes + 10  # one arena is held all step
    d = base.devices[0]
    # Blocks: a 64-byte block live in steps 0..1 and a 128-byte one in 1..3, so step 2 holds 128 and step 1 192.
    blocked = with_blocks(base, (Block(d.name, 0, 64, 0, 1), Block(d.name, 64, 128, 1, 3)), {})
    peak = blocked.devices[0].peak_bytes
    assert held_by_run(blocked, {}, {busy: 64}).devices[0].peak_bytes == peak  # 128 + 64 at step 2: not above
    assert held_by_run(blocked, {}, {busy: 65}).devices[0].peak_bytes == peak + 1
    assert held_by_run(blocked, {}, {ops[1]: 1}).devices[0].peak_bytes == peak + 1  # the busiest step
    # An op's copied-in scratch and its workspace are held at once; the plan's own scratch is not counted twice.
    scratched = with_scratch(base, {busy: 30})
    held = held_by_run(scratched, {busy: 30}, {busy: 20})
    assert held.devices[0].peak_bytes == base.devices[0].peak_bytes + 50
    assert held_by_run(scratched, {busy: 30}, {}).devices[0] == scratched.devices[0]
    verify(graph, held)


def test_without_an_arena_a_workspace_is_held_beside_the_storages_live_at_its_ops_step() -> None:
    """Each storage its own allocation: static + LOAD with no workspace, on every device of a plan with copies."""
    graph = synthetic.transformer(2, batch=1, seq=8, hidden=16, heads=2, vocab=32, train=True)
    single = plan(graph, [device()], PlannerSettings(alignment=1))
    capacity = int(single.max_peak_bytes * 0.7)  # too small for one device: the plan splits and copies
    split = plan(graph, [device(capacity, "gpu0"), device(capacity, "gpu1")], PlannerSettings(alignment=1))
    verify(graph, split)
    placed = placed_graph(graph, split)
    assert placed.copies
    assert held_without_arena(placed, split, {}) == {d.name: d.lower_bound_bytes for d in split.devices}
    # One device: the planned graph's step profile (gradients dynamic), by the simulator, with each op's
    # workspace at its own step.
    listed = placed_graph(graph, single)
    profile = sim.order_profile(listed.graph, range(len(listed.graph.ops)))
    peak = single.devices[0].static_bytes + max(profile)
    assert peak == single.devices[0].lower_bound_bytes
    quiet = min(range(len(profile)), key=profile.__getitem__)
    room = max(profile) - profile[quiet]
    ops = single.schedule
    assert held_without_arena(listed, single, {ops[quiet]: room}) == {"gpu0": peak}  # fills a quiet step: no more
    assert held_without_arena(listed, single, {ops[quiet]: room + 5, ops[-1]: 1}) == {"gpu0": peak + 5}


def test_the_allocators_prediction_rounds_each_allocation_up_to_512_bytes() -> None:
    """Static storages, arena blocks and (without an arena) dynamic storages are allocations of their own: the
    CUDA allocator counts each rounded up to 512 bytes, so a plan's exact bytes read low on small tensors."""
    graph = chain(4, nbytes=600)  # a 600-byte input, four 16-byte params, four 600-byte activations
    planned = plan(graph, [device()], PlannerSettings(alignment=1))
    verify(graph, planned)
    placed = placed_graph(graph, planned)
    counted = allocated(planned, placed)
    exact, rounded = planned.devices[0], counted.devices[0]
    assert (exact.static_bytes, rounded.static_bytes) == (600 + 4 * 16, 1024 + 4 * 512)
    assert rounded.arena_bytes == cuda_block_bytes(exact.arena_bytes) and rounded.arena_bytes % 512 == 0
    # Without an arena: two 600-byte activations live at once at the busiest step, each a 1024-byte block.
    assert held_without_arena(placed, planned, {}) == {"gpu0": 664 + 1200}
    assert held_without_arena(placed, counted, {}, cuda_block_bytes) == {"gpu0": 3072 + 2048}
    # In blocks: each block rounded on its own, beside the rounded static.
    d = exact.name
    blocked = with_blocks(planned, (Block(d, 0, 600, 0, 1), Block(d, 600, 600, 1, 3)), {})
    assert blocked.devices[0].peak_bytes == 664 + 1200
    assert held_by_run(allocated(blocked, placed), {}, {}).devices[0].peak_bytes == 3072 + 2048

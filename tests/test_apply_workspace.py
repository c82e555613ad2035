"""``apply``'s kernel workspaces: a probed step's ATen calls matched to IR ops, and held at their ops' steps.

On a GPU the probe reads the CUDA allocator (the ``-m cuda`` tests of ``test_apply_remat.py`` and
``test_apply_cuts.py`` probe their first step).  Here the CPU's calls are probed with a simulated
allocator in which chosen overloads take a workspace.
"""

from __future__ import annotations

import copy

import pytest
import torch
from user_loop import captured_gpt, metered_loop

from mpplan import sim, zoo
from mpplan.config import Device
from mpplan.planner import PlannerSettings, plan
from mpplan.runtime import apply, capture_for
from mpplan.runtime.allocation import cuda_block_bytes
from mpplan.runtime.apply_budget import plan_recomputing
from mpplan.runtime.apply_memory import predict_apply
from mpplan.runtime.apply_workspace import op_keys
from mpplan.runtime.workspace import WorkspaceProbe
from mpplan.verify import verify

GPT = {"vocab_size": 64, "max_seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 2}
INPUTS = {"batch": 2, "seq_len": 16, "vocab_size": 64}
#: Forward ops recomputed: a recompute's kernel takes its original's workspace.
RECOMPUTE = ("addmm", "gelu")

pytestmark = pytest.mark.usefixtures("torch_one_thread")


class TakesWorkspace(WorkspaceProbe):
    """A simulated allocator's probe: every call of ``overload`` takes ``nbytes`` of workspace; all calls noted."""

    def __init__(self, overload: str, nbytes: int) -> None:
        super().__init__()
        self.overload, self.nbytes, self.calls = overload, nbytes, set()

    def call(self, op, device, kernel):
        self.calls.add(op)
        if op.startswith(f"{self.overload}("):
            self.found[op] = self.nbytes
        return kernel()


@pytest.fixture(scope="module")
def gpt():
    return captured_gpt(GPT, INPUTS)


def _probed(gpt, probe, also=lambda: None):
    model, inputs, program = gpt
    plan_ops = [op.name for op in program.graph.ops if op.name in RECOMPUTE]
    planned = plan_recomputing(program.graph, [Device("cuda:0", 1 << 30)],
                               PlannerSettings(placement="single", grads="dynamic"), plan_ops, 1 << 30)
    verify(program.graph, planned)
    wrapped = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    with wrapped.probing(probe, device_types=("cpu",)):
        metered_loop(wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3), inputs, steps=1)
        also()
    return wrapped, program


def _unmatched(program, probe) -> list[str]:
    keys = op_keys(program)
    return [op for op, key in keys.items() if program.op_phases[op] != "optimizer" and key not in probe.calls]


def test_every_forward_and_backward_op_is_found_among_the_calls_of_a_probed_step(gpt) -> None:
    """Keys from the traced values equal the eager calls' keys, recomputes included, so no op goes unmatched;
    a workspace of a call like no op's is kept apart, not held."""
    probe = TakesWorkspace("aten.mm.default", 1000)
    wrapped, program = _probed(gpt, probe)
    assert not _unmatched(program, probe)
    mms = {op.name for op in program.graph.ops if op.type == "aten.mm.default"}
    assert mms and wrapped.workspaces == dict.fromkeys(mms, 1000)
    assert wrapped.unmatched_workspaces == {}
    stranger = _probed(gpt, TakesWorkspace("aten.cumsum.default", 64), also=lambda: torch.ones(3).cumsum(0))[0]
    assert stranger.workspaces == {} and list(stranger.unmatched_workspaces.values()) == [64]


def test_a_batch_norm_traced_under_another_overload_is_matched_to_the_call_eager_makes() -> None:
    """The capture traces ``native_batch_norm`` as ``_native_batch_norm_legit`` (a schema that declares its
    writes); eager calls the former, so the key is made from it (``CapturedProgram.eager_call``)."""
    torch.manual_seed(0)
    model = zoo.build("resnet", blocks=(1, 1), width=8)
    inputs = zoo.example_inputs("resnet", batch=2, image_size=16)
    program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer="adam", loss_fn=None)
    norms = [op.name for op in program.graph.ops if "batch_norm" in op.type and program.op_phases[op.name] == "forward"]
    assert norms and all(program.graph.op(op).type.startswith("aten._native_batch_norm_legit") for op in norms)
    planned = plan(program.graph, [Device("cuda:0", 1 << 30)], PlannerSettings(placement="single", grads="dynamic"))
    wrapped = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    probe = TakesWorkspace("aten.native_batch_norm.default", 256)
    with wrapped.probing(probe, device_types=("cpu",)):
        metered_loop(wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3), inputs, steps=1)
    assert not _unmatched(program, probe)
    assert wrapped.workspaces == dict.fromkeys(norms, 256)


def test_the_prediction_holds_each_workspace_at_its_ops_step_and_its_recomputes(gpt) -> None:
    probe = TakesWorkspace("aten.addmm.default", 300_000)  # larger than any step's headroom on this model
    wrapped, program = _probed(gpt, probe)
    assert "addmm" in wrapped.workspaces
    bare = predict_apply(program, wrapped.recompute_ops)
    held = wrapped.prediction()
    graph = held.graph
    profile = sim.order_profile(graph, range(len(graph.ops)))
    taken = [wrapped.workspaces.get(op.name, wrapped.workspaces.get(op.recompute_of or "", 0)) for op in graph.ops]
    assert any(op.recompute_of == "addmm" and t for op, t in zip(graph.ops, taken))
    assert held.peak_bytes == held.static_bytes + max(p + t for p, t in zip(profile, taken))
    assert (held.load_bytes, held.static_bytes) == (bare.load_bytes, bare.static_bytes)
    assert held.workspace_bytes == held.peak_bytes - bare.peak_bytes > 0


def test_on_a_gpu_each_storage_is_counted_as_the_allocator_rounds_it(gpt) -> None:
    _, _, program = gpt
    exact = predict_apply(program)
    rounded = predict_apply(program, allocation=cuda_block_bytes)
    topo = exact.graph.topology
    static = [s for s in topo.storages if topo.is_static[s]]
    assert rounded.static_bytes == sum(cuda_block_bytes(topo.nbytes[s]) for s in static) > exact.static_bytes
    assert rounded.load_bytes >= exact.load_bytes and rounded.peak_bytes % 512 == 0

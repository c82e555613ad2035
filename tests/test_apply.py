"""``apply``: the plan's placement inside an ordinary training loop.

On virtual devices every planned device is CPU memory, so these tests check that
the wrapped module trains exactly like the original (same losses, bit for bit, with
the original parameters) and that modules and parameters are assigned the devices
the plan gives their ops.  The CUDA tests check real placement and are skipped here.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mpplan import zoo
from mpplan.capture.torch_capture import capture_program, default_loss
from mpplan.config import Device
from mpplan.errors import PlanError
from mpplan.planner import PlannerSettings, plan
from mpplan.runtime import apply, cuda_available
from mpplan.runtime.trace import capture_for

GPT = {"vocab_size": 64, "max_seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 2}
INPUTS = {"batch": 2, "seq_len": 16, "vocab_size": 64}


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def two_devices():
    """The tiny GPT and a two-device pipeline plan for it (each test gets a fresh copy of the model)."""
    return _model_and_plan(2)


def _model_and_plan(ndev: int, device: str = "cpu"):
    torch.manual_seed(0)
    model = zoo.build("gpt", **GPT)
    inputs = zoo.example_inputs("gpt", **INPUTS)
    program = capture_for(model, inputs, torch.device(device), mode="train", optimizer="adam", loss_fn=None)
    devices = [Device(f"cuda:{i}", 1 << 30) for i in range(ndev)]
    return model, inputs, plan(program.graph, devices, PlannerSettings(placement="pipeline" if ndev > 1 else "single"))


def _train(module: torch.nn.Module, parameters, inputs, steps: int) -> list[float]:
    opt = torch.optim.Adam(parameters, lr=1e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = default_loss(module(*inputs))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_apply_trains_like_eager(two_devices) -> None:
    model, inputs, planned = two_devices
    model = copy.deepcopy(model)
    reference = copy.deepcopy(model)
    originals = list(model.parameters())
    wrapped = apply(model, planned, inputs, optimizer="adam", devices="virtual")
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in originals]
    got = _train(wrapped, wrapped.parameters(), inputs, steps=3)
    want = _train(reference, reference.parameters(), inputs, steps=3)
    assert got == want  # one device kind, same kernels: bit for bit
    assert got[-1] < got[0]
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name


def test_apply_follows_the_plans_placement(two_devices) -> None:
    model, inputs, planned = two_devices
    model = copy.deepcopy(model)
    wrapped = apply(model, planned, inputs, optimizer="adam", devices="virtual")
    used = set(wrapped.planned.values())
    assert used == {"cuda:0", "cuda:1"}
    assert wrapped.planned["tok_emb"] == "cuda:0"
    assert wrapped.planned["ln_f"] == "cuda:1"
    # Each module sits where the plan runs its first computing forward op.
    program = capture_program(model, inputs, mode="train", optimizer="adam")
    first = {}
    for name in planned.schedule:
        if name in program.op_nodes and program.op_phases[name] == "forward":
            op = program.graph.op(name)
            views = all(program.graph.tensor(t).alias_of is not None for t in op.outputs) and op.outputs
            if not views:
                first.setdefault(op.module or "", planned.placement[name])
    for module, device in first.items():
        assert wrapped.planned[module] == device, module
    assert set(wrapped.param_devices.values()) == {"cpu"}
    wrapped.remove()
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_apply_rejects_a_plan_for_another_graph() -> None:
    model, inputs, planned = _model_and_plan(1)
    with pytest.raises(PlanError, match="graph hash"):
        apply(model, planned, inputs, optimizer="sgd", devices="virtual")


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_apply_on_gpu_trains_with_parameters_where_planned() -> None:
    model, inputs, planned = _model_and_plan(2, device="cuda:0")
    reference = copy.deepcopy(model).to("cuda:0")
    count = torch.cuda.device_count()
    mapping = {"cuda:0": "cuda:0", "cuda:1": "cuda:1" if count > 1 else "cuda:0"}
    wrapped = apply(model, planned, inputs, optimizer="adam", devices=mapping)
    for name, p in model.named_parameters():
        assert str(p.device) == wrapped.param_devices[name]
    got = _train(wrapped, wrapped.parameters(), inputs, steps=3)
    want = _train(reference, reference.parameters(), [x.to("cuda:0") for x in inputs], steps=3)
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)

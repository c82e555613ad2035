"""``apply`` with recompute: the plan's recomputes in an ordinary loop, and the memory it predicts.

Each test trains the wrapped model in a plain loop (``zero_grad(set_to_none=True)``,
forward, ``default_loss``, ``backward``, ``torch.optim.Adam.step``) under the storage
meter, and holds it to three things: the numerics are eager's bit for bit (one
device kind, same kernels), the recomputes really happen (the measured peak falls
below eager's by what the plan promised), and the measured peak is within 5% of
``PlannedModule.prediction()``.  Every plan goes through the verifier.
"""

from __future__ import annotations

import copy

import pytest
import torch

from mpplan import zoo
from mpplan.capture.torch_capture import default_loss
from mpplan.config import Device
from mpplan.planner import PlannerSettings, plan
from mpplan.runtime import apply, cuda_available
from mpplan.errors import InfeasibleError
from mpplan.runtime.apply_budget import max_batch, plan_for_apply
from mpplan.runtime.apply_memory import predict_apply
from mpplan.runtime.recompute import RecomputeHooks, RecomputePolicy, module_calls
from mpplan.runtime.devices import warm_up
from mpplan.runtime.trace import capture_for
from mpplan.runtime.tracking import MeteringMode, StorageMeter
from mpplan.verify import verify
from user_loop import CallCounter, captured_gpt, cuda_loop_peak, metered_loop

GPT = {"vocab_size": 64, "max_seq_len": 32, "d_model": 32, "n_heads": 2, "n_layers": 2}
INPUTS = {"batch": 8, "seq_len": 32, "vocab_size": 64}
TOLERANCE = 0.05

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def gpt():
    return captured_gpt(GPT, INPUTS)


def _plan(program, budget, ndev=1):
    devices = [Device(f"cuda:{i}", 1 << 30) for i in range(ndev)]
    settings = PlannerSettings(
        placement="pipeline" if ndev > 1 else "single", remat="budget", remat_budget=budget, grads="dynamic"
    )
    planned = plan(program.graph, devices, settings)
    verify(program.graph, planned)
    return planned


def _loop(module, inputs, steps=3, device="cpu"):
    """Train with Adam as a user would; peak (storage meter), losses, and ATen calls per step after the first."""
    calls = CallCounter()
    peak, losses = metered_loop(module, torch.optim.Adam(module.parameters(), lr=1e-3), inputs, steps, device, calls)
    return peak, losses, calls.calls / (steps - 1)


def _within(measured: int, predicted: int) -> bool:
    return abs(measured - predicted) <= TOLERANCE * predicted


def test_eager_peak_is_predicted(gpt) -> None:
    """No recompute: the eager-memory graph predicts what plain PyTorch holds in the loop."""
    model, inputs, program = gpt
    peak, _, _ = _loop(copy.deepcopy(model), inputs)
    predicted = predict_apply(program).peak_bytes
    assert _within(peak, predicted), (peak, predicted)


@pytest.mark.parametrize("budget", [0.8, 0.65])
def test_apply_recomputes_what_the_plan_says_and_holds_the_predicted_peak(gpt, budget) -> None:
    model, inputs, program = gpt
    planned = _plan(program, budget)
    assert planned.remat, "the budget must make the plan recompute"
    eager_peak, eager_losses, eager_calls = _loop(copy.deepcopy(model), inputs)
    reference = copy.deepcopy(model)
    _loop(reference, inputs)

    user_model = copy.deepcopy(model)
    wrapped = apply(user_model, planned, inputs, optimizer="adam", devices="virtual")
    peak, losses, calls = _loop(wrapped, inputs)

    assert wrapped.hooks is not None and wrapped.hooks.mismatch is None
    assert set(wrapped.recompute_ops) == {r["op"] for r in planned.remat}
    assert wrapped.hooks.recomputed > 0 and calls > eager_calls
    assert losses == eager_losses  # recompute replays the same kernels: bit for bit
    for (name, p), q in zip(user_model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    predicted = wrapped.prediction().peak_bytes
    assert _within(peak, predicted), (peak, predicted)
    # The saving is the one predicted over eager's own predicted peak.
    saving = predict_apply(program).peak_bytes - predicted
    assert saving > 0 and abs((eager_peak - peak) - saving) <= TOLERANCE * predicted, (eager_peak - peak, saving)
    assert predicted == pytest.approx(planned.max_peak_bytes, rel=TOLERANCE)


def test_a_multi_device_plan_with_recompute_applies(gpt) -> None:
    """Placement and recompute together: two virtual devices, both honoured, memory as predicted (summed)."""
    model, inputs, program = gpt
    planned = _plan(program, 0.5, ndev=2)  # the budget bounds each device: at 0.6 two devices need no recompute
    assert planned.remat and len(set(planned.placement.values())) == 2
    reference = copy.deepcopy(model)
    eager_peak, eager_losses, _ = _loop(reference, inputs)
    user_model = copy.deepcopy(model)
    wrapped = apply(user_model, planned, inputs, optimizer="adam", devices="virtual")
    assert set(wrapped.planned.values()) == {"cuda:0", "cuda:1"}
    peak, losses, _ = _loop(wrapped, inputs)
    assert wrapped.hooks is not None and wrapped.hooks.mismatch is None and wrapped.hooks.recomputed > 0
    assert losses == eager_losses
    for (name, p), q in zip(user_model.named_parameters(), reference.parameters()):
        assert torch.equal(p, q), name
    assert peak < eager_peak
    assert _within(peak, wrapped.prediction().peak_bytes)


def test_a_plan_without_recompute_installs_no_hooks(gpt) -> None:
    model, inputs, program = gpt
    planned = plan(program.graph, [Device("cuda:0", 1 << 30)], PlannerSettings(placement="single", grads="dynamic"))
    verify(program.graph, planned)
    wrapped = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    assert wrapped.hooks is None and wrapped.recompute_ops == ()
    assert wrapped.prediction().peak_bytes == predict_apply(program).peak_bytes


def test_a_module_that_runs_other_calls_is_reported_and_still_trains(gpt) -> None:
    """The recipes replay the real calls: a graph that does not match costs memory, never correctness."""
    model, inputs, program = gpt
    planned = _plan(program, 0.7)
    policy = RecomputePolicy.from_records(program, planned.remat)
    shifted = RecomputePolicy(("aten.zeros.default", *policy.forward_ops), policy.recompute)
    hooks = RecomputeHooks(shifted)
    module = copy.deepcopy(model)
    with hooks.forward():
        loss = default_loss(module(*inputs))
    loss.backward()
    assert hooks.mismatch is not None and "call 0" in hooks.mismatch
    assert hooks.recomputed == 0


def test_an_input_changed_in_place_before_the_recompute_raises(gpt) -> None:
    """Like autograd's saved tensors: a recipe whose input was modified in place refuses to replay."""
    model, inputs, program = gpt
    planned = _plan(program, 0.65)
    policy = RecomputePolicy.from_records(program, planned.remat)
    hooks = RecomputeHooks(policy)
    module = copy.deepcopy(model)
    with hooks.forward():
        loss = default_loss(module(*inputs))
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(1.0)  # bumps the version of every weight a recipe holds
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_apply_on_cuda_holds_the_predicted_peak() -> None:
    """On a GPU the allocator's ``max_memory_allocated`` is held to the prediction (Adam's foreach path)."""
    torch.manual_seed(0)
    device = torch.device("cuda:0")
    model = zoo.build("gpt", **GPT)
    inputs = zoo.example_inputs("gpt", **INPUTS)
    program = capture_for(model, inputs, device, mode="train", optimizer="adam", loss_fn=None)
    planned = _plan(program, 0.7)
    warm_up(device)  # cuBLAS's workspaces (32 MiB each on an H100) are the process's, not the model's
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    wrapped = apply(model, planned, inputs, optimizer="adam", devices={"cuda:0": "cuda:0"})
    opt = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    measured = cuda_loop_peak(wrapped, opt, inputs, device, base)
    predicted = wrapped.prediction().peak_bytes
    assert wrapped.hooks is not None and wrapped.hooks.mismatch is None
    assert _within(measured, predicted), (measured, predicted, wrapped.workspaces, wrapped.unmatched_workspaces)


def test_plan_for_apply_fits_a_byte_budget_in_the_users_loop(gpt) -> None:
    """The remat pass's budget is lowered until apply's own peak fits; measured, it does."""
    model, inputs, program = gpt
    eager_peak, eager_losses, _ = _loop(copy.deepcopy(model), inputs)
    budget = int(0.7 * eager_peak)
    device = [Device("cuda:0", 1 << 30)]
    fitted = plan_for_apply(program, device, PlannerSettings(placement="single", grads="dynamic"), budget,
                            calls=module_calls(model, inputs))
    verify(program.graph, fitted.plan)
    assert fitted.prediction.peak_bytes <= budget and fitted.plan.remat
    wrapped = apply(copy.deepcopy(model), fitted.plan, inputs, optimizer="adam", devices="virtual")
    peak, losses, _ = _loop(wrapped, inputs)
    assert losses == eager_losses
    assert peak <= budget * (1 + 0.001)  # the prediction is exact to a few hundred bytes (Adam's step scalars)
    with pytest.raises(InfeasibleError):
        plan_for_apply(program, device, PlannerSettings(placement="single", grads="dynamic"), budget // 4)


def test_max_batch_finds_the_largest_batch_that_trains_under_the_cap() -> None:
    """The batch max_batch finds trains in the user's loop under the cap; one more does not fit any plan."""
    torch.manual_seed(0)
    model = zoo.build("gpt", **GPT)
    captured = {}

    def capture(batch):
        inputs = zoo.example_inputs("gpt", batch=batch, seq_len=32, vocab_size=64)
        program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer="adam", loss_fn=None)
        captured[batch] = (inputs, program)
        return program, module_calls(model, inputs)

    cap = 2 << 20
    settings = PlannerSettings(placement="single", grads="dynamic")
    fit = max_batch(capture, [Device("cuda:0", cap)], settings, cap)
    assert 1 < fit.batch < 64
    assert dict(fit.tried)[fit.batch] and not dict(fit.tried)[fit.batch + 1]
    inputs, program = captured[fit.batch]
    verify(program.graph, fit.result.plan, check_capacity=False)
    wrapped = apply(copy.deepcopy(model), fit.result.plan, inputs, optimizer="adam", devices="virtual")
    peak, _, _ = _loop(wrapped, inputs)
    assert peak <= cap
    # Without recompute the same batch would not fit: the recompute is what makes it train.
    assert fit.result.plan.remat and predict_apply(program).peak_bytes > cap


def test_a_remat_budget_can_be_a_fraction_of_the_devices_capacity(gpt) -> None:
    """'0.45 capacity' plans exactly as the bytes it stands for; the smallest device's capacity counts."""
    _, _, program = gpt
    capacity = 2 << 20
    devices = [Device("cuda:0", capacity)]
    as_fraction = plan(program.graph, devices, PlannerSettings(
        placement="single", remat="budget", remat_budget="45% capacity", grads="dynamic"))
    as_bytes = plan(program.graph, devices, PlannerSettings(
        placement="single", remat="budget", remat_budget=int(0.45 * capacity), grads="dynamic"))
    verify(program.graph, as_fraction)
    assert as_fraction.remat and as_fraction.remat == as_bytes.remat
    assert as_fraction.max_peak_bytes == as_bytes.max_peak_bytes <= 0.45 * capacity
    assert as_fraction.settings["remat_chosen"]["budget_bytes"] == int(0.45 * capacity)
    two = [Device("cuda:0", 4 * capacity), Device("cuda:1", capacity)]
    smallest = plan(program.graph, two, PlannerSettings(
        placement="single", remat="budget", remat_budget="0.45 capacity", grads="dynamic"))
    assert smallest.settings["remat_chosen"]["budget_bytes"] == int(0.45 * capacity)


def test_a_capacity_budget_out_of_range_is_one_config_error(tmp_path) -> None:
    from mpplan.config import load_config
    from mpplan.errors import ConfigError

    config = tmp_path / "c.yaml"
    config.write_text(
        "model: {synthetic: {kind: chain, n: 4}}\n"
        "devices: [{name: cuda:0, capacity: 1GiB}]\n"
        "planner: {remat: {policy: budget, budget: 150% capacity}}\n"
    )
    with pytest.raises(ConfigError, match=r"c\.yaml: planner\.remat\.budget: a fraction of capacity must lie in"):
        load_config(config)
    config.write_text(config.read_text().replace("150% capacity", "90% capacity"))
    assert load_config(config).planner.remat.budget == "90% capacity"


def test_max_batch_prefers_the_least_recompute_at_the_same_batch() -> None:
    from mpplan.cluster.objective import Objective
    from mpplan.cluster.records import Result, Status

    def result(key, batch, overhead, peak):
        return Result(key, Status.PREDICTED_FIT, {"workload.batch": batch},
                      predicted={"max_peak_bytes": peak, "compute_overhead": overhead})

    sqrt = result("a", 16, 0.30, 100)
    budget = result("b", 16, 0.05, 120)
    smaller = result("c", 8, 0.0, 50)
    assert Objective("max_batch").best([sqrt, budget, smaller], measured=False).key == "b"


def test_a_hugging_face_model_whose_real_forward_differs_from_its_trace_is_aligned() -> None:
    """HF GPT-2 builds an attention mask under tracing that a real forward skips (``mask.all()``):
    the recomputes are re-indexed onto the real calls, honoured, and the peak is still as predicted."""
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = zoo.build("gpt2", config_name="gpt2", n_layer=2, n_embd=64, n_head=2, vocab_size=1000,
                      bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 1000, (4, 64))
    inputs = {"input_ids": ids, "labels": ids}
    program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer="adam", loss_fn=None)
    calls = module_calls(model, inputs)
    policy = RecomputePolicy.from_records(program, [])
    assert calls != policy.forward_ops[: len(calls)]  # the trace and the real forward do differ
    budget = int(0.8 * predict_apply(program).peak_bytes)
    fitted = plan_for_apply(program, [Device("d", 1 << 40)], PlannerSettings(placement="single", grads="dynamic"),
                            budget, calls=calls)
    verify(program.graph, fitted.plan, check_capacity=False)
    eager_peak, eager_losses, _ = _loop(copy.deepcopy(model), inputs)
    wrapped = apply(copy.deepcopy(model), fitted.plan, inputs, optimizer="adam", devices="virtual")
    peak, losses, _ = _loop(wrapped, inputs)
    assert wrapped.hooks is not None and wrapped.hooks.mismatch is None and wrapped.hooks.recomputed > 0
    assert losses == eager_losses
    assert peak < eager_peak and _within(peak, wrapped.prediction().peak_bytes)


def test_aligned_drops_recomputes_the_real_forward_has_no_call_for() -> None:
    policy = RecomputePolicy(("a", "b", "mask", "c", "d"), {1: ("b", (0,)), 2: ("mask", (0,)), 4: ("d", (0,))})
    real = policy.aligned(["a", "b", "x", "c", "d"])
    assert dict(real.recompute) == {1: ("b", (0,)), 4: ("d", (0,))} and real.ops == ("b", "d")
    shifted = policy.aligned(["z", "a", "b", "c", "d"])
    assert dict(shifted.recompute) == {2: ("b", (0,)), 4: ("d", (0,))}


def test_random_calls_are_never_replayed_but_attention_without_dropout_is() -> None:
    from mpplan.runtime.recompute import _random

    aten = torch.ops.aten
    q = torch.zeros(1, 1, 2, 2)
    assert _random(aten.native_dropout.default, (q, 0.5, True), {})
    assert not _random(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q), {"dropout_p": 0.0})
    assert _random(aten._scaled_dot_product_flash_attention_for_cpu.default, (q, q, q, 0.1), {})
    assert not _random(aten.addmm.default, (q, q, q), {})


def test_a_cut_point_at_the_first_backward_reader_recomputes_for_every_backward_reader() -> None:
    """A record whose cut (``from_op``) names the tensor's first backward reader gets the recomputes of
    one without, and keeps no original for any node, as does a cut at a backward op before that reader;
    a cut outside backward is one ``PlanError`` naming the record (later cuts: ``test_apply_cuts``)."""
    from mpplan.capture.torch_capture import capture_program
    from mpplan.errors import PlanError

    model = zoo.build("mlp", in_features=8, hidden=16, out_features=4, layers=2)
    program = capture_program(model, zoo.example_inputs("mlp", batch=2, in_features=8), mode="train",
                              optimizer="sgd")
    relu = program.graph.op("relu")
    record = {"tensor": relu.outputs[0], "op": "relu", "recompute_op": "relu@recompute",
              "recompute_tensor": f"{relu.outputs[0]}@recompute", "bytes": 1}
    assert RecomputePolicy.from_records(program, [record]).ops == ("relu",)
    boundary = next(k for k, op in enumerate(program.graph.ops) if op.backward_of is not None)
    readers = [op.name for op in program.graph.ops[boundary:] if relu.outputs[0] in op.inputs]
    at_first = RecomputePolicy.from_records(program, [{**record, "from_op": readers[0]}])
    assert at_first.recompute == RecomputePolicy.from_records(program, [record]).recompute
    assert [(c.from_op, c.early_nodes) for c in at_first.cuts] == [(readers[0], 0)]
    before = next(op.name for op in program.graph.ops[boundary:] if program.op_phases[op.name] == "backward")
    assert before != readers[0]  # a backward op before every reader: the same cut
    assert RecomputePolicy.from_records(program, [{**record, "from_op": before}]) == at_first
    with pytest.raises(PlanError, match=r"^plan remat\[1\]: tensor .* has from_op 'relu'; .* forward phase"):
        RecomputePolicy.from_records(program, [record, {**record, "from_op": "relu"}])
    last = program.graph.ops[-1].name  # the optimizer's
    with pytest.raises(PlanError, match=rf"from_op {last!r}; .* is in the optimizer phase"):
        RecomputePolicy.from_records(program, [{**record, "from_op": last}])


def test_moving_the_users_inputs_is_not_a_call_of_the_graph(gpt, monkeypatch) -> None:
    """The root module's input move is the plan's copy, not a forward call: on a GPU the alignment forward
    saw CPU inputs moved (``_to_copy``) and the loop CUDA inputs not moved, and every recompute was off by one.
    Here every move makes a real ATen call (a clone), so counting it would shift the aligned calls."""
    import importlib

    apply_module = importlib.import_module("mpplan.runtime.apply")
    model, inputs, program = gpt
    planned = _plan(program, 0.65)
    wrapped = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    assert wrapped.module_devices.get("") is not None and wrapped.hooks is not None
    aligned = wrapped.hooks.policy.forward_ops
    monkeypatch.setattr(apply_module, "_to_device", lambda values, device: torch.utils._pytree.tree_map(
        lambda v: v.clone() if isinstance(v, torch.Tensor) else v, values))
    assert module_calls(wrapped, inputs) == aligned
    _loop(wrapped, inputs, steps=2)
    assert wrapped.hooks.mismatch is None

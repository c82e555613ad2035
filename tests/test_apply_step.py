"""``apply(..., step_in_backward=optimizer)``: the user's optimizer steps per parameter inside backward.

Each test trains in a plain loop (``zero_grad(set_to_none=True)``, forward,
``default_loss``, ``backward``, ``optimizer.step()``) under the storage meter and
holds it to: eager's numerics bit for bit (parameters and the optimizer's state,
which the user's optimizer still holds), a measured peak within 1% of
``PlannedModule.prediction()`` on the virtual device, and a lower peak than the
same loop stepping at the end where gradients and the optimizer set the peak.
Every plan goes through the verifier.
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
from mpplan.runtime.apply_budget import plan_for_apply
from mpplan.runtime.apply_memory import predict_apply
from mpplan.runtime.apply_step import StepInBackward, optimizer_path
from mpplan.runtime.recompute import module_calls
from mpplan.runtime.devices import warm_up
from mpplan.runtime.trace import capture_for
from mpplan.runtime.tracking import MeteringMode, StorageMeter
from mpplan.verify import verify
from user_loop import captured_gpt, cuda_loop_peak, metered_loop

# Wide and short: the parameters, their gradients and Adam's state outweigh the activations,
# so the end of the step (every gradient and the update's temporaries) sets eager's peak.
GPT = {"vocab_size": 256, "max_seq_len": 16, "d_model": 64, "n_heads": 2, "n_layers": 2}
INPUTS = {"batch": 2, "seq_len": 16, "vocab_size": 256}
TOLERANCE = 0.01

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def gpt():
    return captured_gpt(GPT, INPUTS)


def _adam(module, foreach):
    """Two groups with their own learning rates: the step in backward must use each parameter's own."""
    params = list(module.parameters())
    return torch.optim.Adam(
        [{"params": params[::2]}, {"params": params[1::2], "lr": 3e-3}], lr=1e-3, foreach=foreach
    )


_loop = metered_loop


def _plain_plan(program):
    planned = plan(program.graph, [Device("cuda:0", 1 << 30)], PlannerSettings(placement="single", grads="dynamic"))
    verify(program.graph, planned)
    return planned


def _same_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    return sa.keys() == sb.keys() and all(
        sa[k].keys() == sb[k].keys() and all(torch.equal(sa[k][n], sb[k][n]) for n in sa[k]) for k in sa
    )


@pytest.mark.parametrize("foreach", [False, True], ids=["single", "foreach"])
def test_step_in_backward_trains_like_eager_and_lowers_the_peak_as_predicted(gpt, foreach) -> None:
    model, inputs, program = gpt
    planned = _plain_plan(program)
    eager_model = copy.deepcopy(model)
    eager_opt = _adam(eager_model, foreach)
    _, eager_losses = _loop(eager_model, eager_opt, inputs)

    at_end = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    # One group: the update at the end is modelled as one loop in the model's order.
    end_peak, _ = _loop(at_end, torch.optim.Adam(at_end.parameters(), lr=1e-3, foreach=foreach), inputs)

    user_model = copy.deepcopy(model)
    wrapped = apply(user_model, planned, inputs, optimizer="adam", devices="virtual")
    opt = _adam(user_model, foreach)
    stepping = wrapped.step_in_backward(opt)
    peak, losses = _loop(wrapped, opt, inputs)

    n_params = len(list(model.parameters()))
    assert stepping.steps == 3 * n_params  # every parameter, every step, inside backward
    assert losses == eager_losses
    for (name, p), q in zip(user_model.named_parameters(), eager_model.parameters()):
        assert torch.equal(p, q), name
    assert _same_state(opt, eager_opt)  # the user's optimizer holds the state, as in eager

    prediction = wrapped.prediction()
    assert prediction.step_in_backward and prediction.optimizer_path == ("foreach" if foreach else "single")
    assert abs(peak - prediction.peak_bytes) <= TOLERANCE * prediction.peak_bytes, (peak, prediction.peak_bytes)
    before = at_end.prediction("foreach" if foreach else "single").peak_bytes
    assert abs(end_peak - before) <= TOLERANCE * before, (end_peak, before)
    # The saving is real and is the one predicted: gradients no longer pile up at the end.
    saving = before - prediction.peak_bytes
    assert saving > 0 and abs((end_peak - peak) - saving) <= TOLERANCE * before, (end_peak - peak, saving)


def test_remove_puts_the_step_back_at_the_end(gpt) -> None:
    model, inputs, program = gpt
    user_model = copy.deepcopy(model)
    opt = torch.optim.Adam(user_model.parameters(), lr=1e-3)
    wrapped = apply(user_model, _plain_plan(program), inputs, optimizer="adam", devices="virtual",
                    step_in_backward=opt)
    assert wrapped.stepping is not None
    wrapped.remove()
    assert wrapped.stepping is None and not wrapped.prediction().step_in_backward
    opt.zero_grad(set_to_none=True)
    default_loss(wrapped(*inputs)).backward()
    assert all(p.grad is not None for p in user_model.parameters())  # backward no longer steps nor frees
    assert not opt.state


def test_step_in_backward_with_recompute_fits_a_budget_stepping_at_the_end_cannot(gpt) -> None:
    """Recompute and the step in backward together: the budget is under what any recompute reaches
    with the update at the end (gradients set that floor), and the loop trains under it, as eager does."""
    model, inputs, program = gpt
    settings = PlannerSettings(placement="single", grads="dynamic")
    calls = module_calls(model, inputs)
    floor = predict_apply(program, optimizer_path="single", step_in_backward=True).peak_bytes
    budget = int(0.97 * floor)
    device = [Device("cuda:0", 1 << 30)]
    from mpplan.errors import InfeasibleError

    with pytest.raises(InfeasibleError):
        plan_for_apply(program, device, settings, budget, calls=calls)
    fitted = plan_for_apply(program, device, settings, budget, calls=calls, step_in_backward=True)
    verify(program.graph, fitted.plan, check_capacity=False)
    assert fitted.plan.remat and fitted.prediction.peak_bytes <= budget

    eager_model = copy.deepcopy(model)
    _, eager_losses = _loop(eager_model, torch.optim.Adam(eager_model.parameters(), lr=1e-3), inputs)
    user_model = copy.deepcopy(model)
    opt = torch.optim.Adam(user_model.parameters(), lr=1e-3)
    wrapped = apply(user_model, fitted.plan, inputs, optimizer="adam", devices="virtual", step_in_backward=opt)
    peak, losses = _loop(wrapped, opt, inputs)
    assert wrapped.hooks is not None and wrapped.hooks.recomputed > 0 and wrapped.hooks.mismatch is None
    assert losses == eager_losses
    for p, q in zip(user_model.parameters(), eager_model.parameters()):
        assert torch.equal(p, q)
    assert wrapped.prediction().peak_bytes == fitted.prediction.peak_bytes
    assert peak <= budget * (1 + 0.001)  # exact to Adam's step counters, a few hundred bytes


def test_the_optimizer_path_is_read_from_the_optimizer() -> None:
    cpu = [torch.nn.Parameter(torch.zeros(2))]
    assert optimizer_path(torch.optim.Adam(cpu)) == "single"
    assert optimizer_path(torch.optim.Adam(cpu, foreach=True)) == "foreach"
    assert optimizer_path(torch.optim.SGD(cpu, lr=0.1, foreach=False)) == "single"
    with pytest.raises(TypeError, match="expected a torch.optim.Optimizer"):
        StepInBackward(object())  # type: ignore[arg-type]


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_step_in_backward_on_cuda_holds_the_predicted_peak() -> None:
    """On a GPU (Adam's foreach default) ``max_memory_allocated`` is held to the prediction within 5%."""
    torch.manual_seed(0)
    device = torch.device("cuda:0")
    model = zoo.build("gpt", **GPT)
    inputs = zoo.example_inputs("gpt", **INPUTS)
    program = capture_for(model, inputs, device, mode="train", optimizer="adam", loss_fn=None)
    planned = _plain_plan(program)
    warm_up(device)  # cuBLAS's workspaces (32 MiB each on an H100) are the process's, not the model's
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    wrapped = apply(model, planned, inputs, optimizer="adam", devices={"cuda:0": "cuda:0"})
    opt = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    wrapped.step_in_backward(opt)
    measured = cuda_loop_peak(wrapped, opt, inputs, device, base)
    predicted = wrapped.prediction()
    assert predicted.optimizer_path == "foreach"
    assert abs(measured - predicted.peak_bytes) <= 0.05 * predicted.peak_bytes, (measured, predicted.peak_bytes)


def test_placement_recompute_and_the_step_in_backward_together(gpt) -> None:
    """A two-device pipeline plan that recomputes, applied with the step in backward on virtual devices:
    parameters where planned, recomputes honoured, eager's numerics bit for bit, the peak as predicted."""
    model, inputs, program = gpt
    devices = [Device("cuda:0", 1 << 30), Device("cuda:1", 1 << 30)]
    settings = PlannerSettings(placement="pipeline", grads="dynamic")
    budget = int(0.97 * predict_apply(program, step_in_backward=True).peak_bytes)
    fitted = plan_for_apply(program, devices, settings, budget, calls=module_calls(model, inputs),
                            step_in_backward=True)
    verify(program.graph, fitted.plan)
    assert fitted.plan.remat and len(set(fitted.plan.placement.values())) == 2

    eager_model = copy.deepcopy(model)
    eager_opt = torch.optim.Adam(eager_model.parameters(), lr=1e-3)
    _, eager_losses = _loop(eager_model, eager_opt, inputs)
    user_model = copy.deepcopy(model)
    opt = torch.optim.Adam(user_model.parameters(), lr=1e-3)
    wrapped = apply(user_model, fitted.plan, inputs, optimizer="adam", devices="virtual", step_in_backward=opt)
    assert set(wrapped.planned.values()) == {"cuda:0", "cuda:1"}
    peak, losses = _loop(wrapped, opt, inputs)
    assert wrapped.hooks is not None and wrapped.hooks.recomputed > 0 and wrapped.hooks.mismatch is None
    assert losses == eager_losses
    for p, q in zip(user_model.parameters(), eager_model.parameters()):
        assert torch.equal(p, q)
    assert _same_state(opt, eager_opt)
    predicted = wrapped.prediction().peak_bytes
    assert abs(peak - predicted) <= TOLERANCE * predicted and peak <= budget * (1 + 0.001), (peak, predicted, budget)


def test_max_batch_holds_the_users_loop_to_the_cap_not_the_plans_own_peak() -> None:
    """The cap lies between the plan's own peak at batch 1 and what the loop holds stepping at the end:
    judged by the plan's own peak batch 1 fits, yet that loop measures over the cap.  ``max_batch`` on
    apply's prediction refuses it, and with the step in backward finds a batch that trains under the cap."""
    from mpplan.errors import InfeasibleError
    from mpplan.runtime.apply_budget import max_batch

    torch.manual_seed(0)
    model = zoo.build("gpt", **GPT)
    captured = {}

    def capture(batch):
        inputs = zoo.example_inputs("gpt", batch=batch, seq_len=16, vocab_size=256)
        program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer="adam", loss_fn=None)
        captured[batch] = (inputs, program)
        return program, module_calls(model, inputs)

    program, _ = capture(1)
    own = _plain_plan(program).max_peak_bytes
    at_end = predict_apply(program).peak_bytes
    assert own < at_end
    cap = (own + at_end) // 2
    devices = [Device("cuda:0", cap)]
    own_fit = plan(program.graph, devices, PlannerSettings(placement="single", grads="dynamic"))
    verify(program.graph, own_fit)  # the plan's own prediction fits the cap at batch 1 ...
    inputs, _ = captured[1]
    end_peak, _ = _loop_at_end(model, own_fit, inputs)
    assert end_peak > cap  # ... but the user's loop does not

    settings = PlannerSettings(placement="single", grads="dynamic")
    with pytest.raises(InfeasibleError):
        max_batch(capture, devices, settings, cap)
    fit = max_batch(capture, devices, settings, cap, step_in_backward=True)
    assert fit.batch >= 2 and dict(fit.tried)[fit.batch] and not dict(fit.tried)[fit.batch + 1]
    inputs, program = captured[fit.batch]
    verify(program.graph, fit.result.plan, check_capacity=False)
    user_model = copy.deepcopy(model)
    opt = torch.optim.Adam(user_model.parameters(), lr=1e-3)
    wrapped = apply(user_model, fit.result.plan, inputs, optimizer="adam", devices="virtual", step_in_backward=opt)
    peak, _ = _loop(wrapped, opt, inputs)
    assert peak <= cap


def _loop_at_end(model, planned, inputs):
    """The user's loop under ``apply``, Adam stepping at the end."""
    wrapped = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    return _loop(wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3), inputs)


def test_step_in_backward_with_sgd() -> None:
    """SGD without momentum updates in place: the step in backward only frees each gradient early."""
    torch.manual_seed(0)
    model = zoo.build("gpt", **GPT)
    inputs = zoo.example_inputs("gpt", **INPUTS)
    program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer="sgd", loss_fn=None)
    planned = _plain_plan(program)
    eager_model = copy.deepcopy(model)
    _, eager_losses = _loop(eager_model, torch.optim.SGD(eager_model.parameters(), lr=0.1), inputs)
    user_model = copy.deepcopy(model)
    opt = torch.optim.SGD(user_model.parameters(), lr=0.1)
    wrapped = apply(user_model, planned, inputs, optimizer="sgd", devices="virtual", step_in_backward=opt)
    peak, losses = _loop(wrapped, opt, inputs)
    assert losses == eager_losses
    for p, q in zip(user_model.parameters(), eager_model.parameters()):
        assert torch.equal(p, q)
    predicted = wrapped.prediction().peak_bytes
    assert abs(peak - predicted) <= TOLERANCE * predicted, (peak, predicted)
    assert predicted < predict_apply(program).peak_bytes


def test_parameters_ready_at_once_on_two_threads_each_step_once() -> None:
    """Autograd runs one thread per CUDA device; here two CPU backward passes on two threads make two
    parameters ready at once.  Each must be stepped once, by itself, and the groups restored."""
    import threading
    import time

    entered = threading.Event()

    class SlowSGD(torch.optim.SGD):
        def step(self, closure=None):
            entered.set()
            time.sleep(0.2)  # the second parameter becomes ready while the first one's step runs
            return super().step(closure)

    a = torch.nn.Parameter(torch.ones(4))
    b = torch.nn.Parameter(torch.ones(4))
    opt = SlowSGD([a, b], lr=0.5)
    stepping = StepInBackward(opt)
    first = threading.Thread(target=lambda: (a * 2.0).sum().backward())
    second = threading.Thread(target=lambda: (b * 3.0).sum().backward())
    first.start()
    assert entered.wait(timeout=60)
    second.start()
    first.join()
    second.join()
    assert stepping.steps == 2 and a.grad is None and b.grad is None
    assert torch.equal(a.detach(), torch.full((4,), 0.0)) and torch.equal(b.detach(), torch.full((4,), -0.5))
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["params"] == [a, b]

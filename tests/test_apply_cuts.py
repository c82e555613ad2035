"""``apply`` honours a remat record's cut point (``from_op``) at any backward reader of its tensor.

Plans are made as the planner makes a plan for a recompute it chose itself
(``plan_recomputing``, the remat pass's rewrite with ``from_ops``) and verified.  A late
cut keeps the original for the backward nodes before it and recomputes for the ones
after; the tests hold the gradients to eager's (same seed) and the storage meter's
peak to ``PlannedModule.prediction()``, which models the cuts.  Before cuts past the
first backward reader were honoured, ``apply`` refused each of these plans with a
``PlanError`` (``from_op ...; apply() recomputes before the first backward reader only``).
"""

from __future__ import annotations

import copy
import time

import pytest
import torch

from mpplan import zoo
from mpplan.capture.torch_capture import default_loss
from mpplan.config import Device
from mpplan.errors import PlanError
from mpplan.planner import PlannerSettings
from mpplan.runtime import apply, cuda_available
from mpplan.passes.remat.result import result_of
from mpplan.runtime.apply_budget import plan_for_apply, plan_recomputing
from mpplan.runtime.apply_cuts import Cut, cuts_of
from mpplan.runtime.apply_memory import predict_apply
from mpplan.runtime.devices import warm_up
from mpplan.runtime.recompute import module_calls
from mpplan.runtime.trace import capture_for
from mpplan.verify import verify
from user_loop import captured_gpt, cuda_loop_peak, metered_loop

GPT = {"vocab_size": 64, "max_seq_len": 32, "d_model": 32, "n_heads": 2, "n_layers": 2}
INPUTS = {"batch": 8, "seq_len": 32, "vocab_size": 64}
#: Recomputes that chain (attention reads the recomputed qkv projection, gelu the recomputed
#: fc) and whose attention outputs have two backward reader nodes (the projection's, attention's own).
GPT_OPS = ("addmm", "_scaled_dot_product_flash_attention_for_cpu", "addmm_4",
           "_scaled_dot_product_flash_attention_for_cpu_1", "addmm_2", "gelu")
#: The meter's peak is the prediction's to within Adam's per-parameter ``step`` scalars (not modelled).
SLACK = 0.001

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def gpt():
    return captured_gpt(GPT, INPUTS)


def _reader_nodes(program, tensor: str) -> dict[str, list[str]]:
    """Backward node (its ``backward_of``) -> the ops of it reading ``tensor``'s storage, in graph order."""
    topo = program.graph.topology
    storage = topo.storage_of[topo.tensor_index[tensor]]
    nodes: dict[str, list[str]] = {}
    for k, op in enumerate(program.graph.ops):
        if program.op_phases.get(op.name) == "backward" and storage in {topo.storage_of[u] for u in topo.op_inputs[k]}:
            nodes.setdefault(op.backward_of or op.name, []).append(op.name)
    return nodes


def _late_cuts(program, ops) -> dict[str, str]:
    """Each output of ``ops`` read by several backward nodes -> the first reader of its last node."""
    from_ops = {}
    for name in ops:
        for tensor in program.graph.op(name).outputs:
            nodes = list(_reader_nodes(program, tensor).values())
            if len(nodes) >= 2:
                from_ops[tensor] = nodes[-1][0]
    assert from_ops, "the test needs a tensor read by several backward nodes"
    return from_ops


def _late_plan(program, ops):
    """A verified plan recomputing ``ops``, cut as ``_late_cuts`` says."""
    from_ops = _late_cuts(program, ops)
    devices = [Device("cuda:0", 1 << 30)]
    planned = plan_recomputing(program.graph, devices, PlannerSettings(placement="single", grads="dynamic"), ops,
                               1 << 30, from_ops=from_ops)
    verify(program.graph, planned)
    assert {r["tensor"]: r["from_op"] for r in planned.remat if r.get("from_op")} == from_ops
    return planned, from_ops


def _grads(module, inputs) -> dict[str, torch.Tensor]:
    """The parameters' gradients of one seeded forward and backward."""
    torch.manual_seed(7)
    for p in module.parameters():
        p.grad = None
    out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    default_loss(out).backward()
    return {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


def _check_against_eager(model, inputs, program, planned) -> None:
    """Gradients and a trained loop equal eager's; the meter's peak is the prediction with the cuts, not without."""
    wrapped = apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices="virtual")
    assert wrapped.hooks is not None and all(c.early_nodes >= 1 for c in wrapped.hooks.policy.cuts)
    torch.testing.assert_close(_grads(wrapped.module, inputs), _grads(copy.deepcopy(model), inputs))
    eager = copy.deepcopy(model)
    _, eager_losses = metered_loop(eager, torch.optim.Adam(eager.parameters(), lr=1e-3), inputs)
    peak, losses = metered_loop(wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3), inputs)
    assert wrapped.hooks.mismatch is None and wrapped.hooks.recomputed > 0
    assert losses == eager_losses
    for (name, p), q in zip(wrapped.module.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    predicted = wrapped.prediction().peak_bytes
    at_first = predict_apply(program, wrapped.recompute_ops).peak_bytes  # every late region at the first reader
    assert peak <= predicted * (1 + SLACK), (peak, predicted)
    assert abs(peak - predicted) < abs(peak - at_first), (peak, predicted, at_first)


def test_late_cuts_in_a_gpt_with_chained_recomputes_train_as_eager_within_the_prediction(gpt) -> None:
    """Both attentions cut at their own backward node (the projection's node reads the original first),
    recomputed from the recomputed qkv projection; gelu from the recomputed fc."""
    model, inputs, program = gpt
    planned, from_ops = _late_plan(program, GPT_OPS)
    assert len(planned.remat) >= len(GPT_OPS) and len(from_ops) == 2
    _check_against_eager(model, inputs, program, planned)


def test_late_cuts_in_an_mlp_train_as_eager_within_the_prediction() -> None:
    """Every ReLU cut at its own node (the next layer's node reads it first), recomputed from the recomputed
    ``addmm`` before it: a chain of two recomputes per layer."""
    torch.manual_seed(0)
    model = zoo.build("mlp", in_features=32, hidden=128, out_features=8, layers=4)
    inputs = zoo.example_inputs("mlp", batch=512, in_features=32)
    program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer="adam", loss_fn=None)
    ops = ("addmm", "relu", "addmm_1", "relu_1", "addmm_2", "relu_2")
    planned, from_ops = _late_plan(program, ops)
    assert len(from_ops) == 3
    _check_against_eager(model, inputs, program, planned)


def test_plan_for_apply_keeps_the_cuts_its_remat_pass_chose(gpt, monkeypatch) -> None:
    """When the remat pass on the loop's graph cuts late, the plan says so and the prediction counts it:
    the budget that fits the late cuts exactly is met, and the measured loop stays under it."""
    import mpplan.runtime.apply_budget as apply_budget

    model, inputs, program = gpt
    from_ops = _late_cuts(program, GPT_OPS)
    monkeypatch.setattr(apply_budget, "remat", lambda graph, policy, **_: result_of(
        graph, GPT_OPS, policy, 0, time.perf_counter(), from_ops=from_ops))
    budget = predict_apply(program, GPT_OPS, from_ops=from_ops).peak_bytes
    assert budget > predict_apply(program, GPT_OPS).peak_bytes  # the cuts hold more than first-reader ones
    devices = [Device("cuda:0", 1 << 30)]
    fitted = plan_for_apply(program, devices, PlannerSettings(placement="single", grads="dynamic"), budget,
                            calls=module_calls(model, inputs))
    verify(program.graph, fitted.plan)
    assert {r["tensor"]: r["from_op"] for r in fitted.plan.remat if r.get("from_op")} == from_ops
    assert fitted.prediction.peak_bytes == budget
    wrapped = apply(copy.deepcopy(model), fitted.plan, inputs, optimizer="adam", devices="virtual")
    peak, _ = metered_loop(wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3), inputs)
    assert peak <= budget * (1 + SLACK), (peak, budget)


def _mlp_program():
    model = zoo.build("mlp", in_features=8, hidden=16, out_features=4, layers=3)
    return capture_for(model, zoo.example_inputs("mlp", batch=2, in_features=8), torch.device("cpu"),
                       mode="train", optimizer="sgd", loss_fn=None)


def _record(program, op: str, **more):
    tensor = program.graph.op(op).outputs[0]
    return {"tensor": tensor, "op": op, "recompute_op": f"{op}@recompute", "recompute_tensor": f"{tensor}@recompute",
            "bytes": 1, **more}


def test_a_cut_moves_to_the_first_reader_of_its_node_and_counts_the_nodes_before() -> None:
    """A cut between nodes starts at the next reader node; one inside a node at that node's first reader;
    the first reader's cut keeps nothing (every backward reader reads the recompute)."""
    program = _mlp_program()
    tensor = program.graph.op("relu_1").outputs[0]
    nodes = list(_reader_nodes(program, tensor).values())
    assert len(nodes) == 2
    first, last = nodes[0][0], nodes[-1][0]
    ops = [op.name for op in program.graph.ops]
    between = ops[ops.index(nodes[0][-1]) + 1]  # the op after the first node's last reader, no reader itself
    assert between != last
    for cut, early, start in ((first, 0, first), (between, 1, last), (last, 1, last)):
        assert cuts_of(program, [_record(program, "relu_1", from_op=cut)]) == (Cut(tensor, "relu_1", 0, start, early),)
    within = next(names for names in nodes if len(names) > 1)  # a node reading it twice: a cut at its second op
    node_start = within[0]
    assert cuts_of(program, [_record(program, "relu_1", from_op=within[1])])[0].from_op == node_start
    assert cuts_of(program, [_record(program, "relu_1")]) == ()


def test_a_cut_apply_cannot_honour_is_one_plan_error_naming_the_record() -> None:
    program = _mlp_program()
    record = _record(program, "relu_1")
    last_reader = list(_reader_nodes(program, record["tensor"]).values())[-1][-1]
    ops = [op.name for op in program.graph.ops]
    after = next(name for name in ops[ops.index(last_reader) + 1:] if program.op_phases[name] == "backward")
    optimizer_op = next(name for name in ops if program.op_phases[name] == "optimizer")
    for cut, why in (("relu", "is in the forward phase"), ("nowhere", "is no op of the graph"),
                     ("@recomputes", "is no op of the graph"),  # a chain link: graphs without a backward pass
                     (optimizer_op, "is in the optimizer phase"), (after, "comes after the last of them")):
        with pytest.raises(PlanError, match=rf"^plan remat\[1\]: tensor {record['tensor']!r} has from_op {cut!r}; "
                                            rf"apply\(\) recomputes before one of the tensor's backward readers, "
                                            rf"and {cut!r} {why}"):
            cuts_of(program, [_record(program, "relu"), {**record, "from_op": cut}])


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")
def test_late_cuts_on_cuda_hold_the_predicted_peak() -> None:
    """On a GPU the allocator's peak with late cuts is held to the prediction (Adam's foreach path)."""
    device = torch.device("cuda:0")
    model, inputs, program = captured_gpt(GPT, INPUTS, "cuda:0")
    # The forward attentions (whatever kernel the GPU picks); their backward ops are not recomputable.
    ops = tuple(op.name for op in program.graph.ops
                if op.type.startswith("aten._scaled_dot_product") and program.op_phases[op.name] == "forward")
    planned, _ = _late_plan(program, ops)
    warm_up(device)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    wrapped = apply(model, planned, inputs, optimizer="adam", devices={"cuda:0": "cuda:0"})
    measured = cuda_loop_peak(wrapped, torch.optim.Adam(wrapped.parameters(), lr=1e-3), inputs, device, base)
    predicted = wrapped.prediction().peak_bytes
    assert wrapped.hooks is not None and wrapped.hooks.mismatch is None and wrapped.hooks.policy.cuts
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted, wrapped.workspaces,
                                                          wrapped.unmatched_workspaces)

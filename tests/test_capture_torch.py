"""PyTorch capture: graph invariants on the zoo, bytes by hand, op-by-op execution, errors.

The executor check (``_execute``) runs a ``CapturedProgram`` the way the runtime will:
op by op on real tensors, freeing every storage right after its last use under the
graph's own liveness, and checks each op's declared aliasing against the real
storages it produced.
"""

from __future__ import annotations

import copy
import math
import resource

import pytest
import torch
from torch import nn

from mpplan import sim
from mpplan.capture.torch_capture import (
    CapturedProgram,
    OptimizerSpec,
    SourceRole,
    capture,
    capture_program,
    default_loss,
)
from mpplan.errors import CaptureError
from mpplan.graph import Kind
from mpplan.liveness import live_ranges
from mpplan.zoo import cnn, convattn, mlp, transformer

F32 = 4


# ------------------------------------------------------------------------------------------
# helpers


def _root(graph, name: str) -> str:
    while graph.tensor(name).alias_of is not None:
        name = graph.tensor(name).alias_of
    return name


def _check_program(program: CapturedProgram, module: nn.Module, *, optimizer: str | None = None) -> None:
    """Invariants every captured program must satisfy."""
    g = program.graph.validate()
    params = {n: p for n, p in module.named_parameters()}
    trainable = {n for n, p in params.items() if p.requires_grad}
    by_role: dict[SourceRole, list[str]] = {}
    for src in program.sources:
        by_role.setdefault(src.role, []).append(src.tensor)
    assert sorted(s.key for s in program.sources if s.role is SourceRole.PARAM) == sorted(params)
    for role, kind in [
        (SourceRole.PARAM, Kind.PARAM),
        (SourceRole.BUFFER, Kind.PARAM),
        (SourceRole.INPUT, Kind.INPUT),
        (SourceRole.OPTIMIZER_STATE, Kind.OPTIMIZER_STATE),
    ]:
        assert all(g.tensor(t).kind is kind for t in by_role.get(role, ())), role
    for t in g.tensors:
        assert t.shape is not None and t.dtype is not None
        width = torch.empty((), dtype=getattr(torch, t.dtype)).element_size()
        assert t.nbytes == (0 if t.alias_of else math.prod(t.shape) * width), t.name
    assert program.graph.outputs and all(g.tensor(o).kind is not Kind.ACTIVATION for o in g.outputs)

    if program.mode == "infer":
        assert not any(t.kind is Kind.GRAD for t in g.tensors)
        assert set(program.op_phases.values()) == {"forward"}
        return
    (loss,) = g.outputs
    assert g.tensor(loss).kind is Kind.OUTPUT and g.tensor(loss).shape == ()
    # Every trainable parameter: exactly one tensor with grad_of, a storage of the parameter's size.
    grad_of = {}
    for t in g.tensors:
        if t.grad_of is not None:
            assert t.grad_of not in grad_of, f"{t.grad_of} has two gradients"
            grad_of[t.grad_of] = t
    assert set(grad_of) == trainable == set(program.grads)
    for name, t in grad_of.items():
        assert t.kind is Kind.GRAD and t.alias_of is None and t.nbytes == g.tensor(name).nbytes
        assert _root(g, program.grads[name]) == t.name
    states = [t for t in g.tensors if t.kind is Kind.OPTIMIZER_STATE]
    assert len(states) == (2 * len(trainable) + 1 if optimizer == "adam" else 0)
    # Backward ops point at forward ops and share their module.
    phase = program.op_phases
    backward = [o for o in g.ops if phase[o.name] == "backward"]
    linked = [o for o in backward if o.backward_of is not None]
    assert backward and len(linked) >= 0.9 * len(backward)
    for o in linked:
        assert phase[o.backward_of] == "forward"
    forward_module = {o.name: o.module for o in g.ops}
    assert sum(o.module == forward_module[o.backward_of] for o in linked) >= 0.9 * len(linked)
    assert not any(o.backward_of for o in g.ops if phase[o.name] != "backward")
    if optimizer:
        assert any(phase[o.name] == "optimizer" for o in g.ops)


def _execute(program: CapturedProgram, module: nn.Module, inputs) -> list[torch.Tensor]:
    """Run the program op by op as the runtime will, freeing storages after their last use."""
    g = program.graph
    topo = g.topology
    env = program.bind(module, inputs)
    ranges = live_ranges(g, range(len(g.ops))).ranges
    last = {r.storage: r.last for r in ranges if r.storage not in topo.output_storages}
    aliases: dict[int, list[str]] = {}
    for i, t in enumerate(g.tensors):
        aliases.setdefault(topo.storage_of[i], []).append(t.name)
    dying: dict[int, list[int]] = {}
    for s, step in last.items():
        dying.setdefault(step, []).append(s)

    def value(name: str) -> torch.Tensor:
        return next(env[n] for n in program.tensor_nodes[name] if n in env)

    with torch.no_grad():
        for step, op in enumerate(g.ops):
            in_storages = {value(t).untyped_storage().data_ptr() for t in op.inputs if value(t).numel()}
            program.run_op(op.name, env)
            for t in op.outputs:
                if t in op.inputs or value(t).numel() == 0:
                    continue
                ptr = value(t).untyped_storage().data_ptr()
                if g.tensor(t).alias_of is not None:  # a view shares its base's storage ...
                    assert ptr == value(_root(g, t)).untyped_storage().data_ptr(), (op.name, t)
                else:  # ... a fresh tensor has storage of its own
                    assert ptr not in in_storages, (op.name, t)
            for s in dying.get(step, ()):
                for t in aliases[s]:
                    for n in program.tensor_nodes.get(t, ()):
                        env.pop(n, None)
    return [env[n] for n in program.output_nodes]


TINY_MODELS = {
    "mlp": (lambda: mlp.mlp(8, 16, 4, layers=3), lambda: mlp.example_inputs(batch=3, in_features=8)),
    "resnet": (lambda: cnn.resnet((1, 1), width=4), lambda: cnn.example_inputs(batch=2, image_size=8)),
    "gpt": (
        lambda: transformer.gpt(vocab_size=64, max_seq_len=16, d_model=32, n_heads=2, n_layers=2),
        lambda: transformer.example_inputs(batch=2, seq_len=16, vocab_size=64),
    ),
    "gpt-math": (
        lambda: transformer.gpt(
            vocab_size=64, max_seq_len=16, d_model=32, n_heads=2, n_layers=1, attention="math", tie_weights=False
        ),
        lambda: transformer.example_inputs(batch=2, seq_len=16, vocab_size=64),
    ),
    "convattn": (
        lambda: convattn.convattn(stages=2, width=8, n_heads=2, groups=4),
        lambda: convattn.example_inputs(batch=2, image_size=8),
    ),
}


# ------------------------------------------------------------------------------------------
# the zoo: invariants in every mode


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
@pytest.mark.parametrize("mode, optimizer", [("infer", None), ("train", None), ("train", "adam")])
def test_zoo_models_capture_with_invariants(name: str, mode: str, optimizer: str | None) -> None:
    build, inputs = TINY_MODELS[name]
    model = build()
    program = capture_program(model, inputs(), mode=mode, optimizer=optimizer)
    _check_program(program, model, optimizer=optimizer)
    assert model.training  # the module's own flag is restored after an eval-mode trace


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_op_by_op_execution_matches_eager_training_step(name: str, optimizer: str) -> None:
    torch.manual_seed(0)
    build, make_inputs = TINY_MODELS[name]
    model, x = build(), make_inputs()
    planned, eager = copy.deepcopy(model), copy.deepcopy(model)
    program = capture_program(planned, x, mode="train", optimizer=optimizer)
    loss, *grads = _execute(program, planned, x)

    eager.train()
    reference = eager(*x).float().mean()
    reference.backward()
    optim = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    optim(eager.parameters(), lr=1e-3).step()
    assert torch.equal(loss, reference.detach())
    eager_params = dict(eager.named_parameters())
    for fqn, grad in zip(program.grads, grads):
        assert torch.equal(grad, eager_params[fqn].grad), fqn
    for fqn, p in planned.named_parameters():
        torch.testing.assert_close(p, eager_params[fqn], rtol=0, atol=1e-6)
    for (fqn, b), (_, ref) in zip(planned.named_buffers(), eager.named_buffers()):
        assert torch.equal(b, ref), fqn  # batch-norm running stats were updated in place


def test_infer_execution_matches_eager() -> None:
    model, x = TINY_MODELS["resnet"][0](), TINY_MODELS["resnet"][1]()
    program = capture_program(model, x, mode="infer")
    (out,) = _execute(program, model, x)
    model.eval()
    with torch.no_grad():
        assert torch.equal(out, model(*x))


# ------------------------------------------------------------------------------------------
# bytes by hand: MLP(4 -> 8 -> 2), batch 3, float32


B, IN, H, OUT = 3, 4, 8, 2
PARAM_BYTES = (H * IN + H + OUT * H + OUT) * F32  # net.0: 8x4 + 8, net.2: 2x8 + 2 = 58 floats = 232 B
INPUT_BYTES = B * IN * F32  # 48 B


def _tiny_mlp(**kwargs) -> tuple[nn.Module, tuple[torch.Tensor]]:
    return mlp.MLP(IN, H, OUT, layers=2, **kwargs), (torch.randn(B, IN),)


def test_mlp_inference_bytes_by_hand() -> None:
    # Forward: t(W1) is a view; addmm -> h (B x H), relu -> a (B x H), t(W2) a view,
    # addmm -> logits (B x OUT, the output).  Running in order, relu holds h and a: the
    # peak of live dynamic bytes is 2 * B * H floats.
    g = capture(*_tiny_mlp(), mode="infer")
    assert sim.static_bytes(g) == PARAM_BYTES + INPUT_BYTES
    assert sim.no_sharing_bytes(g) == (2 * B * H + B * OUT) * F32  # 216 B
    assert sim.order_load(g, range(len(g.ops))) == 2 * B * H * F32  # 192 B
    assert g.tensor("t").alias_of == "net.0.weight"  # a transposed view: no storage of its own
    assert g.tensor("t").nbytes == 0 and g.tensor("t").shape == (IN, H)


def test_mlp_training_bytes_by_hand() -> None:
    # Static: params, one gradient per param (= params), exp_avg + exp_avg_sq (= 2 x params),
    # Adam's float32 step, the input.
    # Dynamic, forward: h = addmm (B x H), a = relu(h) (B x H), logits (B x OUT), loss (1).
    # Backward of mean: the seed ones_like (1) expanded (a view) then divided -> B x OUT;
    # grad of a = mm(dlogits, W2) (B x H); threshold_backward -> grad of h (B x H).  Weight
    # and bias gradients are the static grad storages (mm, sum), their transposes/views alias.
    # Adam: 11 float32 scalars for the bias corrections (pow, rsub, reciprocal, mul, neg for
    # step size; pow, rsub, sqrt, mul for the scale; reciprocal, mul for eps) and, per
    # param, one sqrt(exp_avg_sq) denominator updated in place: params' worth of bytes.
    model, x = _tiny_mlp()
    program = capture_program(model, x, mode="train", optimizer="adam")
    g = program.graph
    kind_bytes = {kind: sum(t.nbytes for t in g.tensors if t.kind is kind and t.alias_of is None) for kind in Kind}
    assert kind_bytes[Kind.PARAM] == PARAM_BYTES
    assert kind_bytes[Kind.GRAD] == PARAM_BYTES
    assert kind_bytes[Kind.OPTIMIZER_STATE] == 2 * PARAM_BYTES + F32
    assert sim.static_bytes(g) == 4 * PARAM_BYTES + F32 + INPUT_BYTES
    forward = (2 * B * H + B * OUT + 1) * F32
    backward = (1 + B * OUT + 2 * B * H) * F32
    adam = 11 * F32 + PARAM_BYTES
    assert sim.no_sharing_bytes(g) == forward + backward + adam  # 228 + 220 + 276 = 716 B
    without_optimizer = capture(*_tiny_mlp(), mode="train")
    assert sim.no_sharing_bytes(without_optimizer) == forward + backward
    assert sim.static_bytes(without_optimizer) == 2 * PARAM_BYTES + INPUT_BYTES


def test_mlp_views_in_place_links_and_modules() -> None:
    model, x = _tiny_mlp(inplace_relu=True)
    program = capture_program(model, x, mode="train", optimizer="sgd")
    g = program.graph
    ops = {o.type: o for o in g.ops}
    relu = ops["aten.relu_.default"]
    assert relu.inputs == relu.outputs == ("addmm",) and relu.module == "net.1"
    assert all(g.tensor(o.outputs[0]).alias_of for o in g.ops if o.type in ("aten.t.default", "aten.expand.default"))
    mm_ops = [o for o in g.ops if o.type == "aten.mm.default"]
    assert {g.op(o.backward_of).type for o in mm_ops} == {"aten.addmm.default"}
    assert {o.module for o in mm_ops} == {"net.0", "net.2"}
    sgd = [o for o in g.ops if program.op_phases[o.name] == "optimizer"]
    assert sorted(o.outputs[0] for o in sgd) == sorted(n for n, _ in model.named_parameters())
    assert all(o.inputs[0] == o.outputs[0] for o in sgd)  # p.add_(g, alpha=-lr) updates in place
    costs = {o.name: o.cost for o in g.ops}
    assert costs["t"] == 0 and costs["addmm"] == costs["relu_"] == 1.0  # views free, tiny ops a launch


def test_cost_is_roofline_microseconds() -> None:
    # addmm(bias, x, W^T) for x: 512 x 1024, W: 4096 x 1024 in float32 at 100 TFLOP/s and 2 TB/s:
    # 2 * 512 * 1024 * 4096 FLOPs = 42.9 us beats moving (512*1024 + 4096*1024 + 4096 + 512*4096) * 4 B = 13.1 us.
    g = capture(mlp.mlp(1024, 4096, 8, layers=2, device="meta"), mlp.example_inputs(512, 1024), mode="infer")
    assert g.op("addmm").cost == pytest.approx(2 * 512 * 1024 * 4096 / 100e6)
    # relu reads and writes 512 x 4096 floats: memory bound.
    assert g.op("relu").cost == pytest.approx(2 * 512 * 4096 * F32 / 2e6)


def test_resnet_batch_norm_updates_running_stats_in_place() -> None:
    model, x = TINY_MODELS["resnet"][0](), TINY_MODELS["resnet"][1]()
    g = capture(model, x, mode="train")
    bn = next(o for o in g.ops if "batch_norm" in o.type and o.module == "stem.0.1")
    for stat in ("stem.0.1.running_mean", "stem.0.1.running_var"):
        assert stat in bn.inputs and stat in bn.outputs
    tracked = next(o for o in g.ops if "stem.0.1.num_batches_tracked" in o.outputs)
    assert tracked.in_place == ("stem.0.1.num_batches_tracked",)


def test_shared_and_partial_gradients_get_storage_of_their_own() -> None:
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
            self.c, self.d = nn.Parameter(torch.randn(2)), nn.Parameter(torch.randn(4))
            self.frozen = nn.Parameter(torch.randn(3), requires_grad=False)
            self.offset = torch.ones(3)  # a plain tensor attribute: a lifted constant

        def forward(self, x: torch.Tensor, scale: float = 1.0, unused: None = None) -> torch.Tensor:
            y = (self.a + self.b).sum() + torch.cat([self.a, self.c]).pow(2).sum() + self.d.sum()
            z = x * torch.tensor(2.0) + self.offset + self.frozen
            z[:, :2].add_(1)  # in place on a view
            return y * scale + z.sum()

    model, inputs = Odd(), {"x": torch.randn(2, 3), "scale": 0.5, "unused": None}
    eager = copy.deepcopy(model)
    program = capture_program(model, inputs, mode="train", optimizer="sgd")
    _check_program(program, model, optimizer="sgd")
    assert {s.role for s in program.sources} >= {SourceRole.CONSTANT, SourceRole.INPUT}
    loss, *grads = _execute(program, model, inputs)
    reference = eager(**inputs)
    reference.backward()
    assert torch.equal(loss, reference.detach())
    for fqn, grad in zip(program.grads, grads):
        assert torch.equal(grad, dict(eager.named_parameters())[fqn].grad), fqn


def test_custom_loss_and_optimizer_spec() -> None:
    model, x = _tiny_mlp()
    target = torch.randint(0, OUT, (B,))
    spec = OptimizerSpec("adam", lr=0.01, betas=(0.8, 0.9), eps=1e-6)
    program = capture_program(
        model, x, mode="train", optimizer=spec, loss_fn=lambda out: nn.functional.cross_entropy(out, target)
    )
    assert program.optimizer == spec
    eager = copy.deepcopy(model)
    loss, *_ = _execute(program, model, x)
    reference = nn.functional.cross_entropy(eager(*x), target)
    reference.backward()
    torch.optim.Adam(eager.parameters(), lr=0.01, betas=(0.8, 0.9), eps=1e-6).step()
    assert torch.equal(loss, reference.detach())
    for (fqn, p), (_, ref) in zip(model.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p, ref, rtol=0, atol=1e-6)


def test_default_loss() -> None:
    scalar = torch.tensor(2.0)
    assert default_loss(scalar) is scalar
    assert default_loss({"loss": scalar, "logits": torch.ones(2)}) is scalar
    assert default_loss((torch.arange(4).view(2, 2), None)).item() == 1.5


# ------------------------------------------------------------------------------------------
# big models without memory


def test_meta_model_captures_without_allocating() -> None:
    # 4 x 16384^2 float32 weights: 4 GiB of parameters, 16 GiB with gradients and Adam state.
    model = mlp.mlp(16384, 16384, 16384, layers=4, device="meta")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    program = capture_program(model, mlp.example_inputs(batch=8, in_features=16384), mode="train", optimizer="adam")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 512 * 1024, f"capture grew the resident set by {grown_kib} KiB"
    params = sum(t.nbytes for t in program.graph.tensors if t.kind is Kind.PARAM)
    assert params == 4 * (16384 * 16384 + 16384) * F32
    assert sim.static_bytes(program.graph) == 4 * params + F32 + 8 * 16384 * F32
    with pytest.raises(CaptureError, match="meta device"):
        program.bind(model, mlp.example_inputs(batch=8, in_features=16384))


def test_gpt2_small_train_captures() -> None:
    pytest.importorskip("transformers")
    from mpplan.zoo import gpt2

    model = gpt2.gpt2("gpt2", device="meta")
    program = capture_program(model, gpt2.example_inputs(batch=4, seq_len=512), mode="train", optimizer="adam")
    _check_program(program, model, optimizer="adam")
    g = program.graph
    assert len(program.grads) == 148  # lm_head.weight is tied to transformer.wte.weight
    assert sum(t.nbytes for t in g.tensors if t.kind is Kind.PARAM) == 124_439_808 * F32
    assert {"transformer.h.11.attn", "transformer.h.0.mlp.c_fc", "lm_head"} <= {o.module for o in g.ops}
    assert g.tensor("input_ids").shape == (4, 512)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tiny_hf_gpt2_runs_op_by_op_like_eager(attention: str) -> None:
    pytest.importorskip("transformers")
    from mpplan.zoo import gpt2

    torch.manual_seed(0)
    sizes = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 16}
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0}
    model = gpt2.gpt2("gpt2", attn_implementation=attention, **sizes, **no_dropout)
    x = gpt2.example_inputs(batch=2, seq_len=16, vocab_size=100)
    eager = copy.deepcopy(model)
    program = capture_program(model, x, mode="train", optimizer="adam")
    _check_program(program, model, optimizer="adam")
    loss, *_ = _execute(program, model, x)
    reference = eager(**x).logits.float().mean()
    reference.backward()
    torch.optim.Adam(eager.parameters()).step()
    assert torch.equal(loss, reference.detach())
    for (fqn, p), (_, ref) in zip(model.named_parameters(), eager.named_parameters()):
        torch.testing.assert_close(p, ref, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------
# errors


class _Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom in forward")


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y * 2 if y.sum() > 0 else y


@pytest.mark.parametrize(
    "module, inputs, kwargs, message",
    [
        (_Raises(), (torch.randn(3, 2),), {}, "could not trace _Raises in infer mode: RuntimeError: boom in forward"),
        (_Branches(), (torch.randn(3, 2),), {}, "reads tensor values"),
        (nn.Linear(2, 2), (torch.randn(3, 5),), {"mode": "train"}, "could not trace Linear in train mode"),
        (nn.Linear(2, 2), torch.randn(3, 2), {}, r"wrap a tensor as \(x,\)"),
        (nn.Linear(2, 2), (torch.randn(3, 2), object()), {}, "'input1' has unsupported type object"),
        (nn.Linear(2, 2), (torch.randn(3, 2),), {"mode": "eval"}, "mode must be one of infer, train"),
        (nn.Linear(2, 2), (torch.randn(3, 2),), {"optimizer": "adam"}, "an optimizer needs mode='train'"),
        (nn.Linear(2, 2), (torch.randn(3, 2),), {"mode": "train", "optimizer": "lamb"}, "expected one of sgd, adam"),
        (nn.ReLU(), (torch.randn(3, 2),), {"mode": "train"}, "no parameter with requires_grad"),
        ("model", (torch.randn(3, 2),), {}, "expected a torch.nn.Module, got str"),
    ],
)
def test_capture_errors(module, inputs, kwargs, message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        capture(module, inputs, **kwargs)


def test_integer_loss_is_rejected() -> None:
    with pytest.raises(CaptureError, match="floating-point scalar"):
        capture(nn.Linear(2, 2), (torch.randn(3, 2),), mode="train", loss_fn=lambda out: (out > 0).sum())

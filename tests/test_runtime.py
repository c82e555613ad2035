"""The runtime: plans executed for real on virtual devices, measured, and checked against eager.

Every zoo model (tiny sizes) runs in infer and train mode, on one and on three
virtual devices, with and without arena.  Measured peaks, counting every storage
alive at once (results computed outside the arena included, as a CUDA allocator
counts them), must equal predictions exactly (arena: the plan's ``peak_bytes``
plus the scratch of the largest result computed outside it; no arena: its
``lower_bound_bytes``, static + LOAD) and the numerics must match eager PyTorch.  CUDA paths are marked
and skip without a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mpplan import zoo
from mpplan.capture.torch_capture import CapturedProgram, capture_program
from mpplan.config import Device, parse_config
from mpplan.errors import PlanError, VerificationError
from mpplan.graph import Graph
from mpplan.liveness import live_ranges
from mpplan.plan import Buffer, Plan
from mpplan.planner import PlannerSettings, placed_graph, plan
from mpplan.runtime import cuda_available, evaluate, evaluate_program, map_devices, run_config
from mpplan.runtime.arena import exact_rewrite, out_variant
from mpplan.runtime.eager import Snapshot
from mpplan.runtime.executor import Executor
from mpplan.runtime.measure import error_pct
from mpplan.runtime.numerics import compare, first_bad_op, grounded_in_noise
from mpplan.runtime.schedule import compile_schedule
from mpplan.runtime.trace import capture_for, meta_twin
from mpplan.runtime.tracking import StorageMeter
from mpplan.verify import verify

cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")

#: Tiny zoo models: (factory kwargs, example-input kwargs, optimizer used in train mode).
MODELS: dict[str, tuple[dict[str, Any], dict[str, Any], str | None]] = {
    "mlp": ({"in_features": 16, "hidden": 32, "out_features": 8, "layers": 3}, {"batch": 4, "in_features": 16}, "sgd"),
    "resnet": ({"blocks": (1, 1), "width": 8}, {"batch": 2, "image_size": 8}, None),
    "gpt": (
        {"vocab_size": 64, "max_seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 2},
        {"batch": 2, "seq_len": 16, "vocab_size": 64},
        "adam",
    ),
}


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@dataclasses.dataclass(frozen=True)
class Case:
    model: torch.nn.Module
    inputs: Any
    program: CapturedProgram


@pytest.fixture(scope="module")
def cases() -> dict[tuple[str, str], Case]:
    """Captures, shared by the module's tests, built lazily per (model, mode)."""
    return _Cases()


class _Cases(dict):
    def __missing__(self, key: tuple[str, str]) -> Case:
        name, mode = key
        model_kwargs, input_kwargs, optimizer = MODELS[name]
        torch.manual_seed(0)
        model = zoo.build(name, **model_kwargs)
        inputs = zoo.example_inputs(name, **input_kwargs)
        program = capture_program(model, inputs, mode=mode, optimizer=optimizer if mode == "train" else None)
        self[key] = Case(model, inputs, program)
        return self[key]


def _devices(n: int) -> list[Device]:
    return [Device(f"cuda:{i}", 1 << 30) for i in range(n)]


def _plan(case: Case, n: int) -> Plan:
    return plan(case.program.graph, _devices(n), PlannerSettings(placement="pipeline" if n > 1 else "single"))


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
@pytest.mark.parametrize("ndev", [1, 3])
@pytest.mark.parametrize("mode", ["infer", "train"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_virtual_peaks_are_exact_and_numerics_match_eager(cases, name: str, mode: str, ndev: int, arena: bool) -> None:
    case = cases[(name, mode)]
    planned = _plan(case, ndev)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=1, arena=arena,
                         devices="virtual")
    for d in m.devices:
        dp = planned.device(d.name)
        assert d.predicted_peak_bytes == (dp.peak_bytes + d.scratch_bytes if arena else dp.lower_bound_bytes)
        assert d.measured_peak_bytes == d.predicted_peak_bytes == d.counted_peak_bytes, (d.name, d)
        assert d.predicted_storage_bytes == d.predicted_peak_bytes and d.workspace_bytes == 0  # no probe on a CPU
        assert d.tracked_peak_bytes == (dp.peak_bytes if arena else dp.lower_bound_bytes)
        assert d.transient_peak_bytes == d.scratch_bytes
        assert d.error_pct == 0.0
        assert d.source == "tracked"
    assert m.exact
    assert m.numerics is not None and m.numerics.ok, m.numerics
    if not (mode == "train" and MODELS[name][2] == "adam"):
        assert m.numerics.bitwise, m.numerics  # same kernels, same order: bit for bit on CPU
    assert m.copied_bytes == planned.cross_device_bytes
    if ndev > 1:
        assert len({d.name for d in m.devices if d.measured_peak_bytes > 0}) > 1
    if not arena:
        assert m.transient_bytes == 0


@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
def test_cut_inside_attention_copies_slices_and_views_of_copies_exactly(cases, arena: bool) -> None:
    """The projection on one device, the attention on another: q, k and v are slices of the
    fused projection, copied as their own elements; in backward, the gradient's transposes
    are made on the copy.  Measured = predicted, and the numerics match eager."""
    case = cases[("gpt", "train")]
    graph = case.program.graph
    device_map = {"": "cuda:0", "blocks.0.attn": "cuda:1", "blocks.0.attn.qkv": "cuda:0"}
    planned = plan(graph, _devices(2), PlannerSettings(placement="manual", device_map=device_map))
    verify(graph, planned)
    topo = graph.topology
    root_bytes = {c.name: topo.nbytes[topo.storage_of[topo.tensor_index[c.tensor]]] for c in planned.copies}
    assert any(c.bytes < root_bytes[c.name] for c in planned.copies), "a slice is copied as its own elements"
    placed = placed_graph(graph, planned).graph
    copies = {c.name for c in planned.copies}
    assert any(t.alias_of in copies for t in placed.tensors), "a view is made on a copy"
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=1, arena=arena,
                         devices="virtual")
    assert [d.measured_peak_bytes for d in m.devices] == [d.predicted_peak_bytes for d in m.devices]
    assert m.copied_bytes == planned.cross_device_bytes
    assert m.numerics is not None and m.numerics.ok, m.numerics


def test_measurement_json(cases) -> None:
    case = cases[("gpt", "train")]
    planned = _plan(case, 2)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=2, warmup=1, devices="virtual")
    data = json.loads(json.dumps(m.to_dict()))
    assert [d["name"] for d in data["devices"]] == ["cuda:0", "cuda:1"]
    for d in data["devices"]:
        assert {"name", "predicted_peak_bytes", "measured_peak_bytes", "error_pct"} <= set(d)
    assert set(data["eager"]) >= {"devices", "step_time_s"}
    assert data["eager"]["devices"][0]["measured_peak_bytes"] > 0
    assert set(data["numerics"]) >= {"ok", "max_abs_diff", "first_bad_op"}
    assert data["step_time_s"] > 0 and len(data["step_times_s"]) == 2
    assert data["device_map"] == {"cuda:0": "cpu", "cuda:1": "cpu"}
    # The arena can only hold an op that has no out= overload by computing and copying in: reported, not hidden.
    assert data["transient_bytes"] > 0


def _clobbered(case: Case, planned: Plan) -> tuple[Plan, str, str]:
    """``planned`` with a later tensor's buffer moved onto an earlier one that is still live."""
    graph = placed_graph(case.program.graph, planned).graph
    ranges = [r for r in live_ranges(graph, range(len(graph.ops))).ranges
              if graph.tensors[r.storage].name in planned.buffers]
    pairs = [
        (b.nbytes, a, b)
        for a in ranges
        for b in ranges
        if a.first < b.first < a.last and a.nbytes >= b.nbytes > 0
    ]
    _, a, b = max(pairs, key=lambda p: (p[0], -p[2].first))
    victim, culprit = graph.tensors[a.storage].name, graph.tensors[b.storage].name
    buffers = dict(planned.buffers)
    buffers[culprit] = Buffer(buffers[culprit].device, buffers[victim].offset, buffers[culprit].bytes)
    return dataclasses.replace(planned, buffers=buffers), victim, culprit


def test_overlapping_buffers_are_caught_by_numerics_naming_the_op(cases) -> None:
    case = cases[("gpt", "train")]
    planned = _plan(case, 1)
    bad, victim, culprit = _clobbered(case, planned)
    with pytest.raises(VerificationError, match="overlap"):
        verify(case.program.graph, bad)
    m = evaluate_program(case.program, bad, case.model, case.inputs, steps=1, warmup=0, devices="virtual")
    assert m.numerics is not None and not m.numerics.ok
    assert m.numerics.first_bad_op in planned.schedule
    assert m.numerics.max_abs_diff > 0
    assert victim in m.numerics.detail and "overwritten" in m.numerics.detail
    # The reader of the clobbered tensor runs after the culprit's producer.
    graph = placed_graph(case.program.graph, planned).graph
    first_bad = planned.schedule.index(m.numerics.first_bad_op)
    producer = next(k for k, op in enumerate(graph.ops) if culprit in op.outputs)
    assert first_bad > producer


def test_the_meter_measures_tensors_not_lifetimes(cases) -> None:
    """An executor that forgets to free must measure more than the plan: peaks come from real storages."""
    case = cases[("mlp", "train")]
    planned = _plan(case, 1)
    schedule = compile_schedule(case.program, planned)
    leaky = dataclasses.replace(schedule, steps=tuple(dataclasses.replace(s, releases=()) for s in schedule.steps))
    measured = {}
    for name, sched in (("exact", schedule), ("leaky", leaky)):
        meter = StorageMeter()
        devices = map_devices(["cuda:0"], "virtual")
        Executor(sched, case.model, case.inputs, devices, arena=False, meter=meter).run_step()
        measured[name] = meter.peaks["cuda:0"]
    assert measured["exact"] == planned.devices[0].lower_bound_bytes
    assert measured["leaky"] > measured["exact"]


def test_plan_for_another_graph_is_rejected(cases) -> None:
    infer, train = cases[("mlp", "infer")], cases[("mlp", "train")]
    with pytest.raises(PlanError, match="graph hash"):
        evaluate_program(train.program, _plan(infer, 1), train.model, train.inputs, devices="virtual")


def test_evaluate_captures_and_leaves_the_model_alone() -> None:
    torch.manual_seed(0)
    model = zoo.build("mlp", in_features=8, hidden=16, out_features=4, layers=2)
    inputs = zoo.example_inputs("mlp", batch=2, in_features=8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph = capture_program(model, inputs, mode="train", optimizer="sgd").graph
    planned = plan(graph, _devices(1))
    m = evaluate(planned, model, inputs, mode="train", optimizer="sgd", steps=2, warmup=1, devices="virtual")
    assert m.exact and m.numerics is not None and m.numerics.bitwise
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_run_config_end_to_end(tmp_path) -> None:
    config = parse_config(
        {
            "model": {
                "torch": {
                    "factory": "mpplan.zoo.transformer:gpt",
                    "kwargs": {"vocab_size": 64, "max_seq_len": 8, "d_model": 16, "n_heads": 2, "n_layers": 1},
                    "inputs": [{"shape": ["batch", "seq"], "dtype": "int64", "high": 64}],
                    "mode": "train",
                    "optimizer": "adam",
                }
            },
            "workload": {"batch": 2, "seq": 8},
            "devices": [{"count": 2, "capacity": "64MiB", "kind": "cuda"}],
        },
        str(tmp_path / "run.yaml"),
    )
    result = run_config(config, steps=1, warmup=1, devices="virtual")
    assert result.measurement.exact and result.measurement.numerics.ok
    data = result.measurement.to_dict()
    assert [d["name"] for d in data["devices"]] == ["cuda:0", "cuda:1"]
    assert data["graph_hash"] == result.plan.graph_hash == result.graph.content_hash


def test_config_without_torch_model_cannot_run(tmp_path) -> None:
    config = parse_config(
        {"model": {"synthetic": {"kind": "chain", "n": 4}}, "devices": [{"name": "cuda:0", "capacity": "1GiB"}]},
        str(tmp_path / "s.yaml"),
    )
    with pytest.raises(Exception, match="model.torch"):
        run_config(config, devices="virtual")


def test_device_mapping() -> None:
    virtual = map_devices(["a", "b"], "virtual")
    assert virtual.virtual and virtual.to_dict() == {"a": "cpu", "b": "cpu"}
    assert map_devices(["a", "b"], {"a": "cpu", "b": "cpu"}).sharing("a") == ("a", "b")
    with pytest.raises(PlanError, match="expected 2"):
        map_devices(["a", "b"], ["cpu"])
    with pytest.raises(PlanError, match="no torch device"):
        map_devices(["a", "b"], {"a": "cpu"})
    if not cuda_available():
        assert map_devices(["a"]).virtual
        with pytest.raises(PlanError, match="CUDA"):
            map_devices(["a"], "cuda")


def test_out_variants_match_their_functional_ops() -> None:
    aten = torch.ops.aten
    assert out_variant(aten.mm.default).out_names == ("out",)
    assert out_variant(aten.native_layer_norm.default).out_names == ("out0", "out1", "out2")
    assert out_variant(aten.arange.default) is not None  # factory options come from out
    assert out_variant(aten.view.default) is None  # a view allocates nothing
    # cudnn_batch_norm.out crashed every zoo_resnet arena run on an H100 (torch 2.11): computed and copied in.
    assert out_variant(aten.cudnn_batch_norm.default) is None
    assert out_variant(aten.native_batch_norm.default) is not None
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    out = torch.empty(3, 5)
    variant = out_variant(aten.mm.default)
    assert variant.call((a, b), {}, (out,)) is out and torch.equal(out, aten.mm.default(a, b))
    assert not variant.generated
    # Codegen's out= overloads compute into a hidden temporary: the executor computes and copies in itself.
    assert out_variant(aten.native_layer_norm.default).generated
    # A Scalar overload writes through the Tensor overload's real out=, the scalar wrapped as ATen does.
    scaled = out_variant(aten.add.Scalar)
    assert scaled.overload is aten.add.out and not scaled.generated
    x = torch.randn(7)
    assert torch.equal(scaled.call((x, 2.5, 3), {}, (torch.empty(7),)), aten.add.Scalar(x, 2.5, 3))
    ints = torch.arange(7)
    halves = out_variant(aten.div.Scalar).call((ints, 2.0), {}, (torch.empty(7),))
    assert torch.equal(halves, aten.div.Scalar(ints, 2.0))


def test_meter_counts_each_storage_once_until_it_dies() -> None:
    meter = StorageMeter("d")
    base = torch.zeros(100)
    meter.register([base, base[10:], base.view(10, 10)])
    meter.sample()
    assert meter.peaks == {"d": 400}
    other = torch.zeros(10)
    meter.register(other, "e", transient=True)
    meter.sample()
    assert meter.transient_peaks["e"] == 40
    del base
    meter.reset_peaks()
    assert meter.peaks.get("d", 0) == 0


def test_meter_sees_a_storage_die_without_polling_and_keeps_it_apart_from_a_successor() -> None:
    """Regression (issue 14, a segfault inside ``register`` on a GPU): the registry follows storages by
    ordinary weak references, so a death is booked when it happens, and a new storage at a reused
    address is a new entry."""
    meter = StorageMeter("d")
    for _ in range(50):
        t = torch.empty(25)
        assert meter.register(t) == 100
        assert meter.live_bytes("d") == 100
        view = t[5:]
        del t
        assert meter.live_bytes("d") == 100  # a view keeps the storage alive
        del view
        assert meter.live_bytes("d") == 0
    meter.register([torch.empty(0), torch.empty(3, device="meta")])
    assert meter.live_bytes("d") == 0


def test_transients_are_counted_with_everything_alive_and_predicted(cases) -> None:
    """Regression (issue 14): results computed outside the arena and copied in are memory a CUDA
    allocator holds next to the arena.  The virtual device counts them, so the measured peak is
    above the plan's arena peak by exactly the largest of them, and the prediction says so before
    the run from the traced kernels."""
    case = cases[("gpt", "train")]
    planned = _plan(case, 1)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=1, devices="virtual")
    (d,) = m.devices
    assert d.scratch_bytes > 0 and d.transient_peak_bytes == d.scratch_bytes
    assert d.tracked_peak_bytes == planned.devices[0].peak_bytes
    assert d.measured_peak_bytes == d.counted_peak_bytes == planned.devices[0].peak_bytes + d.scratch_bytes
    assert d.measured_peak_bytes == d.predicted_peak_bytes
    assert m.transient_bytes >= d.scratch_bytes
    # Without an arena every result is its own allocation: nothing is transient.
    bare = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=0, arena=False,
                            devices="virtual", eager=False)
    assert bare.devices[0].transient_peak_bytes == bare.devices[0].scratch_bytes == 0


def test_exact_rewrites_write_the_same_bits_into_planned_memory() -> None:
    aten = torch.ops.aten
    x = torch.tensor([[-1.0, -0.0, 0.0, float("nan")], [float("inf"), -float("inf"), 2.5, 1e-30]]).t()
    out = torch.empty(4, 2)
    assert exact_rewrite(aten.relu.default)((x,), {}, out) is out
    assert torch.equal(out.nan_to_num(7.0), aten.relu.default(x).nan_to_num(7.0))
    assert torch.equal(out.view(torch.int32), aten.relu.default(x).contiguous().view(torch.int32))  # signs of zeros
    ones = torch.empty(4, 2)
    assert torch.equal(exact_rewrite(aten.ones_like.default)((x,), {}, ones), aten.ones_like.default(x))
    weight, indices = torch.randn(10, 3), torch.tensor([[1, 9, 0], [4, 4, 2]])
    emb = torch.empty(2, 3, 3)
    assert torch.equal(exact_rewrite(aten.embedding.default)((weight, indices), {}, emb),
                       aten.embedding.default(weight, indices))
    grad, many = torch.randn(4, 50, 3), torch.randint(0, 6, (4, 50))  # repeated indices: order of additions matters
    for padding_idx in (-1, 2):
        expected = aten.embedding_dense_backward.default(grad, many, 10, padding_idx, False)
        got = exact_rewrite(aten.embedding_dense_backward.default)((grad, many, 10, padding_idx, False), {},
                                                                    torch.full((10, 3), float("nan")))
        assert torch.equal(got, expected)
    assert exact_rewrite(aten.embedding_dense_backward.default, "cuda") is None  # atomics there: not the same bits
    # Outside what it reproduces, a rewrite declines and the executor computes and copies in.
    assert exact_rewrite(aten.embedding.default)((weight, indices, -1, True), {}, emb) is None
    assert exact_rewrite(aten.native_layer_norm.default) is None


def test_ops_with_a_rewrite_hold_no_transient(cases) -> None:
    """The MLP's relu and the loss seed's ones_like have only generated out= overloads: rewritten,
    they write into the arena, and the run needs no scratch."""
    case = cases[("mlp", "train")]
    planned = _plan(case, 1)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=1, devices="virtual")
    assert m.transient_bytes == 0 and m.devices[0].scratch_bytes == 0
    assert m.devices[0].measured_peak_bytes == planned.devices[0].peak_bytes
    assert m.numerics is not None and m.numerics.bitwise


def test_copies_between_different_torch_devices(cases) -> None:
    """A copy reads its source where it lives, whatever the op it feeds runs on: the cross-device
    path of two GPUs, exercised here with CPU and meta as the two torch devices (infer mode: data
    only flows from the CPU to meta)."""
    from types import MappingProxyType

    from mpplan.runtime.devices import DeviceMap

    case = cases[("mlp", "infer")]
    planned = _plan(case, 2)
    two_kinds = DeviceMap(MappingProxyType({"cuda:0": "cpu", "cuda:1": "meta"}))
    schedule = compile_schedule(case.program, planned)
    for arena in (True, False):
        values = Executor(schedule, case.model, case.inputs, two_kinds, arena=arena).run_step()
        assert values.copied_bytes == planned.cross_device_bytes > 0
        assert [o.device.type for o in values.outputs] == ["meta"]


def test_meta_twin_traces_the_same_graph(cases) -> None:
    case = cases[("mlp", "train")]
    twin = meta_twin(case.model)
    assert all(p.device.type == "meta" for p in twin.parameters())
    assert all(p.device.type == "cpu" for p in case.model.parameters())
    program = capture_for(twin, case.inputs, torch.device("cpu"), mode="train", optimizer="sgd", loss_fn=None)
    assert program.graph.content_hash == case.program.graph.content_hash


# ---- CUDA (run on a GPU machine; skipped here) --------------------------------------------------
#
# What a GPU measures: per planned device with a GPU to itself, max_memory_allocated over the timed
# steps less what the GPU held before the run (cuBLAS workspaces are created first, on purpose).
# Counted live bytes (transients included) stay exact against the prediction (plan peak + scratch), up
# to scalars a kernel leaves in host memory; the allocator adds 512-byte rounding and kernels' own
# scratch memory, which no dispatch-level meter sees.

#: The zoo GPT of configs/zoo_gpt.yaml (about 52 MiB planned): big enough that allocator rounding and
#: kernel scratch are small next to the plan, which the 5 % target needs.
GPT_BIG = ({"vocab_size": 1024, "max_seq_len": 128, "d_model": 128, "n_heads": 4, "n_layers": 4},
           {"batch": 8, "seq_len": 128, "vocab_size": 1024})


def _cuda_case(ndev: int, size: tuple[dict[str, Any], dict[str, Any]] | None = None) -> tuple[Case, Plan]:
    """The zoo GPT (tiny unless ``size``) traced for CUDA kernels (attention lowers differently than on CPU) and
    planned."""
    model_kwargs, input_kwargs = size or MODELS["gpt"][:2]
    torch.manual_seed(0)
    model = zoo.build("gpt", **model_kwargs)
    inputs = zoo.example_inputs("gpt", **input_kwargs)
    program = capture_for(model, inputs, torch.device("cuda:0"), mode="train", optimizer="adam", loss_fn=None)
    case = Case(model, inputs, program)
    return case, _plan(case, ndev)


def _allocator_report(m: Any) -> str:
    """Every device's numbers, for assertion messages (the GPU session records them)."""
    return json.dumps({"devices": [dataclasses.asdict(d) for d in m.devices],
                       "eager": None if m.eager is None else m.eager.to_dict()}, default=str)


@cuda
@needs_cuda
@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
def test_cuda_single_gpu(arena: bool) -> None:
    case, planned = _cuda_case(1)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=2, warmup=1, arena=arena,
                         devices=["cuda:0"])
    (d,) = m.devices
    assert d.torch_device == "cuda:0" and d.source == "allocator"
    assert d.allocator_peak_bytes is not None and d.reserved_peak_bytes is not None
    assert d.allocator_base_bytes is not None
    assert d.measured_peak_bytes == d.allocator_peak_bytes - d.allocator_base_bytes
    assert d.reserved_peak_bytes >= d.allocator_peak_bytes
    # Live storages: exact up to scalars a GPU kernel keeps in host memory (attention's RNG seed and offset).
    assert abs(d.counted_peak_bytes - d.predicted_storage_bytes) <= 64, _allocator_report(m)
    assert d.measured_peak_bytes >= d.counted_peak_bytes, _allocator_report(m)  # rounding, kernels' scratch
    assert m.numerics is not None and m.numerics.ok, m.numerics
    assert m.eager is not None and m.eager.devices[0].source == "allocator"
    assert m.step_time_s > 0 and m.eager.step_time_s > 0


@cuda
@needs_cuda
def test_cuda_evaluate_traces_for_the_gpu() -> None:
    case, planned = _cuda_case(1)
    m = evaluate(planned, case.model, case.inputs, mode="train", optimizer=MODELS["gpt"][2], steps=1, warmup=1,
                 devices=["cuda:0"])
    assert m.numerics is not None and m.numerics.ok, m.numerics


@cuda
@needs_cuda
def test_cuda_two_planned_devices_on_one_gpu() -> None:
    case, planned = _cuda_case(2)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=2, warmup=1,
                         devices={"cuda:0": "cuda:0", "cuda:1": "cuda:0"})
    assert m.device_map == {"cuda:0": "cuda:0", "cuda:1": "cuda:0"}
    for d in m.devices:
        # The allocator cannot tell the two apart: each is measured by its tracked live bytes, and says so.
        assert d.source == "tracked (shared GPU)" and d.measured_peak_bytes == d.counted_peak_bytes
        assert d.shared_with == tuple(n for n in ("cuda:0", "cuda:1") if n != d.name)
        assert abs(d.measured_peak_bytes - d.predicted_peak_bytes) <= 64, _allocator_report(m)
        assert d.allocator_peak_bytes is not None
    # The GPU's own number is both devices' together: in arena mode both arenas and all static
    # tensors are resident the whole time, so it can only be more than the two predictions summed.
    first = m.devices[0]
    assert first.allocator_peak_bytes - first.allocator_base_bytes >= sum(d.predicted_peak_bytes for d in m.devices)
    assert m.numerics is not None and m.numerics.ok, m.numerics


@cuda
@pytest.mark.skipif(not cuda_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
def test_cuda_multi_gpu(arena: bool) -> None:
    case, planned = _cuda_case(2)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=2, warmup=1, arena=arena, devices="cuda")
    assert [d.torch_device for d in m.devices] == ["cuda:0", "cuda:1"]
    for d in m.devices:
        assert d.source == "allocator", _allocator_report(m)
        assert abs(d.counted_peak_bytes - d.predicted_storage_bytes) <= 64, _allocator_report(m)
        assert d.measured_peak_bytes >= d.counted_peak_bytes, _allocator_report(m)
    assert m.copied_bytes == planned.cross_device_bytes
    assert m.numerics is not None and m.numerics.ok, m.numerics


@cuda
@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize("ndev", [1, 2], ids=["one-gpu", "two-gpus"])
@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
def test_cuda_measured_within_two_percent_of_predicted(arena: bool, ndev: int) -> None:
    """Issue 14's GPU target, per device: measured max_memory_allocated (less the base) within 2 %
    of the prediction (plan peak + scratch) with the arena.  Without it the allocator hands out
    whole cached blocks (up to 1 MiB over the request), so the target is held by the requested bytes
    there."""
    if torch.cuda.device_count() < ndev:
        pytest.skip(f"needs {ndev} CUDA devices")
    case, planned = _cuda_case(ndev, GPT_BIG)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=3, warmup=1, arena=arena,
                         devices="cuda")
    report = _allocator_report(m)
    for d in m.devices:
        assert d.source == "allocator", report
        assert abs(d.counted_peak_bytes - d.predicted_storage_bytes) <= 1024, report
        if arena:
            assert abs(d.error_pct) <= 2.0, report
        elif d.requested_peak_bytes is not None:
            assert abs(error_pct(d.predicted_peak_bytes, d.requested_peak_bytes)) <= 2.0, report
    assert m.numerics is not None and m.numerics.ok, m.numerics


@cuda
@needs_cuda
def test_cuda_eager_baseline_counts_the_model_like_the_plan() -> None:
    """Eager runs on the same GPU, measured from the same base: its parameters, gradients, Adam state
    and inputs are in its peak, as the plan's static bytes are in the plan's."""
    case, planned = _cuda_case(1)
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=2, warmup=1, devices=["cuda:0"])
    assert m.eager is not None
    (eager,) = m.eager.devices
    assert eager.name == "cuda:0" and eager.source == "allocator"
    assert eager.allocator_base_bytes is not None
    assert eager.measured_peak_bytes == eager.allocator_peak_bytes - eager.allocator_base_bytes
    param_bytes = sum(p.numel() * p.element_size() for p in case.model.parameters())
    input_bytes = sum(x.numel() * x.element_size() for x in case.inputs)
    # Parameters, their gradients and two Adam moments are all alive at the end of backward.
    assert eager.measured_peak_bytes >= 4 * param_bytes + input_bytes, _allocator_report(m)
    assert eager.tracked_peak_bytes >= 4 * param_bytes + input_bytes


@cuda
@needs_cuda
def test_cuda_overlapping_buffers_are_caught_by_numerics() -> None:
    """A wrong offset on a GPU is found like on CPU, although GPU kernels are compared with a tolerance."""
    case, planned = _cuda_case(1)
    bad, victim, _culprit = _clobbered(case, planned)
    m = evaluate_program(case.program, bad, case.model, case.inputs, steps=1, warmup=0, devices=["cuda:0"])
    assert m.numerics is not None and not m.numerics.ok
    assert m.numerics.first_bad_op in planned.schedule
    assert victim in m.numerics.detail and "overwritten" in m.numerics.detail


@cuda
@needs_cuda
def test_cuda_run_config_reports_the_gpu_traced_graph(tmp_path) -> None:
    """``mpplan run`` on a GPU: the report uses the graph the plan was made for (traced for the GPU)."""
    from mpplan.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({
        "model": {"torch": {"factory": "mpplan.zoo.transformer:gpt",
                            "kwargs": {"vocab_size": 64, "max_seq_len": 16, "d_model": 32, "n_heads": 2, "n_layers": 1},
                            "inputs": [{"shape": ["batch", "seq"], "dtype": "int64", "high": 64}],
                            "mode": "train", "optimizer": "adam"}},
        "workload": {"batch": 2, "seq": 16},
        "devices": [{"name": "cuda:0", "capacity": "1GiB"}],
    }))
    assert main(["-q", "run", str(config), "--out", str(tmp_path / "out"), "--steps", "1", "--warmup", "1"]) == 0
    data = json.loads((tmp_path / "out" / "measurement.json").read_text())
    assert data["device_map"] == {"cuda:0": "cuda:0"}
    assert data["devices"][0]["source"] == "allocator"
    assert (tmp_path / "out" / "timeline.json").is_file()


@cuda
@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
@pytest.mark.parametrize("config", ["zoo_mlp", "zoo_resnet", "zoo_gpt"])
def test_cuda_every_zoo_config_runs_and_matches_eager(config: str, arena: bool) -> None:
    """Issue 14: ``mpplan run configs/zoo_resnet.yaml`` ended in a SIGSEGV in arena mode and failed
    its numerics (Adam, 4.3e-5) without.  Isolated, a crash is a MeasurementCrash with its stack."""
    from pathlib import Path

    from mpplan.config import load_config

    root = Path(__file__).resolve().parents[1]
    result = run_config(load_config(root / "configs" / f"{config}.yaml"), arena=arena, steps=2, warmup=1,
                        devices=["cuda:0"])
    m = result.measurement
    report = _allocator_report(m)
    assert m.numerics is not None and m.numerics.ok, (m.numerics, report)
    (d,) = m.devices
    assert abs(d.counted_peak_bytes - d.predicted_storage_bytes) <= 1024, report


@pytest.mark.parametrize("ndev", [1, 2])
@pytest.mark.parametrize(("name", "policy"), [("gpt", "sqrt"), ("gpt", "mirror"), ("gpt", "budget"), ("mlp", "sqrt"),
                                              ("mlp", "mirror")])
def test_rematerialised_plans_run_exactly(cases, name: str, ndev: int, policy: str) -> None:
    """Recompute ops rerun their fx node; measured peaks equal the plan's and gradients match eager."""
    case = cases[(name, "train")]
    settings = PlannerSettings(
        placement="pipeline" if ndev > 1 else "single",
        # Static gradients: with dynamic ones no recompute takes the tiny GPT under 0.9 of its peak.
        grads="static",
        remat=policy,
        remat_threshold=1 << 40 if policy == "mirror" else None,
        remat_budget=(0.9 if ndev == 1 else 0.5) if policy == "budget" else None,  # the budget bounds each device
        remat_solver="heuristic",
    )
    planned = plan(case.program.graph, _devices(ndev), settings)  # the tiny MLP fits no budget below its peak
    assert planned.remat, "the policy recomputed nothing"
    assert planned.compute_overhead > 0
    verify(case.program.graph, planned)
    baseline = plan(case.program.graph, _devices(ndev), dataclasses.replace(settings, remat="none"))
    assert planned.max_peak_bytes <= baseline.max_peak_bytes
    for arena in (True, False):
        m = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=0, arena=arena,
                             devices="virtual")
        assert m.exact, [(d.name, d.predicted_peak_bytes, d.measured_peak_bytes) for d in m.devices]
        assert m.numerics is not None and m.numerics.ok, m.numerics


def test_a_recompute_run_while_its_original_lives_keeps_both_apart(cases) -> None:
    """A recompute keeps its results under env keys of its own: moved right after its
    original, late readers still read the recompute and the original is freed on time."""
    case = cases[("mlp", "train")]
    planned = plan(case.program.graph, _devices(1), PlannerSettings(placement="single", remat="sqrt"))
    record = planned.remat[0]
    schedule = list(planned.schedule)
    schedule.remove(record["recompute_op"])
    schedule.insert(schedule.index(record["op"]) + 1, record["recompute_op"])
    early = dataclasses.replace(planned, schedule=tuple(schedule))
    m = evaluate_program(case.program, early, case.model, case.inputs, steps=1, warmup=0, arena=False,
                         devices="virtual")
    assert m.numerics is not None and m.numerics.ok and m.numerics.bitwise, m.numerics
    # Both copies were alive together, so the run needed more than the plan's own order.
    assert m.devices[0].measured_peak_bytes >= planned.devices[0].lower_bound_bytes


@pytest.mark.parametrize("ndev", [1, 3])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_grads_plan_is_never_worse_than_eager(cases, name: str, ndev: int) -> None:
    """``planner.grads: dynamic`` holds each parameter's gradient the way eager PyTorch holds
    ``.grad`` (from backward to the end of the step): the planned peak, measured exactly, is then
    no worse than eager's own, where static gradients cost every model its gradient bytes."""
    case = cases[(name, "train")]
    graph = case.program.graph
    settings = PlannerSettings(placement="pipeline" if ndev > 1 else "single", grads="dynamic", alignment=8)
    planned = plan(graph, _devices(ndev), settings)
    verify(graph, planned)
    static = plan(graph, _devices(ndev), dataclasses.replace(settings, grads="static"))
    grad_bytes = sum(t.nbytes for t in graph.tensors if t.grad_of is not None)
    assert sum(d.static_bytes for d in planned.devices) == sum(d.static_bytes for d in static.devices) - grad_bytes
    m = evaluate_program(case.program, planned, case.model, case.inputs, steps=1, warmup=1, devices="virtual")
    for d in m.devices:
        assert d.measured_peak_bytes == d.predicted_peak_bytes == planned.device(d.name).peak_bytes + d.scratch_bytes
    assert m.numerics is not None and m.numerics.ok, m.numerics
    if ndev == 1:
        (eager,) = m.eager.devices
        assert planned.max_peak_bytes <= eager.measured_peak_bytes < static.max_peak_bytes


def test_verifier_holds_a_plan_to_its_own_gradient_model(cases) -> None:
    """A dynamic-gradient plan relabelled static is wrong: its gradients then have buffers
    (static tensors must not) and its static bytes are short."""
    graph = cases[("gpt", "train")].program.graph
    planned = plan(graph, _devices(1), PlannerSettings(grads="dynamic", alignment=1))
    verify(graph, planned)
    relabelled = dataclasses.replace(planned, settings={**planned.settings, "grads": "static"})
    with pytest.raises(VerificationError):
        verify(graph, relabelled)


def test_a_crash_in_a_measurement_becomes_an_error_with_the_stack() -> None:
    """Regression (issue 14, a SIGSEGV on a GPU took ``mpplan run`` down): the measurement runs in a
    child process; a fatal signal there is a ``MeasurementCrash`` naming it, with the child's stack."""
    import ctypes

    from mpplan.runtime.isolate import MeasurementCrash, run_isolated

    with pytest.raises(MeasurementCrash, match="SIGSEGV") as caught:
        run_isolated(ctypes.string_at, 0, what="reading address 0")  # a segfault in C code
    assert caught.value.signal == "SIGSEGV" and "string_at" in caught.value.stack
    assert caught.value.exit_code == 4
    with pytest.raises(ZeroDivisionError):
        run_isolated(divmod, 1, 0)


def test_run_config_isolated_gives_what_the_in_process_run_gives(tmp_path) -> None:
    config = parse_config({
        "model": {"torch": {"factory": "mpplan.zoo.mlp:mlp",
                            "kwargs": {"in_features": 8, "hidden": 16, "out_features": 4},
                            "inputs": [{"shape": ["batch", 8], "dtype": "float32"}],
                            "mode": "train", "optimizer": "sgd"}},
        "workload": {"batch": 4},
        "devices": [{"name": "cuda:0", "capacity": "1GiB"}],
    }, str(tmp_path / "c.yaml"))
    inside = run_config(config, steps=1, warmup=0, isolate=False, eager=False)
    isolated = run_config(config, steps=1, warmup=0, eager=False)
    assert isolated.plan.schedule == inside.plan.schedule and isolated.plan.buffers == inside.plan.buffers
    assert isolated.measurement.devices[0].measured_peak_bytes == inside.measurement.devices[0].measured_peak_bytes


class _Jitter(TorchDispatchMode):
    """Fault injection: perturbs the results of ``ops`` by ``scale`` (relative), drawing from its own generator.

    Small, different each call: a non-deterministic GPU kernel; large: a wrong kernel.  It acts
    only while ``active`` is true (to hit one run of several in lock step)."""

    def __init__(self, ops: tuple[Any, ...], scale: float) -> None:
        super().__init__()
        self.ops, self.scale = ops, scale
        self.generator = torch.Generator().manual_seed(1234)
        self.active = True
        self.hits = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        hit = self.active and func.overloadpacket in self.ops
        if hit and isinstance(out, torch.Tensor) and out.is_floating_point():
            out.mul_(1 + self.scale * torch.randn(out.shape, generator=self.generator, dtype=out.dtype))
            self.hits += 1
        return out


def _lockstep(case: Case, planned: Plan, mode: TorchDispatchMode | None = None) -> tuple[str | None, str]:
    schedule = compile_schedule(case.program, planned)
    device_map = map_devices([d.name for d in planned.devices], "virtual")
    runs = [Executor(schedule, case.model, case.inputs, device_map, arena=arena) for arena in (True, False, False)]
    with mode if mode is not None else contextlib.nullcontext():
        return first_bad_op(runs[0], (runs[1], runs[2]), seed=0)


def test_noisy_kernels_do_not_hide_the_victim_of_overlapping_buffers(cases) -> None:
    """Regression (issue 14: on the H100 numerics blamed the attention, not the victim ``addmm_2``).
    Every matrix product is made non-deterministic (relative noise 1e-6, as GPU reductions are):
    the lock-step check still names the op reading the overwritten tensor, and the victim; a
    correct plan under the same noise is found clean."""
    case = cases[("gpt", "train")]
    planned = _plan(case, 1)
    bad, victim, _culprit = _clobbered(case, planned)
    products = (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm)
    jitter = _Jitter(products, 1e-6)
    op, why = _lockstep(case, bad, jitter)
    assert jitter.hits > 0
    assert op in planned.schedule and victim in why and "overwritten" in why, why
    clean, why = _lockstep(case, planned, _Jitter(products, 1e-6))
    assert clean is None, why


def test_a_kernel_computing_wrongly_is_blamed_when_its_error_spreads(cases) -> None:
    """A result that differs while the op's inputs agree makes the op a suspect; when a reader of it
    computes differently too, the suspect is named (not the reader)."""
    case = cases[("mlp", "train")]
    planned = _plan(case, 1)
    schedule = compile_schedule(case.program, planned)
    device_map = map_devices(["cuda:0"], "virtual")
    runs = [Executor(schedule, case.model, case.inputs, device_map, arena=arena) for arena in (True, False, False)]
    wrong = _Jitter((torch.ops.aten.addmm,), 0.5)
    first = next(s for s in schedule.steps if s.func is torch.ops.aten.addmm.default)
    with wrong:
        op, why = _first_bad_with_fault(runs, first.index, wrong)
    assert wrong.hits == 1
    assert op == first.op and "then computed" in why, why


def _first_bad_with_fault(runs: list[Executor], index: int, fault: _Jitter) -> tuple[str | None, str]:
    """``first_bad_op`` with ``fault`` active only while the planned run executes step ``index``."""
    planned = runs[0]
    original = planned.iter_step

    def faulty(*, observe: bool) -> Any:
        gen = original(observe=observe)
        trace = None
        while True:
            fault.active = trace is not None and trace.step.index == index - 1
            try:
                trace = gen.send(None)
            except StopIteration as stop:
                fault.active = False
                return stop.value
            fault.active = False
            yield trace

    planned.iter_step = faulty  # type: ignore[method-assign]
    return first_bad_op(planned, (runs[1], runs[2]), seed=0)


def test_eager_noise_grounds_the_tolerance() -> None:
    """Planned vs eager beyond the dtype tolerance, but within what eager differs from itself: ok."""
    base = torch.full((4,), 1e-3)
    eager = Snapshot((base,), {}, {})
    again = Snapshot((base + 2e-5,), {}, {})
    planned = Snapshot((base + 3e-5,), {}, {})
    assert not compare(planned, eager).ok
    grounded = compare(planned, eager, again)
    assert grounded.ok and grounded.noise == pytest.approx(2e-5, rel=1e-3)
    wrong = compare(Snapshot((base + 1e-3,), {}, {}), eager, again)
    assert not wrong.ok and "noise" in wrong.detail
    assert compare(eager, eager, eager).noise == 0.0
    # One pair of runs that happened to agree closely is one sample of the noise: more runs, the largest counts.
    close = Snapshot((base + 1e-7,), {}, {})
    assert not compare(planned, eager, close).ok
    several = compare(planned, eager, (close, again))
    assert several.ok and several.noise == pytest.approx(2e-5, rel=1e-3)
    assert not compare(Snapshot((base + 1e-3,), {}, {}), eager, (close, again)).ok


def test_eager_is_run_again_while_its_runs_differ_and_the_numerics_disagree() -> None:
    """Another eager step while the comparison fails and eager's runs differ at all; one where they agree."""
    base = torch.full((4,), 1e-3)
    eager, planned = Snapshot((base,), {}, {}), Snapshot((base + 3e-5,), {}, {})
    runs = iter([Snapshot((base + 1e-7,), {}, {}), Snapshot((base + 2e-5,), {}, {}), Snapshot((base,), {}, {})])
    made = []

    def eager_again() -> Snapshot:
        made.append(next(runs))
        return made[-1]

    assert grounded_in_noise(planned, eager, eager_again).ok and len(made) == 2
    made.clear()
    assert not grounded_in_noise(planned, eager, lambda: eager).ok  # bit for bit (a CPU): one run, no more
    assert not grounded_in_noise(Snapshot((base + 1e-3,), {}, {}), eager, eager_again, runs=2).ok


class _Replayed:
    """A run for ``first_bad_op`` that replays fixed traces: (op, reads, writes) per step."""

    def __init__(self, steps: list[tuple[str, dict[str, torch.Tensor], dict[str, torch.Tensor]]]) -> None:
        self.steps = steps
        empty = Graph("replayed", (), ())
        self.program = SimpleNamespace(graph=empty, node_tensors={})  # for the blame's wording: no IR tensors

    def iter_step(self, *, observe: bool):
        for op, reads, writes in self.steps:
            yield SimpleNamespace(step=SimpleNamespace(op=op, device="cpu"), reads=reads, writes=writes)


def test_results_of_noisy_inputs_may_round_differently() -> None:
    """Where the references read different values, their results agreeing bit for bit is rounding's luck: a
    planned result one float32 step away is noise, not a fault (seen on a CPU where the arena's alignment
    changed Adam's last bit under noisy products).  An op reading the same bits in every run still must
    compute the same bits, and a difference beyond the dtype's tolerance is still blamed."""
    x = torch.tensor([1.0, 2.0])
    y = torch.tensor([0.25, 0.5])
    near = torch.nextafter(y, torch.tensor(1.0))
    noisy = [{"x": x}, {"x": x * (1 + 1e-7)}, {"x": x * (1 - 1e-7)}]

    def runs(reads: list[dict[str, torch.Tensor]], mine: torch.Tensor) -> tuple[Any, Any, Any]:
        """``adam`` reads ``x`` and writes ``y`` (``mine`` in the planned run); ``next`` reads ``y``."""
        return tuple(_Replayed([("adam", r, {"y": w}), ("next", {"y": w}, {})])  # type: ignore[return-value]
                     for r, w in zip(reads, (mine, y, y)))

    planned, *refs = runs(noisy, near)
    assert first_bad_op(planned, tuple(refs), seed=0)[0] is None  # type: ignore[arg-type]
    planned, *refs = runs([{"x": x}] * 3, near)
    assert first_bad_op(planned, tuple(refs), seed=0)[0] == "adam"  # type: ignore[arg-type]
    planned, *refs = runs(noisy, y * 1.01)
    assert first_bad_op(planned, tuple(refs), seed=0)[0] == "adam"  # type: ignore[arg-type]

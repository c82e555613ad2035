"""Issue 14: what arena mode holds outside the arena is in the plan, and the plan's own peak is what runs.

An op with no real ``out=`` overload (layer norm, attention, convolution on CPU)
computes its results outside the arena and copies them in; while it does, the
device holds the whole arena plus those results.  ``plan_with_scratch`` puts that
in the plan (``plan.scratch`` per op, ``scratch_bytes`` per device, counted in the
peak), the verifier checks it, and a run in arena mode measures the plan's own peak.
"""

from __future__ import annotations

import dataclasses

import pytest
from conftest import chain, device

from mpplan.errors import VerificationError
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify

torch = pytest.importorskip("torch")

from mpplan import zoo  # noqa: E402
from mpplan.capture.torch_capture import capture_program  # noqa: E402
from mpplan.runtime import evaluate_program  # noqa: E402
from mpplan.runtime.scratch import plan_with_scratch, with_scratch  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_scratch_in_a_plan_of_a_tiny_graph_is_counted_and_verified() -> None:
    graph = chain(4)
    base = plan(graph, [device()], PlannerSettings(alignment=1))
    ops = base.schedule
    planned = with_scratch(base, {ops[1]: 100, ops[2]: 40, ops[3]: 0})
    (d,) = planned.devices
    assert planned.scratch == {ops[1]: 100, ops[2]: 40}
    assert d.scratch_bytes == 100 and d.peak_bytes == base.devices[0].peak_bytes + 100 == planned.max_peak_bytes
    verify(graph, planned)
    assert Plan.from_dict(planned.to_dict()) == planned
    # A plan without scratch writes none, and one read from an older plan.json has none.
    assert "scratch" not in base.to_dict() and "scratch_bytes" not in base.to_dict()["devices"][0]
    assert Plan.from_dict(base.to_dict()) == base
    # Replacing the scratch replaces it; scratch cannot be negative or on an op the plan lacks.
    assert with_scratch(planned, {}).devices == base.devices
    with pytest.raises(ValueError):
        with_scratch(base, {ops[0]: -1})
    with pytest.raises(ValueError, match="not placed"):
        with_scratch(dataclasses.replace(base, devices=base.devices * 2), {"nowhere": 1})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p, d: dataclasses.replace(p, devices=(dataclasses.replace(d, peak_bytes=d.peak_bytes - 100),),
                                          max_peak_bytes=d.peak_bytes - 100), "peak_bytes"),
        (lambda p, d: dataclasses.replace(
            p, devices=(dataclasses.replace(d, scratch_bytes=40, peak_bytes=d.peak_bytes - 60),),
            max_peak_bytes=d.peak_bytes - 60), "scratch_bytes 40"),
        (lambda p, d: dataclasses.replace(p, scratch={**p.scratch, "no_such_op": 1}), "not an op"),
        (lambda p, d: dataclasses.replace(p, scratch={**p.scratch, p.schedule[0]: -5}), "expected >= 0"),
    ],
    ids=["peak-without-scratch", "scratch-below-its-largest-op", "unknown-op", "negative"],
)
def test_verifier_holds_a_plan_to_its_scratch(edit, message: str) -> None:
    graph = chain(4)
    planned = with_scratch(plan(graph, [device()], PlannerSettings(alignment=1)), {graph.ops[1].name: 100})
    with pytest.raises(VerificationError, match=message):
        verify(graph, edit(planned, planned.devices[0]))


def test_arena_run_measures_the_plans_own_peak_on_a_zoo_model() -> None:
    """Regression (issue 14): the zoo GPT's layer norms and attention compute outside the arena.  The plan
    made for the run with the single-block arena counts that, so its own peak is what the virtual device
    measures; the plan the planner alone makes is short by exactly that scratch."""
    torch.manual_seed(0)
    model = zoo.build("gpt", vocab_size=64, max_seq_len=16, d_model=32, n_heads=2, n_layers=2)
    inputs = zoo.example_inputs("gpt", batch=2, seq_len=16, vocab_size=64)
    program = capture_program(model, inputs, mode="train", optimizer="adam")
    bare = plan(program.graph, [device(name="cuda:0")], PlannerSettings(placement="single"))
    planned = plan_with_scratch(program, bare, "virtual", blocks=False)
    verify(program.graph, planned)
    (d,) = planned.devices
    ops = {op.name: op.type for op in program.graph.ops}
    assert d.scratch_bytes > 0 and {ops[o] for o in planned.scratch} >= {"aten.native_layer_norm.default"}
    m = evaluate_program(program, planned, model, inputs, steps=1, warmup=1, devices="virtual")
    (measured,) = m.devices
    assert measured.measured_peak_bytes == measured.predicted_peak_bytes == d.peak_bytes
    assert measured.transient_peak_bytes == measured.scratch_bytes == d.scratch_bytes
    assert m.numerics is not None and m.numerics.ok, m.numerics
    assert bare.devices[0].peak_bytes == d.peak_bytes - d.scratch_bytes < measured.measured_peak_bytes
    # Without an arena nothing is copied in: the plan's lower bound (static + LOAD) is what runs.
    m = evaluate_program(program, planned, model, inputs, steps=1, warmup=0, arena=False, devices="virtual",
                         eager=False)
    assert m.devices[0].measured_peak_bytes == m.devices[0].predicted_peak_bytes == d.lower_bound_bytes


def test_clone_and_safe_softmax_rewrites_write_the_same_bits() -> None:
    aten = torch.ops.aten
    from mpplan.runtime.arena import exact_rewrite

    x = torch.randn(2, 3, 5, 5)
    x[0, 1, 2, :] = float("-inf")  # a fully masked row: zero, not NaN
    x[1, 0, 1, 3] = float("nan")  # a NaN row stays NaN
    x[1, 2, 0, :] = float("-inf")
    x[1, 2, 0, 1] = float("nan")  # -inf and a NaN: not "fully masked"
    for source, dim in ((x, -1), (x.transpose(1, 2), 1), (x.transpose(2, 3), 3)):
        expected = aten._safe_softmax.default(source, dim)
        out = torch.empty_strided(expected.shape, expected.stride())
        got = exact_rewrite(aten._safe_softmax.default)((source, dim), {}, out)
        assert got is out and torch.equal(got.view(torch.int32), expected.view(torch.int32))
        clone = aten.clone.default(source)
        out = torch.empty_strided(clone.shape, clone.stride())
        assert torch.equal(exact_rewrite(aten.clone.default)((source,), {}, out).view(torch.int32),
                           clone.view(torch.int32))
    # Outside what it reproduces (another result dtype), the rewrite declines and the op is copied in.
    assert exact_rewrite(aten._safe_softmax.default)((x, -1, torch.float64), {}, torch.empty(x.shape)) is None
    assert exact_rewrite(aten._safe_softmax.default, "cuda") is None


def test_rewritten_attention_softmax_and_clone_hold_no_scratch() -> None:
    """The conv + attention zoo model's attention softmax (``_safe_softmax``) was its largest scratch and
    its clones copied in too; rewritten, they write into the arena, and the run stays bit-exact."""
    from mpplan.runtime.devices import map_devices
    from mpplan.runtime.executor import Executor
    from mpplan.runtime.schedule import compile_schedule
    from mpplan.runtime.scratch import op_scratch

    torch.manual_seed(0)
    model = zoo.build("convattn", stages=2, width=16, n_heads=2, groups=4)
    inputs = zoo.example_inputs("convattn", batch=4, image_size=8)
    program = capture_program(model, inputs, mode="train", optimizer="adam")
    types = {op.name: op.type for op in program.graph.ops}
    assert {"aten._safe_softmax.default", "aten.clone.default"} <= set(types.values())
    bare = plan(program.graph, [device(name="cuda:0")], PlannerSettings(placement="single"))
    scratch = op_scratch(compile_schedule(program, bare), map_devices(["cuda:0"], "virtual"))
    assert scratch and not {types[o] for o in scratch} & {"aten._safe_softmax.default", "aten.clone.default"}
    planned = with_scratch(bare, scratch)
    verify(program.graph, planned)
    m = evaluate_program(program, planned, model, inputs, steps=1, warmup=1, devices="virtual")
    assert m.devices[0].measured_peak_bytes == m.devices[0].predicted_peak_bytes == planned.devices[0].peak_bytes
    assert m.numerics is not None and m.numerics.ok, m.numerics
    # Against the same graph run op by op without an arena (every op its own call), the arena run's loss,
    # gradients and updated weights are the same bits (eager differs from both by float rounding).
    schedule = compile_schedule(program, planned)
    runs = []
    for arena in (True, False):
        executor = Executor(schedule, model, inputs, map_devices(["cuda:0"], "virtual"), arena=arena)
        torch.manual_seed(0)
        values = executor.run_step()
        runs.append([values.outputs[0].clone(), *(g.clone() for g in values.grads.values()),
                     *(v.clone() for v in executor.state().values())])
    assert len(runs[0]) == len(runs[1]) > 2
    assert all(torch.equal(a, b) for a, b in zip(*runs))

"""Multi-device placement: the exact DP, copy injection, shift, and verified plans."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chain
from mpplan.config import Device
from mpplan.errors import GraphError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes import place
from mpplan.passes.copies import inject_copies
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from strategies import graphs


# --- the DP against brute force ---------------------------------------------------------------


def brute_force(num_units, capacities, cost):
    best = None
    stages = min(len(capacities), num_units)
    for cuts in itertools.combinations(range(1, num_units), stages - 1):
        bounds = [0, *cuts, num_units]
        ratio = max(cost(bounds[d], bounds[d + 1] - 1)[0] / capacities[d] for d in range(stages))
        copied = sum(cost(bounds[d], bounds[d + 1] - 1)[1] for d in range(stages))
        if best is None or (ratio, copied) < best:
            best = (ratio, copied)
    return best


@settings(max_examples=300, deadline=None)
@given(
    num_units=st.integers(1, 8),
    capacities=st.lists(st.integers(1, 50), min_size=1, max_size=4),
    weights=st.lists(st.integers(0, 30), min_size=8, max_size=8),
    extra=st.lists(st.integers(0, 10), min_size=64, max_size=64),
)
def test_partition_is_exact(num_units, capacities, weights, extra):
    def cost(i, j):  # any function of the segment: the DP must not assume additivity
        return sum(weights[i : j + 1]) + extra[i * 8 + j], extra[(j * 8 + i) % 64]

    starts = place.partition(num_units, capacities, cost)
    bounds = [0, *starts, num_units]
    stages = len(bounds) - 1
    assert stages == min(len(capacities), num_units)
    assert all(bounds[d] < bounds[d + 1] for d in range(stages)), "every stage is non-empty"
    got = (
        max(cost(bounds[d], bounds[d + 1] - 1)[0] / capacities[d] for d in range(stages)),
        sum(cost(bounds[d], bounds[d + 1] - 1)[1] for d in range(stages)),
    )
    assert got[0] == brute_force(num_units, capacities, cost)[0]


# --- copy injection -----------------------------------------------------------------------------


def fan_out() -> Graph:
    """a is read by three ops; two of them run on another device."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("a", 100),
        Tensor("b", 10),
        Tensor("c", 10),
        Tensor("d", 10),
        Tensor("y", 4),
    )
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("B", "f", ("a",), ("b",)),
        Op("C", "f", ("a",), ("c",)),
        Op("D", "f", ("a",), ("d",)),
        Op("Y", "f", ("b", "c", "d"), ("y",)),
    )
    return Graph("fan", tensors, ops, ("y",)).validate()


def test_one_copy_per_tensor_and_device():
    graph = fan_out()
    placed = inject_copies(graph, range(5), ["g0", "g0", "g1", "g1", "g1"])
    names = [c.name for c in placed.copies]
    assert names == ["a@g1", "b@g1"], "a copied once for C and D, b once for Y; no copy for B"
    assert placed.cross_device_bytes == 110
    ops = [op.name for op in placed.graph.ops]
    assert ops.index("a@g1") == ops.index("C") - 1, "the copy runs right before its first consumer"
    assert placed.graph.op("D").inputs == ("a@g1",)
    assert placed.storage_device[placed.graph.topology.tensor_index["a@g1"]] == "g1"


def test_same_device_reads_need_no_copy():
    graph = fan_out()
    assert inject_copies(graph, range(5), ["g0"] * 5).copies == ()


def test_in_place_across_devices_rejected():
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("a", 16), Tensor("y", 16))
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("R", "relu_", ("a",), ("a",)),
        Op("Y", "f", ("a",), ("y",)),
    )
    graph = Graph("ip", tensors, ops, ("y",)).validate()
    with pytest.raises(GraphError, match="op 'R' on g1 writes tensor 'a' in place, but it lives on g0"):
        inject_copies(graph, range(3), ["g0", "g1", "g1"])


def test_tied_parameter_copied_once_per_device():
    tensors = (
        Tensor("ids", 8, Kind.INPUT),
        Tensor("emb", 1000, Kind.PARAM),
        Tensor("h", 40),
        Tensor("z", 40),
        Tensor("logits", 80),
    )
    ops = (
        Op("embed", "Embedding", ("ids", "emb"), ("h",)),
        Op("block", "f", ("h",), ("z",)),
        Op("head", "Linear", ("z", "emb"), ("logits",)),
    )
    graph = Graph("tied", tensors, ops, ("logits",)).validate()
    devices = [Device("g0", 10_000), Device("g1", 10_000)]
    p = plan(graph, devices, PlannerSettings(placement="manual", alignment=1, device_map={"": "g0"}))
    placed = inject_copies(graph, range(3), ["g0", "g1", "g1"])
    assert [c.tensor for c in placed.copies] == ["h", "emb"]
    assert placed.cross_device_bytes == 1040
    verify(graph, p)


# --- shift: Caffe2's ShiftActivationDevices semantics ------------------------------------------


def two_layer_training() -> Graph:
    """fc1 -> a1 -> fc2 -> a2 -> loss, with the backward ops of both layers."""
    t = [
        Tensor("x", 32, Kind.INPUT),
        Tensor("w1", 16, Kind.PARAM),
        Tensor("w2", 16, Kind.PARAM),
        Tensor("a1", 64),
        Tensor("a2", 64),
        Tensor("loss", 4, Kind.OUTPUT),
        Tensor("g_a2", 64, Kind.GRAD),
        Tensor("g_w2", 16, Kind.GRAD, grad_of="w2"),
        Tensor("g_a1", 64, Kind.GRAD),
        Tensor("g_w1", 16, Kind.GRAD, grad_of="w1"),
    ]
    ops = [
        Op("fc1", "Linear", ("x", "w1"), ("a1",)),
        Op("fc2", "Linear", ("a1", "w2"), ("a2",)),
        Op("loss_op", "Loss", ("a2",), ("loss",)),
        Op("loss_bwd", "LossGrad", ("a2", "loss"), ("g_a2",), backward_of="loss_op"),
        Op("fc2_bwd", "LinearGrad", ("g_a2", "a1", "w2"), ("g_a1", "g_w2"), backward_of="fc2"),
        Op("fc1_bwd", "LinearGrad", ("g_a1", "x", "w1"), ("g_w1",), backward_of="fc1"),
    ]
    return Graph("two_layer", tuple(t), tuple(ops), ("loss",)).validate()


def test_shift_moves_producer_and_consumers_of_the_activation():
    graph = two_layer_training()
    base = place.place_single(graph, "g0")
    moved = place.shift(graph, range(6), base, ["a2"], "g0", "g1")
    where = dict(zip([o.name for o in graph.ops], moved))
    # fc2 produces a2 (its output decides), loss_op and loss_bwd consume it; fc2_bwd's last
    # activation is a1 (stays), fc1 touches only a1. w2 lives with its first user, fc2, so fc2_bwd
    # reads a copy of it.
    assert where == {
        "fc1": "g0",
        "fc2": "g1",
        "loss_op": "g1",
        "loss_bwd": "g1",
        "fc2_bwd": "g0",
        "fc1_bwd": "g0",
    }
    placed = inject_copies(graph, range(6), moved)
    assert sorted((c.tensor, c.dst) for c in placed.copies) == [("a1", "g1"), ("g_a2", "g0"), ("w2", "g0")]


def test_shift_plan_verifies_and_unknown_activation_is_an_error():
    graph = two_layer_training()
    devices = [Device("g0", 10_000), Device("g1", 10_000)]
    p = plan(graph, devices, PlannerSettings(placement="shift", alignment=1, shift_activations=["a2"]))
    verify(graph, p)
    assert p.placement["fc2"] == "g1"
    with pytest.raises(Exception, match="unknown tensor 'nope'"):
        plan(graph, devices, PlannerSettings(placement="shift", shift_activations=["nope"]))


# --- pipeline and auto -------------------------------------------------------------------------


def test_pipeline_balances_a_chain():
    graph = chain(40, nbytes=1000)
    devices = [Device(f"g{i}", 100_000) for i in range(4)]
    p = plan(graph, devices, PlannerSettings(placement="pipeline", alignment=1))
    verify(graph, p)
    used = {p.placement[op.name] for op in graph.ops}
    assert used == {"g0", "g1", "g2", "g3"}
    peaks = [d.peak_bytes for d in p.devices]
    assert max(peaks) <= 1.1 * min(peaks)


def test_pipeline_respects_heterogeneous_capacity():
    graph = chain(30, nbytes=1000)
    devices = [Device("small", 2_000), Device("big", 8_000)]
    p = plan(graph, devices, PlannerSettings(placement="pipeline", alignment=1))
    verify(graph, p, check_capacity=False)
    count = {d: sum(1 for op in graph.ops if p.placement[op.name] == d) for d in ("small", "big")}
    assert count["big"] > count["small"]


def test_auto_keeps_single_when_it_fits_best():
    graph = chain(6)
    devices = [Device("g0", 1 << 30), Device("g1", 1 << 30)]
    p = plan(graph, devices, PlannerSettings(placement="auto", alignment=1))
    verify(graph, p)
    assert p.settings["placement_chosen"] in {"single", "pipeline", "shift"}


@settings(max_examples=500, deadline=None)  # about 1 in 100 makes a view on a copy
@given(graph=graphs(max_ops=10), data=st.data())
def test_random_multi_device_plans_verify(graph, data):
    names = ["g0", "g1", "g2"]
    op_device = tuple(data.draw(st.sampled_from(names)) for _ in graph.ops)
    order = tuple(range(len(graph.ops)))
    try:
        placed = inject_copies(graph, order, op_device)
    except GraphError as exc:
        assert "in place" in str(exc)
        return
    assert placed.graph.validate()
    pinned_ops = tuple(dataclasses.replace(op, device=d) for op, d in zip(graph.ops, op_device))
    pinned = dataclasses.replace(graph, ops=pinned_ops)
    p = plan(pinned, [Device(n, 1 << 30) for n in names], PlannerSettings(placement="manual", alignment=1))
    verify(pinned, p)  # the ops' own devices (legalized), views made on copies included
    recorded = {op.name: d for op, d in zip(placed.graph.ops, placed.op_device)}
    again = inject_copies(graph, order, [recorded[op.name] for op in graph.ops])
    assert again.graph == placed.graph and again.copies == placed.copies, "rebuilt from its own placement"


def test_view_op_runs_with_its_base_and_readers_copy_the_view():
    """Regression: a transposed tied weight read on another device (GPT's lm head)."""
    tensors = (
        Tensor("ids", 8, Kind.INPUT),
        Tensor("emb", 1000, Kind.PARAM),
        Tensor("embT", 1000, alias_of="emb"),
        Tensor("h", 40),
        Tensor("logits", 80),
    )
    ops = (
        Op("embed", "Embedding", ("ids", "emb"), ("h",)),
        Op("t", "t", ("emb",), ("embT",)),
        Op("head", "mm", ("h", "embT"), ("logits",)),
    )
    graph = Graph("tied_view", tensors, ops, ("logits",)).validate()
    placed = inject_copies(graph, range(3), ["g0", "g1", "g1"])
    assert placed.op_device[1] == "g0", "the view op stays with its base"
    assert sorted((c.tensor, c.dst) for c in placed.copies) == [("embT", "g1"), ("h", "g1")]
    devices = [Device("g0", 10_000), Device("g1", 10_000)]
    p = plan(graph, devices, PlannerSettings(placement="manual", alignment=1, device_map={"": "g0"}))
    verify(graph, p)


def test_copy_of_a_slice_moves_only_its_elements():
    """A third of a fused QKV output read elsewhere copies its third, not the whole storage."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("qkv", 96, shape=(24,), dtype="float32"),
        Tensor("q", 0, shape=(8,), dtype="float32", alias_of="qkv"),
        Tensor("y", 32),
    )
    ops = (
        Op("proj", "addmm", ("x",), ("qkv",), module="proj"),
        Op("split", "slice", ("qkv",), ("q",), module="proj"),
        Op("attn", "f", ("q",), ("y",), module="attn"),
    )
    graph = Graph("slice", tensors, ops, ("y",)).validate()
    placed = inject_copies(graph, range(3), ["g0", "g0", "g1"])
    assert [(c.tensor, c.bytes) for c in placed.copies] == [("q", 32)]
    devices = [Device("g0", 10_000), Device("g1", 10_000)]
    p = plan(graph, devices, PlannerSettings(placement="manual", alignment=1, device_map={"proj": "g0", "attn": "g1"}))
    assert p.cross_device_bytes == 32
    verify(graph, p)


def test_view_of_a_tensor_copied_anyway_is_made_on_the_copy():
    """A gradient copied for one matmul is not copied again for its transpose's matmul:
    the transpose runs on the reader's device, over the copy, and views it."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("g", 64),
        Tensor("gt", 0, alias_of="g"),
        Tensor("a", 16),
        Tensor("b", 16),
        Tensor("y", 16),
    )
    ops = (
        Op("grad", "f", ("x",), ("g",), module="top"),
        Op("mm1", "mm", ("g",), ("a",), module="low"),
        Op("t", "t", ("g",), ("gt",), module="top"),
        Op("mm2", "mm", ("gt",), ("b",), module="low"),
        Op("sum", "add", ("a", "b"), ("y",), module="low"),
    )
    graph = Graph("transpose", tensors, ops, ("y",)).validate()
    placed = inject_copies(graph, range(5), ["g0", "g1", "g0", "g1", "g1"])
    assert [c.name for c in placed.copies] == ["g@g1"], "one copy, not a second one of the transpose"
    assert placed.op_device[placed.graph.topology.op_index["t"]] == "g1"
    assert placed.graph.tensor("gt").alias_of == "g@g1"
    devices = [Device("g0", 10_000), Device("g1", 10_000)]
    p = plan(graph, devices, PlannerSettings(placement="manual", alignment=1, device_map={"top": "g0", "low": "g1"}))
    assert p.cross_device_bytes == 64
    verify(graph, p)


def _tied_transposes(update_between: bool) -> Graph:
    """A weight's transpose copied for the head's matmul, and the transpose of that read in
    backward; the optimizer updates the weight in place at the end, or, when
    ``update_between``, before the backward matmul reads it."""
    tensors = (
        Tensor("h", 8, Kind.INPUT),
        Tensor("w", 64, Kind.PARAM),
        Tensor("wt", 0, alias_of="w"),
        Tensor("wtt", 0, alias_of="wt"),
        Tensor("a", 16),
        Tensor("b", 16),
    )
    update = Op("sgd", "add_", ("w",), ("w",), module="emb")
    ops = [
        Op("t", "t", ("w",), ("wt",), module="head"),
        Op("mm", "mm", ("h", "wt"), ("a",), module="head"),
        Op("t2", "t", ("wt",), ("wtt",), module="head"),
        Op("mm2", "mm", ("a", "wtt"), ("b",), module="head"),
    ]
    ops.insert(3 if update_between else 4, update)
    return Graph("tied_t", tensors, tuple(ops), ("b",)).validate()


@pytest.mark.parametrize("update_between", [False, True], ids=["updated-after", "updated-between"])
def test_view_of_a_copied_weight_is_made_on_the_copy_unless_the_weight_changes_meanwhile(update_between):
    graph = _tied_transposes(update_between)
    order = range(len(graph.ops))
    devices = ["g1" if op.module == "head" else "g0" for op in graph.ops]
    placed = inject_copies(graph, order, devices)
    copied = [c.tensor for c in placed.copies]
    assert copied == (["wt", "wtt"] if update_between else ["wt"])
    p = plan(graph, [Device("g0", 10_000), Device("g1", 10_000)],
             PlannerSettings(placement="manual", alignment=1, device_map={"emb": "g0", "head": "g1"}))
    verify(graph, p)


def test_rebuilding_copies_from_a_recorded_placement_gives_the_same_graph():
    """The executor re-injects copies from ``plan.placement``, where a relocated view is on its
    readers' device; an input first touched by that view must keep the same home."""
    tensors = (Tensor("x", 64, Kind.INPUT), Tensor("xv", 0, alias_of="x"), *(Tensor(n, 8) for n in "acb"))
    ops = (
        Op("V", "view", ("x",), ("xv",)),
        Op("A", "f", ("x",), ("a",)),
        Op("C", "f", ("x",), ("c",)),
        Op("B", "f", ("xv", "c"), ("b",)),
    )
    graph = Graph("first_user_view", tensors, ops, ("a", "b")).validate()
    first = inject_copies(graph, range(4), ["g0", "g0", "g1", "g1"])
    recorded = {op.name: d for op, d in zip(first.graph.ops, first.op_device)}
    assert recorded["V"] == "g1" and [c.tensor for c in first.copies] == ["x"], "V runs on the copy of x"
    again = inject_copies(graph, range(4), [recorded[op.name] for op in graph.ops])
    assert again.graph == first.graph and again.copies == first.copies


def test_view_stays_with_its_base_when_its_input_is_not_copied_anyway():
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("g", 64), Tensor("gt", 0, alias_of="g"), Tensor("b", 16))
    ops = (
        Op("grad", "f", ("x",), ("g",)),
        Op("t", "t", ("g",), ("gt",)),
        Op("mm2", "mm", ("gt",), ("b",)),
    )
    graph = Graph("transpose_only", tensors, ops, ("b",)).validate()
    placed = inject_copies(graph, range(3), ["g0", "g1", "g1"])
    assert placed.op_device[1] == "g0"
    assert [c.tensor for c in placed.copies] == ["gt"]


# --- tied weights, optimizer state, forced stages -------------------------------------------


def tied_lm(blocks: int = 6, emb: int = 4000, hidden: int = 100) -> Graph:
    """embed -> blocks -> head, the head reading the embedding's (large) weight through a view."""
    tensors = [
        Tensor("ids", 8, Kind.INPUT),
        Tensor("emb", emb, Kind.PARAM),
        Tensor("embT", 0, alias_of="emb"),
        Tensor("h0", hidden),
        Tensor("logits", hidden),
    ]
    ops = [Op("embed", "Embedding", ("ids", "emb"), ("h0",), module="tok_emb")]
    for i in range(blocks):
        tensors += [Tensor(f"w{i}", emb // 2, Kind.PARAM), Tensor(f"h{i + 1}", hidden)]
        ops.append(Op(f"block{i}", "Linear", (f"h{i}", f"w{i}"), (f"h{i + 1}",), module=f"blocks.{i}"))
    ops += [
        Op("t", "t", ("emb",), ("embT",), module="head"),
        Op("head", "mm", (f"h{blocks}", "embT"), ("logits",), module="head"),
    ]
    return Graph("tied_lm", tuple(tensors), tuple(ops), ("logits",)).validate()


def test_pipeline_runs_a_tied_head_where_its_weight_lives():
    """Copying the hidden state back beats copying the vocabulary matrix forward (accelerate keeps
    tied weights together too); before, the head's device received a copy of the whole embedding."""
    graph = tied_lm()
    devices = [Device(f"g{i}", 1 << 20) for i in range(3)]
    p = plan(graph, devices, PlannerSettings(placement="pipeline", alignment=1))
    verify(graph, p)
    assert p.placement["head"] == p.placement["embed"] == "g0"
    assert len({p.placement[op.name] for op in graph.ops}) == 3
    assert all(c.tensor not in ("emb", "embT") for c in p.copies)
    assert p.cross_device_bytes < graph.tensor("emb").nbytes


def test_tied_readers_stay_put_when_the_weight_is_small():
    graph = tied_lm(emb=40, hidden=400)
    order = list(range(len(graph.ops)))
    units = {k: k for k in place.forward_ops(graph, order)}
    assert place.pull_tied_readers(graph, order, units) == units


def test_optimizer_state_lives_with_its_parameter(zoo_gpt_adam):
    """Adam's moments are updated where the parameter's gradient is made: no moment, and nothing
    computed from one, crosses devices (before, they all followed the last stage)."""
    from mpplan.planner import placed_graph

    graph = zoo_gpt_adam
    devices = [Device(f"cuda:{i}", 1 << 30) for i in range(4)]
    # Static gradients: each of the four stages then holds parameters (with dynamic ones a stage may not).
    p = plan(graph, devices, PlannerSettings(placement="pipeline", grads="static"))
    verify(graph, p)
    placed = placed_graph(graph, p)
    topo = placed.graph.topology
    home = {t.name: placed.storage_device[topo.storage_of[topo.tensor_index[t.name]]] for t in graph.tensors}
    params = [t.name for t in graph.tensors if t.kind is Kind.PARAM]
    assert len({home[name] for name in params}) == 4
    for name in params:
        assert home[f"{name}.exp_avg"] == home[f"{name}.exp_avg_sq"] == home[name], name
    state = {t.name for t in graph.tensors if t.kind is Kind.OPTIMIZER_STATE}
    assert not [c.tensor for c in p.copies if c.tensor in state]
    forward = {graph.ops[k].name for k in place.forward_ops(graph, range(len(graph.ops)))}
    assert not [op.name for op in graph.ops if op.name in forward and set(op.inputs) & state]


@pytest.fixture(scope="module")
def zoo_gpt_adam() -> Graph:
    pytest.importorskip("torch")
    from mpplan.capture.torch_capture import capture
    from mpplan.zoo.transformer import example_inputs, gpt

    return capture(gpt(n_layers=4, device="meta"), example_inputs(batch=2, seq_len=32, device="meta"),
                   mode="train", optimizer="adam")


def test_partition_balances_the_others_when_one_stage_is_forced():
    """One unit alone sets the largest ratio: the remaining stages still share the rest evenly,
    instead of leaving devices with one tiny unit each to save copies."""
    weights = [1, 100, 1, 1, 1, 1, 1, 1, 1, 1]

    def cost(i, j):
        return sum(weights[i : j + 1]), 0 if j - i > 3 else 1  # longer stages copy less

    starts = place.partition(len(weights), [1000] * 4, cost)
    bounds = [0, *starts, len(weights)]
    assert [sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])] == [1, 100, 4, 4]

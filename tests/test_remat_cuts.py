"""Cut points: a record's ``from_op`` says where its tensor's late region starts.

``uneven``: ``a`` is read by ``B`` right after it is made, by ``C`` across a gap holding a
100-byte temporary, and by ``D`` across a shorter gap holding a 300-byte one.  The model's
rule cuts at the longest gap (before ``C``), so the recompute lives through the 300-byte
stretch and nothing goes under 410 bytes; cutting before ``D`` instead reaches 310.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from mpplan import sim
from mpplan.config import Device
from mpplan.errors import ConfigError, VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import apply_recompute
from mpplan.passes.remat.api import RematResult, result_of
from mpplan.plan import Plan, RematRecord, load_plan, save_plan
from mpplan.planner import PlannerSettings, plan, rematerialised
from mpplan.verify import verify


def uneven() -> Graph:
    def act(name: str, nbytes: int) -> Tensor:
        return Tensor(name, nbytes)

    tensors = (Tensor("x", 8, Kind.INPUT), act("a", 100), act("b", 1), act("big1", 100), act("q1", 1), act("c", 1),
               act("big2", 300), act("q2", 1), Tensor("d", 1, Kind.OUTPUT))
    ops = (Op("A", "f", ("x",), ("a",), 1.0), Op("B", "f", ("a",), ("b",), 1.0), Op("P1", "f", ("x",), ("big1",), 1.0),
           Op("Q1", "f", ("big1",), ("q1",), 1.0), Op("C", "f", ("a", "q1", "b"), ("c",), 1.0),
           Op("P2", "f", ("x",), ("big2",), 1.0), Op("Q2", "f", ("big2",), ("q2",), 1.0),
           Op("D", "f", ("a", "q2", "c"), ("d",), 1.0))
    return Graph("uneven", tensors, ops, ("d",)).validate()


def peak(graph: Graph) -> int:
    return sim.static_bytes(graph) + sim.order_load(graph, range(len(graph.ops)))


def planned_with(graph: Graph, result: RematResult) -> Plan:
    """The plan of ``result``'s rewrite, as a plan of ``graph`` with ``result``'s records."""
    inner = plan(result.graph, [Device("cuda:0", 1 << 30)], PlannerSettings(schedule="as_given", alignment=1))
    return dataclasses.replace(inner, graph_hash=graph.content_hash, graph_name=graph.name,
                               remat=tuple(RematRecord.from_mapping(r) for r in result.plan_records()))


def test_a_cut_at_the_shorter_gap_frees_the_stretch_the_longest_gap_cannot() -> None:
    graph = uneven()
    assert peak(graph) == peak(apply_recompute(graph, ["A"])) == 410
    cut = apply_recompute(graph, ["A"], {"a": "D"})
    assert peak(cut) == 310
    assert [op.name for op in cut.ops][-3:] == ["Q2", "A@recompute", "D"]
    assert cut.op("C").inputs == ("a", "q1", "b") and cut.op("D").inputs == ("a@recompute", "q2", "c")


def test_a_cut_names_a_later_reader_of_its_tensor() -> None:
    with pytest.raises(ConfigError, match="from_op 'P2' is no later reader"):
        apply_recompute(uneven(), ["A"], {"a": "P2"})
    with pytest.raises(ConfigError, match="from_op 'A' is no later reader"):
        apply_recompute(uneven(), ["A"], {"a": "A"})


def test_records_state_the_cut_and_the_plan_round_trips_and_verifies(tmp_path) -> None:
    graph = uneven()
    result = result_of(graph, ["A"], "budget", peak(graph), 0.0, from_ops={"a": "D"})
    assert result.peak_bytes == 310 and result.added_cost == 1.0
    made = planned_with(graph, result)
    assert [r.to_dict() for r in made.remat] == [{"tensor": "a", "op": "A", "recompute_op": "A@recompute",
                                                  "recompute_tensor": "a@recompute", "bytes": 100, "from_op": "D"}]
    path = save_plan(made, tmp_path / "plan.json")
    loaded = load_plan(path)
    assert loaded == made and loaded.remat[0].from_op == "D"
    verify(graph, loaded)
    assert rematerialised(graph, loaded).content_hash == result.graph.content_hash
    # Without the field the record means the rule's cut, which this schedule does not run.
    data = json.loads(path.read_text())
    del data["remat"][0]["from_op"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    with pytest.raises(VerificationError):
        verify(graph, load_plan(tmp_path / "old.json"))


@pytest.mark.parametrize(("start", "message"), [("P2", "no op that reads it"), ("B2", "no op that reads it"),
                                                ("A", "no op that reads it")])
def test_the_verifier_rejects_a_cut_at_no_reader(start: str, message: str) -> None:
    graph = uneven()
    made = planned_with(graph, result_of(graph, ["A"], "budget", peak(graph), 0.0, from_ops={"a": "D"}))
    bad = dataclasses.replace(made, remat=(dataclasses.replace(made.remat[0], from_op=start),))
    with pytest.raises(VerificationError, match=message):
        verify(graph, bad)


def test_a_cut_per_round_keeps_a_tensor_over_three_intervals() -> None:
    """Round one cuts ``a`` before ``C``; round two cuts the recompute before ``D``: ``a`` lives
    over [A, B], [C] and [D], each stretch holding neither copy."""
    graph = uneven()
    result = result_of(graph, ["A", "A@recompute"], "budget", peak(graph), 0.0,
                       from_ops={"a": "C", "a@recompute": "D"})
    assert result.recompute_ops == ("A@recompute", "A@recompute@recompute") and result.peak_bytes == 310
    made = planned_with(graph, result)
    assert [r.get("from_op") for r in made.remat] == ["C", "D"]
    verify(graph, made)
    assert rematerialised(graph, made).content_hash == result.graph.content_hash


@pytest.mark.usefixtures("torch_one_thread")
@pytest.mark.parametrize("arena", [True, False], ids=["arena", "no-arena"])
def test_a_cut_plan_of_a_torch_model_runs_exactly_and_matches_eager(arena: bool) -> None:
    """The first ReLU's output is read by two backward ops; the cut keeps it for the first
    and recomputes it for the second.  Planner records -> verifier -> executor on a virtual
    device: measured peak = planned, numerics = eager."""
    import torch

    from mpplan import zoo
    from mpplan.capture.torch_capture import capture_program
    from mpplan.runtime import evaluate_program

    torch.manual_seed(0)
    model = zoo.build("mlp", in_features=16, hidden=32, out_features=8, layers=3)
    inputs = zoo.example_inputs("mlp", batch=4, in_features=16)
    program = capture_program(model, inputs, mode="train", optimizer="sgd")
    graph = program.graph
    relu = graph.op("relu")
    topo = graph.topology
    storage = topo.tensor_index[relu.outputs[0]]
    late = [k for k, op in enumerate(graph.ops)
            if op.backward_of is not None and storage in {topo.storage_of[t] for t in topo.op_inputs[k]}]
    assert len(late) >= 2, "the graph's first ReLU output has one backward reader"
    start = graph.ops[late[-1]].name
    result = result_of(graph, ["relu"], "budget", peak(graph), 0.0, from_ops={relu.outputs[0]: start})
    rewritten = result.graph
    assert rewritten.op(start).inputs != graph.op(start).inputs  # the last reader reads the recompute
    assert rewritten.op(graph.ops[late[0]].name).inputs == graph.ops[late[0]].inputs  # the first, the original
    inner = plan(rewritten, [Device("cuda:0", 1 << 30)], PlannerSettings(schedule="as_given", grads="static"))
    made = dataclasses.replace(inner, graph_hash=graph.content_hash, graph_name=graph.name,
                               remat=tuple(RematRecord.from_mapping(r) for r in result.plan_records()))
    assert made.remat[0].from_op == start
    verify(graph, made)
    m = evaluate_program(program, made, model, inputs, steps=1, warmup=0, arena=arena, devices="virtual")
    assert m.exact, [(d.name, d.predicted_peak_bytes, d.measured_peak_bytes) for d in m.devices]
    assert m.numerics is not None and m.numerics.ok, m.numerics

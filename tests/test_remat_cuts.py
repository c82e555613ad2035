"""Cut points: a record's ``from_op`` says where its tensor's late region starts.

``uneven``: ``a`` is read by ``B`` right after it is made, by ``C`` across a gap holding a
100-byte temporary, and by ``D`` across a shorter gap holding a 300-byte one.  The model's
rule cuts at the longest gap (before ``C``), so the recompute lives through the 300-byte
stretch and nothing goes under 410 bytes; cutting before ``D`` instead reaches 310.
"""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpplan import sim
from mpplan.capture import synthetic
from mpplan.config import Device
from mpplan.errors import ConfigError, InfeasibleError, VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import MIN_GAP, RECOMPUTES_ONLY, apply_recompute, build_model, remat
from mpplan.passes.remat.result import RematResult, result_of
from mpplan.passes.remat.cuts import fit_cuts, fit_least_cuts
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


def test_a_chain_link_is_read_by_recomputes_only_and_its_plan_verifies(tmp_path) -> None:
    """``B`` recomputed as a chain link (``from_op`` ``@recomputes``): ``C`` reads ``b`` as
    made, only ``C``'s recompute reads ``b@recompute``, made right before it, so ``b`` dies
    after ``C`` and is not held to ``D``: 309 bytes, where the same recomputes with ``b`` cut
    at ``C`` (its only later reader) peak at 410."""
    graph = uneven()
    ops, cuts = ["A", "B", "P1", "Q1", "C"], {"a": "D", "b": RECOMPUTES_ONLY, "c": "D"}
    assert RECOMPUTES_ONLY == "@recomputes"
    result = result_of(graph, ops, "budget", peak(graph), 0.0, from_ops=cuts)
    rewritten = result.graph
    assert result.peak_bytes == peak(rewritten) == 309 and result.added_cost == 5.0
    assert rewritten.op("C").inputs == ("a", "q1", "b")
    assert [op.name for op in rewritten.ops if "b@recompute" in op.inputs] == ["C@recompute"]
    names = [op.name for op in rewritten.ops]
    assert names.index("B@recompute") < names.index("C@recompute") < names.index("D")
    assert peak(apply_recompute(graph, ops, {**cuts, "b": "C"})) == 410
    made = planned_with(graph, result)
    assert {r.tensor: r.from_op for r in made.remat}["b"] == RECOMPUTES_ONLY
    loaded = load_plan(save_plan(made, tmp_path / "plan.json"))
    verify(graph, loaded)
    assert rematerialised(graph, loaded).content_hash == rewritten.content_hash


def test_the_verifier_rejects_a_chain_link_no_recompute_reads() -> None:
    """A link of ``B`` whose reader ``C`` is not recomputed makes no recompute: a record
    listing ``B@recompute`` does not check out, and ``apply_recompute`` leaves ``B`` alone."""
    graph = uneven()
    assert apply_recompute(graph, ["B"], {"b": RECOMPUTES_ONLY}).content_hash == graph.content_hash
    made = planned_with(graph, result_of(graph, ["A"], "budget", peak(graph), 0.0, from_ops={"a": "D"}))
    forged = RematRecord("b", "B", "B@recompute", "b@recompute", 1, RECOMPUTES_ONLY)
    with pytest.raises(VerificationError, match="not in the rewritten graph"):
        verify(graph, dataclasses.replace(made, remat=(*made.remat, forged)))


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


def test_the_budget_policy_chooses_the_cut_and_the_planner_records_it() -> None:
    graph = uneven()
    with pytest.raises(InfeasibleError):
        remat(graph, "budget", budget=320, rounds=False)  # one recompute at the rule's cut: 410
    r = remat(graph, "budget", budget=320)
    assert (r.peak_bytes, r.recompute_ops, dict(r.from_ops), r.added_cost) == (310, ("A@recompute",), {"a": "D"}, 1.0)
    made = plan(graph, [Device("cuda:0", 1 << 30)], PlannerSettings(remat="budget", remat_budget=320,
                                                                      schedule="as_given", alignment=1))
    assert made.max_peak_bytes <= 320 and [r.get("from_op") for r in made.remat] == ["D"]
    verify(graph, made)


def cut_options(graph: Graph, op: str) -> list[dict[str, str]]:
    """Every placement of the late regions of ``op``'s outputs: each output's late region
    starts at any of its readers that follows an idle gap of ``MIN_GAP`` steps or more, or
    (all such outputs at once) past every op: a chain link only recomputes read."""
    topo = graph.topology
    per_output = []
    for out in graph.op(op).outputs:
        storage = topo.storage_of[topo.tensor_index[out]]
        uses = [k for k in range(len(graph.ops)) if storage in topo.op_storages[k]]
        starts = [b for a, b in itertools.pairwise(uses) if b - a >= MIN_GAP
                  and storage in {topo.storage_of[t] for t in topo.op_inputs[b]}]
        per_output.append([(out, graph.ops[b].name) for b in starts] or [None])
    placements = [dict(x for x in combo if x is not None) for combo in itertools.product(*per_output)]
    link = {first[0]: RECOMPUTES_ONLY for first, *_ in per_output if first is not None}  # every output with a gap
    return placements + [link] if link else placements


def least_cut_cost(graph: Graph, budget: int) -> float | None:
    """Brute force: the least added cost of any set of recomputes, each output cut at any
    of its gaps, whose rewrite fits ``budget`` (``None``: none fits)."""
    names = build_model(graph).candidate_names()
    options = [[None, *cut_options(graph, name)] for name in names]
    best = None
    for combo in itertools.product(*options):
        ops = [name for name, cut in zip(names, combo) if cut is not None]
        from_ops = {t: o for cut in combo if cut is not None for t, o in cut.items()}
        try:
            rewritten = apply_recompute(graph, ops, from_ops)
        except ConfigError:
            continue  # a cut before which nothing reads late: not a recompute the model makes
        if peak(rewritten) <= budget:
            cost = sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
            best = cost if best is None else min(best, cost)
    return best


@st.composite
def gapped_graphs(draw: st.DrawFn) -> Graph:
    """``uneven`` at random: two kept tensors ``a`` and ``b`` read across two to four
    stretches, each holding a temporary of random bytes; each stretch's reader reads a
    random part of them (a tensor read late across several gaps)."""
    tensors = [Tensor("x", 8, Kind.INPUT), Tensor("a", draw(st.integers(50, 200))),
               Tensor("b", draw(st.integers(50, 200)))]
    ops = [Op("A", "f", ("x",), ("a",), draw(st.sampled_from([1.0, 2.0]))),
           Op("B", "f", ("a",), ("b",), draw(st.sampled_from([1.0, 2.0])))]
    last = "b"
    for i in range(draw(st.integers(2, 4))):
        tensors += [Tensor(f"big{i}", draw(st.integers(10, 400))), Tensor(f"q{i}", 1), Tensor(f"c{i}", 1)]
        kept = draw(st.sampled_from([("a",), ("b",), ("a", "b")]))
        ops += [Op(f"P{i}", "f", ("x",), (f"big{i}",), 1.0), Op(f"Q{i}", "f", (f"big{i}",), (f"q{i}",), 1.0),
                Op(f"R{i}", "f", (*kept, f"q{i}", last), (f"c{i}",), 1.0)]
        last = f"c{i}"
    tensors.append(Tensor("out", 1, Kind.OUTPUT))
    ops.append(Op("OUT", "f", ("a", "b", last), ("out",), 1.0))
    return Graph("gapped", tuple(tensors), tuple(ops), ("out",)).validate()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gapped_graphs(), st.floats(0.4, 0.95))
def test_cut_fits_fit_and_never_beat_brute_force_over_every_cut(graph: Graph, fraction: float) -> None:
    """The cut solvers' answers fit, rebuild from their cut points, and cost at least the
    least cost of the brute force over every subset and every cut: the exact reference."""
    budget = int(fraction * peak(graph))
    exact = least_cut_cost(graph, budget)
    model = build_model(graph)
    for found in (fit_cuts(model, budget, "exact", 10.0, beat=float("inf")), fit_least_cuts(model, budget)):
        if found is None:
            continue
        rewritten = apply_recompute(graph, found.names, found.from_ops)
        assert peak(rewritten) <= budget
        assert exact is not None and found.cost >= exact - 1e-9
        assert sum(op.cost for op in rewritten.ops if op.recompute_of is not None) == pytest.approx(found.cost)

"""graph_hash.py: version 2 sees every field and no name; version 1 plans on disk still verify."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import device, diamond, tiny
from mpplan.errors import PlanError, VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.graph_hash import VERSION_2, hash_matches
from mpplan.plan import check_plan_graph, load_plan, save_plan
from mpplan.planner import plan
from mpplan.verify import verify
from strategies import graphs


def version_1(g: Graph) -> str:
    """The hash plans carried before version 2, written out here so the library cannot drift from it."""
    tensors = [[t.name, t.nbytes, t.kind.value, t.shape, t.dtype, t.alias_of, t.grad_of] for t in g.tensors]
    ops = [[o.name, o.type, o.inputs, o.outputs, o.cost, o.device, o.backward_of, o.module, o.stage, o.recompute_of]
           for o in g.ops]
    payload = json.dumps([tensors, ops, sorted(g.outputs)], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def changed(value: Any) -> Any:
    """A value of the field's type that is not ``value``."""
    if value is None:
        return "z"
    if isinstance(value, Kind):
        return Kind.WORKSPACE if value is not Kind.WORKSPACE else Kind.ACTIVATION
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.5
    if isinstance(value, str):
        return value + '"'
    assert isinstance(value, tuple)
    return value[:-1] if value else ("z",)


@settings(max_examples=100, deadline=None)
@given(graphs(max_ops=10))
def test_version_1_is_the_documented_payload(g: Graph) -> None:
    """Plans on disk carry version 1: the graph must keep computing it exactly."""
    assert g.content_hash_v1 == version_1(g)


@settings(max_examples=200, deadline=None)
@given(graphs(max_ops=8), st.data())
def test_version_2_changes_with_any_field_and_not_with_the_name(g: Graph, data: st.DataObject) -> None:
    assert g.content_hash.startswith(VERSION_2)
    assert Graph("renamed", g.tensors, g.ops, g.outputs).content_hash == g.content_hash
    tensors, ops = list(g.tensors), list(g.ops)
    if data.draw(st.booleans(), label="tensor") or not ops:
        k = data.draw(st.integers(0, len(tensors) - 1), label="which tensor")
        field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(Tensor)]), label="field")
        tensors[k] = dataclasses.replace(tensors[k], **{field: changed(getattr(tensors[k], field))})
    else:
        k = data.draw(st.integers(0, len(ops) - 1), label="which op")
        field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(Op)]), label="field")
        ops[k] = dataclasses.replace(ops[k], **{field: changed(getattr(ops[k], field))})
    assert Graph(g.name, tuple(tensors), tuple(ops), g.outputs).content_hash != g.content_hash
    assert Graph(g.name, g.tensors, g.ops, (*g.outputs, "z")).content_hash != g.content_hash


def test_version_2_tells_apart_what_runs_together_as_text() -> None:
    """Names moved between tensors, a None against an empty name, an int cost against a float one."""
    a = Graph("g", (Tensor("ab", 1), Tensor("c", 1)), ())
    assert a.content_hash != Graph("g", (Tensor("a", 1), Tensor("bc", 1)), ()).content_hash
    op = Op("A", "f", ("x",), ("y",), cost=1.0)
    g = Graph("g", (), (op,))
    assert g.content_hash != Graph("g", (), (dataclasses.replace(op, cost=1),)).content_hash  # type: ignore[arg-type]
    assert g.content_hash != Graph("g", (), (dataclasses.replace(op, device=""),)).content_hash
    shaped = Graph("g", (Tensor("t", 1, shape=(2, 3)),), ())
    assert shaped.content_hash != Graph("g", (Tensor("t", 1, shape=(23,)),), ()).content_hash
    assert shaped.content_hash != Graph("g", (Tensor("t", 1, shape=None),), ()).content_hash


def test_version_2_of_a_fixed_graph_never_moves() -> None:
    """Plans on disk carry version 2 too: a change of encoding (or of marshal's format in a new Python)
    must fail here.  The graph has a view, an op reading one tensor twice, a gradient, optional fields."""
    g = Graph("g", (Tensor("x", 8, Kind.INPUT, shape=(2,), dtype="float32"),
                    Tensor("y", 8, shape=(2,), dtype="float32"), Tensor("v", 0, alias_of="y"),
                    Tensor("gx", 8, Kind.GRAD, grad_of="x")),
              (Op("f", "mul", ("x", "x"), ("y",), cost=1.5, module="m.0"), Op("view", "view", ("y",), ("v",)),
               Op("b", "mul_bwd", ("v", "x"), ("gx",), backward_of="f")), ("y",))
    assert g.validate().content_hash == "v2-72b1b8a0e7aafbad"
    assert g.content_hash_v1 == version_1(g) == "f20a13f86345860e"


@pytest.mark.parametrize("make", [tiny, diamond], ids=["tiny", "diamond"])
def test_a_plan_carrying_version_1_still_loads_and_verifies(make, tmp_path) -> None:
    g = make()
    made = plan(g, [device()])
    assert made.graph_hash == g.content_hash  # the planner writes version 2
    old = dataclasses.replace(made, graph_hash=version_1(g))
    loaded = load_plan(save_plan(old, tmp_path / "plan.json"))
    assert loaded.graph_hash == version_1(g) and hash_matches(loaded.graph_hash, g)
    check_plan_graph(loaded, g, "plan.json")
    verify(g, loaded)
    verify(g, made)


def test_a_hash_of_another_graph_fails_in_either_version() -> None:
    g, other = tiny(), diamond()
    made = plan(g, [device()])
    for claimed in (other.content_hash, version_1(other), "", "v2-", VERSION_2 + version_1(g)):
        wrong = dataclasses.replace(made, graph_hash=claimed)
        assert not hash_matches(claimed, g)
        with pytest.raises(VerificationError, match="graph hash"):
            verify(g, wrong)
        with pytest.raises(PlanError, match="graph.hash"):
            check_plan_graph(wrong, g, "plan.json")


def test_a_search_keys_its_points_by_version_1_so_a_stored_search_resumes(tmp_path) -> None:
    """Result stores written before version 2 hold keys made of version 1: the keys must not move."""
    from mpplan.capture.graph_file import save_graph
    from mpplan.cluster.planning import PointPlanner
    from mpplan.cluster.records import Candidate
    from mpplan.cluster.space import candidate_key, planner_section
    from mpplan.cluster.store import ResultStore
    from mpplan.config import resolve_devices

    save_graph(tiny(), tmp_path / "tiny.yaml")
    base = {"model": {"graph": {"path": str(tmp_path / "tiny.yaml")}},
            "devices": [{"name": "gpu0", "capacity": "1MiB"}]}
    planner = PointPlanner(base, str(tmp_path / "search.yaml"), ResultStore(tmp_path / "out"), lambda _: None)
    point = planner.resolve(())
    assert isinstance(point, Candidate)
    expected = candidate_key(version_1(tiny()), planner_section(point.config), resolve_devices(point.config),
                             point.config.workload)
    assert point.key == expected

"""graph.py: every error ``validate()`` raises, in-place ordering edges, static/dynamic kinds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from mpplan.errors import GraphError
from mpplan.graph import Graph, Kind, Op, Tensor, _build_topology, with_dynamic_grads
from strategies import graphs


def graph(tensors, ops, outputs=()) -> Graph:
    return Graph("g", tuple(tensors), tuple(ops), tuple(outputs))


X = Tensor("x", 8, Kind.INPUT)


def test_a_valid_graph_validates_to_itself():
    g = graph([X, Tensor("a", 4)], [Op("A", "f", ("x",), ("a",))], ["a"])
    assert g.validate() is g
    assert g.tensor("a").nbytes == 4 and g.op("A").type == "f"


@pytest.mark.parametrize(
    "tensors, ops, outputs, message",
    [
        pytest.param(
            [X, Tensor("a", 4)],
            [Op("A", "f", ("x", "nope"), ("a",))],
            [],
            "op 'A': input names unknown tensor 'nope'",
            id="unknown-input",
        ),
        pytest.param(
            [X],
            [Op("A", "f", ("x",), ("nope",))],
            [],
            "op 'A': output names unknown tensor 'nope'",
            id="unknown-output",
        ),
        pytest.param(
            [X, Tensor("x", 4)],
            [],
            [],
            "tensor 'x': defined twice",
            id="duplicate-tensor",
        ),
        pytest.param(
            [X, Tensor("a", 4), Tensor("b", 4)],
            [Op("A", "f", ("x",), ("a",)), Op("A", "f", ("a",), ("b",))],
            [],
            "op 'A': defined twice",
            id="duplicate-op",
        ),
        pytest.param(
            [X, Tensor("", 4)],
            [],
            [],
            "tensor #1: name must be a non-empty string, got ''",
            id="empty-name",
        ),
        pytest.param(
            [X, Tensor("a", 4)],
            [Op("A", "f", ("x",), ("a",)), Op("B", "f", ("x",), ("a",))],
            [],
            "tensor 'a': produced twice, by ops 'A' and 'B'",
            id="double-producer",
        ),
        pytest.param(
            [X, Tensor("a", 4), Tensor("b", 4)],
            [Op("A", "f", ("x", "b"), ("a",)), Op("B", "f", ("a",), ("b",))],
            [],
            "op 'A': lies on a dependency cycle",
            id="cycle",
        ),
        pytest.param(
            [X, Tensor("a", 4), Tensor("b", 4)],
            [Op("B", "f", ("a",), ("b",)), Op("A", "f", ("x",), ("a",))],
            [],
            "op 'B': listed before op 'A' it depends on; list ops in a valid execution order",
            id="listed-before-producer",
        ),
        pytest.param(
            [X, Tensor("a", -1)],
            [Op("A", "f", ("x",), ("a",))],
            [],
            "tensor 'a': negative size -1 bytes",
            id="negative-size",
        ),
        pytest.param(
            [X, Tensor("a", 0, alias_of="b"), Tensor("b", 0, alias_of="a")],
            [],
            [],
            "tensor 'a': alias cycle a -> b -> a",
            id="alias-cycle",
        ),
        pytest.param(
            [X, Tensor("a", 0, alias_of="a")],
            [],
            [],
            "tensor 'a': alias cycle a -> a",
            id="self-alias",
        ),
        pytest.param(
            [X, Tensor("v", 0, alias_of="nope")],
            [],
            [],
            "tensor 'v': alias_of names unknown tensor 'nope'",
            id="unknown-alias-base",
        ),
        pytest.param(
            [X, Tensor("g", 8, Kind.GRAD, grad_of="nope")],
            [Op("A", "f", ("x",), ("g",))],
            [],
            "tensor 'g': grad_of names unknown tensor 'nope'",
            id="unknown-grad-of",
        ),
        pytest.param(
            [X, Tensor("a", 4)],
            [Op("A", "f", ("x",), ("a",), backward_of="nope")],
            [],
            "op 'A': backward_of names unknown op 'nope'",
            id="unknown-backward-of",
        ),
        pytest.param(
            [X, Tensor("a", 4)],
            [Op("A", "f", ("x",), ("a",), recompute_of="nope")],
            [],
            "op 'A': recompute_of names unknown op 'nope'",
            id="unknown-recompute-of",
        ),
        pytest.param(
            [X, Tensor("a", 4)],
            [],
            [],
            "tensor 'a': produced by no op and not declared input, param or optimizer_state",
            id="unproduced-activation",
        ),
        pytest.param(
            [X, Tensor("a", 4)],
            [Op("A", "f", ("x",), ("a",))],
            ["a", "nope"],
            "graph output 'nope' is not a known tensor",
            id="unknown-output-name",
        ),
    ],
)
def test_validate_rejects(tensors, ops, outputs, message):
    with pytest.raises(GraphError) as info:
        graph(tensors, ops, outputs).validate()
    assert str(info.value) == message


def test_graph_error_is_a_value_error():
    with pytest.raises(ValueError):
        graph([Tensor("a", 4)], []).validate()


@pytest.mark.parametrize("kind", [Kind.GRAD, Kind.OUTPUT, Kind.WORKSPACE, Kind.ACTIVATION])
def test_produced_kinds_need_a_producer(kind):
    with pytest.raises(GraphError, match="produced by no op"):
        graph([Tensor("t", 4, kind)], []).validate()


def test_source_kinds_and_views_need_no_producer():
    g = graph(
        [
            Tensor("x", 4, Kind.INPUT),
            Tensor("w", 4, Kind.PARAM),
            Tensor("m", 4, Kind.OPTIMIZER_STATE),
            Tensor("wv", 0, alias_of="w"),
        ],
        [],
    )
    assert g.validate() is g


# --- in-place ordering ---------------------------------------------------------------


def inplace_graph() -> Graph:
    """A writes a; B reads a; C updates a in place; D reads the new a; E reads a view of a."""
    return graph(
        [X, Tensor("a", 8), Tensor("b", 8), Tensor("d", 8), Tensor("av", 0, alias_of="a"), Tensor("e", 8)],
        [
            Op("A", "f", ("x",), ("a",)),
            Op("B", "f", ("a",), ("b",)),
            Op("C", "relu", ("a",), ("a",)),
            Op("D", "f", ("a",), ("d",)),
            Op("E", "f", ("av",), ("e",)),
        ],
        ["b", "d", "e"],
    ).validate()


def test_in_place_write_waits_for_readers_of_the_previous_version():
    topo = inplace_graph().topology
    A, B, C, D, E = range(5)
    assert set(topo.preds[C]) == {A, B}
    assert set(topo.preds[D]) == {A, C}, "a later reader waits for the in-place write"
    assert set(topo.preds[E]) == {C}, "a view's reader waits for the last write of its storage"
    assert set(topo.succs[B]) == {C}


def test_in_place_write_waits_for_readers_of_a_view_of_its_storage():
    """Readers are kept per storage written in place: one reading a view of ``a`` counts for ``a``'s write."""
    g = graph(
        [X, Tensor("a", 8), Tensor("av", 0, alias_of="a"), Tensor("b", 8), Tensor("c", 8)],
        [Op("A", "f", ("x",), ("a",)), Op("V", "view", ("a",), ("av",)), Op("B", "f", ("av",), ("b",)),
         Op("C", "relu", ("a",), ("a",)), Op("D", "f", ("b",), ("c",))],
        ["a", "c"],
    ).validate()
    assert set(g.topology.preds[3]) == {0, 1, 2}, "the write waits for B, which read a through the view"


def test_in_place_op_is_not_a_second_producer_and_shares_storage():
    g = inplace_graph()
    topo = g.topology
    a = topo.tensor_index["a"]
    assert topo.producer[a] == 0
    assert g.op("C").in_place == ("a",)
    assert topo.storage_of[topo.tensor_index["av"]] == a
    assert topo.op_storages[4] == (a, topo.tensor_index["e"])


def test_a_reader_listed_after_an_in_place_write_reads_the_new_version():
    g = graph(
        [X, Tensor("a", 8), Tensor("b", 8)],
        [Op("A", "f", ("x",), ("a",)), Op("C", "relu", ("a",), ("a",)), Op("B", "f", ("a",), ("b",))],
    )
    # As given, B reads the new version: valid, and B waits for C.
    assert set(g.validate().topology.preds[2]) == {0, 1}


def test_two_in_place_writes_are_ordered():
    g = graph(
        [X, Tensor("a", 8)],
        [Op("A", "f", ("x",), ("a",)), Op("C1", "relu", ("a",), ("a",)), Op("C2", "relu", ("a",), ("a",))],
    ).validate()
    assert set(g.topology.preds[2]) == {0, 1}


# --- static / dynamic ----------------------------------------------------------------


def test_static_and_dynamic_classification():
    tensors = [
        Tensor("x", 8, Kind.INPUT),
        Tensor("w", 8, Kind.PARAM),
        Tensor("m", 8, Kind.OPTIMIZER_STATE),
        Tensor("h", 8),
        Tensor("out", 8, Kind.OUTPUT),
        Tensor("ws", 8, Kind.WORKSPACE),
        Tensor("gw", 8, Kind.GRAD, grad_of="w"),
        Tensor("gh", 8, Kind.GRAD, grad_of="h"),
        Tensor("g", 8, Kind.GRAD),
        Tensor("wv", 0, alias_of="w"),
        Tensor("hv", 0, Kind.PARAM, alias_of="h"),
    ]
    ops = [
        Op("F", "f", ("x", "w"), ("h", "ws")),
        Op("O", "f", ("h",), ("out",)),
        Op("B", "f", ("out", "h"), ("gh", "gw", "g")),
    ]
    g = graph(tensors, ops, ["out"]).validate()
    topo = g.topology
    static = {t.name for t in g.tensors if topo.is_static[topo.tensor_index[t.name]]}
    # A view is what its storage is: wv is static, hv (a "param" view of an activation) dynamic.
    assert static == {"x", "w", "m", "gw", "wv"}


def test_output_names_include_kind_output_in_tensor_order():
    g = graph(
        [X, Tensor("a", 4), Tensor("o", 4, Kind.OUTPUT)],
        [Op("A", "f", ("x",), ("a", "o"))],
        ["a"],
    ).validate()
    assert g.output_names == ("a", "o")
    topo = g.topology
    assert topo.output_storages == {topo.tensor_index["a"], topo.tensor_index["o"]}


def test_content_hash_ignores_the_name_and_sees_everything_else():
    a = graph([X, Tensor("a", 4)], [Op("A", "f", ("x",), ("a",), cost=1.0)], ["a"])
    renamed = Graph("other", a.tensors, a.ops, a.outputs)
    costlier = Graph("g", a.tensors, (Op("A", "f", ("x",), ("a",), cost=2.0),), a.outputs)
    assert a.content_hash == renamed.content_hash
    assert a.content_hash != costlier.content_hash


@settings(max_examples=150, deadline=None)
@given(graphs(max_ops=14))
def test_dynamic_grads_topology_is_the_rebuilt_one(g: Graph) -> None:
    """``with_dynamic_grads`` carries the topology over; it must be what validating the new graph builds."""
    dynamic = with_dynamic_grads(g)
    assert dynamic.topology == _build_topology(Graph(dynamic.name, dynamic.tensors, dynamic.ops, dynamic.outputs))


def test_dynamic_grads_are_made_once_per_graph() -> None:
    """The planner and the timeline both ask for the dynamic-grads graph: the second asks get the first's."""
    g = Graph("g", (Tensor("w", 8, Kind.PARAM), Tensor("gw", 8, Kind.GRAD, grad_of="w")),
              (Op("back", "f", ("w",), ("gw",)),))
    dynamic = with_dynamic_grads(g)
    assert with_dynamic_grads(g) is dynamic
    assert with_dynamic_grads(Graph(g.name, g.tensors, g.ops, g.outputs)) is not dynamic  # kept per graph object
    assert dynamic.tensors[1].grad_of is None and dynamic.outputs == ("gw",)

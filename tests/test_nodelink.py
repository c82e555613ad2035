"""networkx node-link import: the 18 shared benchmark graphs, and the mapping rules on small data."""

from __future__ import annotations

import json

import pytest

from conftest import CHECKMATE, needs_shared_data, shared_data_files
from mpplan.capture.graph_file import load_graph
from mpplan.capture.nodelink import graph_from_node_link
from mpplan.errors import GraphError, GraphFileError
from mpplan.graph import Kind

#: The shared data set: ``shared/`` sits beside the repository checkout (absent from a clone: skipped).
SHARED_DATA = CHECKMATE
FILES = shared_data_files("*.json")
needs_data = needs_shared_data


@needs_data
def test_all_eighteen_files_are_there():
    assert len(FILES) == 18


@needs_data
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_shared_graph_loads_and_matches_the_file(path):
    data = json.loads(path.read_text())
    g = load_graph(path).validate()
    nodes, links = data["nodes"], data["links"]
    params = sum(1 for n in nodes if n.get("param_cost", 0) > 0)
    assert len(g.ops) == len(nodes)
    assert len(g.tensors) == len(nodes) + params
    assert sum(len(o.inputs) for o in g.ops) == len(links) + params
    size = "cost_ram" if "cost_ram" in nodes[0] else "out_cost"
    activations = sorted(t.nbytes for t in g.tensors if t.kind is not Kind.PARAM)
    assert activations == sorted(n[size] for n in nodes)
    sources = {s for link in links for s in (link.get("source", link.get("0")),)}
    assert len(g.outputs) == len(nodes) - len(sources)
    topo = g.topology
    for k, preds in enumerate(topo.preds):
        assert all(p < k for p in preds)


@needs_data
@pytest.mark.parametrize("path", [p for p in FILES if p.name.endswith("_train_nx.json")], ids=lambda p: p.stem)
def test_checkmate_train_graphs_link_backward_ops_to_their_forward(path):
    g = load_graph(path)
    backward = [o for o in g.ops if o.type == "Backward"]
    forward = [o for o in g.ops if o.type != "Backward"]
    assert {o.backward_of for o in backward} == {o.name for o in forward} | {None}
    (loss,) = [o for o in backward if o.backward_of is None]
    assert loss.name == "Loss"
    for o in backward:
        assert g.tensor(o.outputs[0]).kind is Kind.GRAD and g.tensor(o.outputs[0]).grad_of is None
        assert o.backward_of is None or o.name == f"{o.backward_of}_backward"
    topo = g.topology
    assert not any(topo.is_static), "Checkmate graphs have no static tensors"
    assert g.outputs == (g.ops[-1].name,)


@needs_data
def test_checkmate_names_sizes_and_costs():
    g = load_graph(SHARED_DATA / "VGG16_256_224x224_test_nx.json")
    first = g.ops[0]
    assert (first.name, first.type, first.inputs, first.outputs, first.cost) == (
        "block1_conv1",
        "Node",
        (),
        ("block1_conv1",),
        385.0,
    )
    assert g.tensor("block1_conv1").nbytes == 3288334336
    assert g.outputs == ("predictions",)
    assert g.name == "VGG16 (MLSys)_256_(224, 224, 3)_test"


@needs_data
def test_random_layered_files_follow_their_order_attribute():
    path = next(p for p in FILES if p.name.startswith("random_layered_n100_"))
    data = json.loads(path.read_text())
    g = load_graph(path)
    assert [int(o.name) for o in g.ops] == data["graph"]["order"]
    assert g.ops[-1].name == "1" and g.outputs == ("1",)
    node = {n["name"]: n for n in data["nodes"]}
    assert g.op("5").cost == float(node[5]["duration"])
    assert g.tensor("5").nbytes == node[5]["out_cost"]


@needs_data
def test_size_and_cost_attributes_can_be_overridden():
    path = SHARED_DATA / "VGG16_256_224x224_test_nx.json"
    g = load_graph(path, size_attr="id", cost_attr="id")
    assert [t.nbytes for t in g.tensors] == list(range(len(g.tensors)))
    assert g.ops[3].cost == 3.0


# --- the mapping rules on small data -------------------------------------------------


def data(nodes, links, **graph):
    return {"directed": True, "multigraph": False, "graph": graph, "nodes": nodes, "links": links}


def node(i, **attrs):
    return {"id": i, "cost_ram": 10 * (i + 1), **attrs}


def names(g):
    return [o.name for o in g.ops]


def test_node_id_order_when_it_is_topological():
    g = graph_from_node_link(
        data([node(2), node(0), node(1)], [{"source": 0, "target": 2}, {"source": 1, "target": 2}])
    )
    assert names(g) == ["0", "1", "2"]
    assert g.op("2").inputs == ("0", "1")
    assert g.outputs == ("2",)


def test_order_attribute_when_ids_are_not_topological():
    links = [{"source": 2, "target": 1}, {"source": 0, "target": 2}]
    g = graph_from_node_link(data([node(0), node(1), node(2)], links, order=[0, 2, 1]))
    assert names(g) == ["0", "2", "1"]


def test_stable_topological_sort_when_the_order_attribute_is_missing_or_invalid():
    links = [{"source": 3, "target": 1}, {"source": 0, "target": 3}]
    nodes = [node(0), node(1), node(2), node(3)]
    expected = ["0", "2", "3", "1"]
    assert names(graph_from_node_link(data(nodes, links))) == expected
    for bad in ([0, 1, 3, 2], [0, 3, 1], [0, 3, 1, 9], [0, 3, 3, 1], "0312"):
        assert names(graph_from_node_link(data(nodes, links, order=bad))) == expected


def test_string_ids_keep_file_order():
    nodes = [{"id": "b", "cost_ram": 1}, {"id": "a", "cost_ram": 2}]
    g = graph_from_node_link(data(nodes, [{"source": "b", "target": "a"}]))
    assert names(g) == ["b", "a"] and g.op("a").inputs == ("b",)


def test_random_layered_keys():
    nodes = [
        {"name": 0, "out_cost": 5, "duration": 2, "param_cost": 0},
        {"name": 1, "out_cost": 7, "duration": 3, "param_cost": 4},
    ]
    g = graph_from_node_link(data(nodes, [{"0": 0, "1": 1}]))
    assert names(g) == ["0", "1"]
    assert g.op("1").inputs == ("0", "1.param") and g.op("1").cost == 3.0
    param = g.tensor("1.param")
    assert (param.kind, param.nbytes) == (Kind.PARAM, 4)
    assert g.topology.is_static[g.topology.tensor_index["1.param"]]


def test_graph_tags_name_the_attributes():
    nodes = [{"id": 0, "o": 5, "t": 2, "p": 3, "cost_ram": 99}]
    g = graph_from_node_link(data(nodes, [], node_output_cost_tag="o", node_duration_tag="t", node_param_cost_tag="p"))
    assert g.tensor("0").nbytes == 5 and g.op("0").cost == 2.0 and g.tensor("0.param").nbytes == 3


def test_names_are_used_only_when_unique():
    nodes = [node(0, name="a"), node(1, name="a")]
    assert names(graph_from_node_link(data(nodes, []))) == ["0", "1"]
    nodes = [node(0, name="a"), node(1, name="b")]
    assert names(graph_from_node_link(data(nodes, []))) == ["a", "b"]


def test_backward_nodes_and_their_forward_twins():
    nodes = [
        node(0, name="conv", backward=False),
        node(1, name="Loss", backward=True),
        node(2, name="conv_backward", backward=True),
        node(3, name="orphan_backward", backward=True),
    ]
    links = [
        {"source": 0, "target": 1},
        {"source": 1, "target": 2},
        {"source": 0, "target": 2},
        {"source": 2, "target": 3},
    ]
    g = graph_from_node_link(data(nodes, links))
    assert [(o.type, o.backward_of) for o in g.ops] == [
        ("Node", None),
        ("Backward", None),
        ("Backward", "conv"),
        ("Backward", None),
    ]
    assert [t.kind for t in g.tensors] == [Kind.ACTIVATION, Kind.GRAD, Kind.GRAD, Kind.GRAD]


def test_fractional_sizes_round_up_and_duplicate_edges_are_read_once():
    nodes = [node(0), {"id": 1, "cost_ram": 2.5}]
    g = graph_from_node_link(data(nodes, [{"source": 0, "target": 1}] * 2), name="given")
    assert g.tensor("1").nbytes == 3 and g.op("1").inputs == ("0",) and g.name == "given"


def test_edges_key_and_default_name():
    g = graph_from_node_link({"nodes": [node(0)], "edges": []})
    assert g.name == "node_link" and names(g) == ["0"]


def test_costs_default_to_zero_without_a_cost_attribute():
    assert graph_from_node_link(data([node(0)], [])).op("0").cost == 0.0


@pytest.mark.parametrize(
    "payload, kwargs, message",
    [
        ([], {}, "expected a node-link mapping with nodes and links, got list"),
        (data([node(0)], []) | {"directed": False}, {}, "directed: expected a directed graph (directed: true)"),
        ({"nodes": {}, "links": []}, {}, "nodes: expected a list of node mappings"),
        ({"nodes": [], "links": 3}, {}, "links: expected a list of link mappings"),
        (data([node(0)], []) | {"graph": []}, {}, "graph: expected a mapping of graph attributes, got list"),
        (data([{"cost_ram": 1}], []), {}, "nodes[0].name: expected a node id (an integer or a string), got None"),
        (data([node(0), node(0)], []), {}, "nodes[1].id: node id 0 appears twice"),
        (data([{"id": 0}], []), {}, "nodes: no size attribute; expected one of cost_ram, out_cost, or pass size_attr"),
        (data([node(0), {"id": 1}], []), {}, "nodes[1].cost_ram: missing; every node needs it"),
        (data([node(0)], []), {"size_attr": "bytes"}, "nodes[0].bytes: missing; every node needs it"),
        (data([node(0, cost_cpu=1), node(1)], []), {}, "nodes[1].cost_cpu: missing; every node needs it"),
        (data([node(0, cost_ram=-1)], []), {}, "nodes[0].cost_ram: expected a non-negative number, got -1"),
        (data([node(0, cost_ram="big")], []), {}, "nodes[0].cost_ram: expected a non-negative number, got 'big'"),
        (data([node(0, backward="yes")], []), {}, "nodes[0].backward: expected true or false, got 'yes'"),
        (data([node(0)], [{"source": 0, "target": 5}]), {}, "links[0].target: unknown node 5"),
        (data([node(0)], [{"source": 0}]), {}, 'links[0]: expected source and target (or "0" and "1") keys'),
        (data([node(0)], [{"source": 0, "target": 0}]), {}, "links[0]: self-loop on node 0; the graph must be acyclic"),
        (
            data([node(0), node(1), node(2)], [{"source": 1, "target": 2}, {"source": 2, "target": 1}]),
            {},
            "links: the graph has a cycle through node 1",
        ),
    ],
)
def test_malformed_data(payload, kwargs, message):
    with pytest.raises(GraphFileError) as info:
        graph_from_node_link(payload, **kwargs)
    assert str(info.value) == message


def test_a_param_named_like_another_node_is_a_graph_error():
    nodes = [node(0, name="a", param_cost=2), node(1, name="a.param")]
    with pytest.raises(GraphError) as info:
        graph_from_node_link(data(nodes, []))
    assert str(info.value) == "tensor 'a.param': defined twice"

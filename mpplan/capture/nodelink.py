"""networkx node-link JSON: one op per node, producing one tensor; edges are reads.

The mapping (the Checkmate and random-layered graphs in ``shared/data`` are the
models for it):

* **Nodes.** A node's id is its ``id`` attribute, else its ``name`` attribute
  (the random-layered files key nodes by ``name``).  Each node becomes an op
  producing one tensor.  Op and tensor are named after the node's ``name`` when
  every node has both an ``id`` and a unique, non-empty string ``name`` (Checkmate:
  ``conv1_bn``), else after ``str(id)``.
* **Sizes.** Output bytes come from the size attribute: ``size_attr`` when given,
  else the graph's ``node_output_cost_tag``, else the first of ``cost_ram``
  (Checkmate) and ``out_cost`` (random layered) the nodes carry.  A fractional size
  rounds up.  Op cost comes likewise from ``cost_attr``, ``node_duration_tag``,
  ``cost_cpu`` or ``duration``; with none of them, costs are 0.
* **Params.** A node whose ``param_cost`` (or the graph's ``node_param_cost_tag``)
  is positive reads a ``param`` tensor ``<op>.param`` of that many bytes: static.
* **Backward.** A node with ``backward: true`` produces a ``grad`` tensor with no
  ``grad_of``: an activation gradient, dynamic.  Its ``backward_of`` is the forward
  node named like it without the ``_backward`` suffix (Checkmate names the
  backward of ``conv1_bn`` ``conv1_bn_backward``); Checkmate's ``Loss`` node, the
  first backward node, has no forward twin and keeps ``backward_of`` empty.
* **Edges** (``links``, or ``edges``) are reads: the target op reads the source's
  tensor.  Endpoints are ``source``/``target``, or ``"0"``/``"1"`` as in the
  random-layered files.  Duplicate edges are read once; a self-loop is a cycle.
* **Outputs.** Sinks (nodes without successors) are the graph outputs.

The as-given op order is the first of these that respects every edge:

1. node-id order: ascending ids when every id is an integer, else file order;
2. the graph attribute ``order`` (a list of node ids), when it lists every node
   once and respects every edge (the random-layered files need it: their sink is
   node 1);
3. a stable topological sort that always runs the ready node first in (1).
"""

from __future__ import annotations

import math
from typing import Any

from mpplan.errors import GraphFileError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.topo import topological_order

_SIZE_ATTRS = ("cost_ram", "out_cost")
_COST_ATTRS = ("cost_cpu", "duration")
_PARAM_ATTR = "param_cost"
_BACKWARD_SUFFIX = "_backward"


def graph_from_node_link(
    data: dict[str, Any],
    *,
    name: str | None = None,
    size_attr: str | None = None,
    cost_attr: str | None = None,
) -> Graph:
    """Build and validate a ``Graph`` from parsed node-link JSON (see the module docstring).

    ``name`` defaults to the graph attribute ``name``, else ``"node_link"``.
    Raises ``GraphFileError("<dotted.field>: <what>")`` for malformed data.

    >>> data = {"nodes": [{"id": 0, "name": "a", "cost_ram": 8}, {"id": 1, "name": "b", "cost_ram": 4}],
    ...         "links": [{"source": 0, "target": 1}]}
    >>> g = graph_from_node_link(data)
    >>> [(o.name, o.inputs, o.outputs) for o in g.ops], g.outputs
    ([('a', (), ('a',)), ('b', ('a',), ('b',))], ('b',))
    """
    if not isinstance(data, dict):
        raise GraphFileError(f"expected a node-link mapping with nodes and links, got {type(data).__name__}")
    attrs = data.get("graph")
    if attrs is None:
        attrs = {}
    if not isinstance(attrs, dict):
        raise GraphFileError(f"graph: expected a mapping of graph attributes, got {type(attrs).__name__}")
    if data.get("directed", True) is not True:
        raise GraphFileError("directed: expected a directed graph (directed: true)")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise GraphFileError("nodes: expected a list of node mappings")
    link_key = "links" if "links" in data else "edges"
    links = data.get(link_key)
    if not isinstance(links, list) or not all(isinstance(e, dict) for e in links):
        raise GraphFileError(f"{link_key}: expected a list of link mappings")

    ids = _node_ids(nodes)
    by_name = _named_by_name(nodes)
    labels = [n["name"] for n in nodes] if by_name else [str(i) for i in ids]
    backward = [_backward(n, i) for i, n in enumerate(nodes)]
    index = {node_id: i for i, node_id in enumerate(ids)}
    edges = _edges(links, link_key, index)
    order = _op_order(ids, edges, attrs.get("order"), link_key)

    size_key = _pick_attr(size_attr, attrs.get("node_output_cost_tag"), _SIZE_ATTRS, nodes)
    if size_key is None and nodes:
        raise GraphFileError(f"nodes: no size attribute; expected one of {', '.join(_SIZE_ATTRS)}, or pass size_attr")
    cost_key = _pick_attr(cost_attr, attrs.get("node_duration_tag"), _COST_ATTRS, nodes)
    param_key = attrs.get("node_param_cost_tag") if isinstance(attrs.get("node_param_cost_tag"), str) else _PARAM_ATTR

    preds: list[list[int]] = [[] for _ in nodes]
    has_succ = [False] * len(nodes)
    for s, t in edges:
        preds[t].append(s)
        has_succ[s] = True
    # Backward twins are found by name only when ops carry the nodes' names.
    forward_names = {labels[i] for i in range(len(nodes)) if not backward[i]} if by_name else set()

    tensors: list[Tensor] = []
    ops: list[Op] = []
    for i in order:
        node, label = nodes[i], labels[i]
        where = f"nodes[{i}]"
        inputs = [labels[p] for p in preds[i]]
        param_bytes = _number(node, param_key, where, required=False)
        if param_bytes:
            tensors.append(Tensor(f"{label}.param", _bytes(param_bytes), Kind.PARAM))
            inputs.append(f"{label}.param")
        nbytes = _bytes(_number(node, size_key, where, required=True)) if size_key else 0
        tensors.append(Tensor(label, nbytes, Kind.GRAD if backward[i] else Kind.ACTIVATION))
        twin = label.removesuffix(_BACKWARD_SUFFIX)
        node_type = node.get("type")
        ops.append(
            Op(
                name=label,
                type=node_type if isinstance(node_type, str) else ("Backward" if backward[i] else "Node"),
                inputs=tuple(inputs),
                outputs=(label,),
                cost=float(_number(node, cost_key, where, required=True)) if cost_key else 0.0,
                backward_of=twin if backward[i] and twin != label and twin in forward_names else None,
            )
        )
    outputs = tuple(labels[i] for i in order if not has_succ[i])
    graph_name = name or (attrs["name"] if isinstance(attrs.get("name"), str) and attrs["name"] else "node_link")
    return Graph(graph_name, tuple(tensors), tuple(ops), outputs).validate()


def _named_by_name(nodes: list[dict[str, Any]]) -> bool:
    """Whether ops are named after the nodes' ``name`` attributes (see the module docstring)."""
    names = [n.get("name") for n in nodes]
    return (
        all("id" in n for n in nodes) and all(isinstance(x, str) and x for x in names) and len(set(names)) == len(names)
    )


def _node_ids(nodes: list[dict[str, Any]]) -> list[int | str]:
    ids: list[int | str] = []
    seen: set[int | str] = set()
    for i, node in enumerate(nodes):
        key = "id" if "id" in node else "name"
        node_id = node.get(key)
        if isinstance(node_id, bool) or not isinstance(node_id, (int, str)):
            raise GraphFileError(f"nodes[{i}].{key}: expected a node id (an integer or a string), got {node_id!r}")
        if node_id in seen:
            raise GraphFileError(f"nodes[{i}].{key}: node id {node_id!r} appears twice")
        seen.add(node_id)
        ids.append(node_id)
    return ids


def _edges(links: list[dict[str, Any]], link_key: str, index: dict[int | str, int]) -> list[tuple[int, int]]:
    """(source, target) node indices, first occurrence of each edge, in file order."""
    edges: dict[tuple[int, int], None] = {}
    for k, link in enumerate(links):
        src_key, dst_key = ("source", "target") if "source" in link else ("0", "1")
        ends = []
        for key in (src_key, dst_key):
            if key not in link:
                raise GraphFileError(f'{link_key}[{k}]: expected source and target (or "0" and "1") keys')
            node_id = link[key]
            if isinstance(node_id, bool) or not isinstance(node_id, (int, str)) or node_id not in index:
                raise GraphFileError(f"{link_key}[{k}].{key}: unknown node {node_id!r}")
            ends.append(index[node_id])
        if ends[0] == ends[1]:
            raise GraphFileError(f"{link_key}[{k}]: self-loop on node {link[src_key]!r}; the graph must be acyclic")
        edges[(ends[0], ends[1])] = None
    return list(edges)


def _op_order(ids: list[int | str], edges: list[tuple[int, int]], given: object, link_key: str) -> list[int]:
    """Node indices in the as-given order (the three rules of the module docstring)."""
    n = len(ids)
    if all(isinstance(i, int) for i in ids):
        base = sorted(range(n), key=lambda i: ids[i])
    else:
        base = list(range(n))
    if _respects(base, edges):
        return base
    if isinstance(given, list) and len(given) == n:
        index = {node_id: i for i, node_id in enumerate(ids)}
        order = [index.get(x, -1) if isinstance(x, (int, str)) and not isinstance(x, bool) else -1 for x in given]
        if -1 not in order and len(set(order)) == n and _respects(order, edges):
            return order
    rank = [0] * n
    for r, i in enumerate(base):
        rank[i] = r
    succs: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for s, t in edges:
        succs[s].append(t)
        indegree[t] += 1
    order = topological_order(succs, indegree, ready=rank)
    if len(order) < n:
        done = set(order)
        stuck = min((i for i in range(n) if i not in done), key=lambda i: rank[i])
        raise GraphFileError(f"{link_key}: the graph has a cycle through node {ids[stuck]!r}")
    return order

def _respects(order: list[int], edges: list[tuple[int, int]]) -> bool:
    position = [0] * len(order)
    for step, i in enumerate(order):
        position[i] = step
    return all(position[s] < position[t] for s, t in edges)


def _pick_attr(
    explicit: str | None, tag: object, candidates: tuple[str, ...], nodes: list[dict[str, Any]]
) -> str | None:
    """The node attribute to read: the caller's, the graph's tag, or the first candidate present."""
    if explicit is not None:
        return explicit
    for key in ([tag] if isinstance(tag, str) else []) + list(candidates):
        if any(key in n for n in nodes):
            return key
    return None


def _backward(node: dict[str, Any], i: int) -> bool:
    value = node.get("backward", False)
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise GraphFileError(f"nodes[{i}].backward: expected true or false, got {value!r}")


def _number(node: dict[str, Any], key: str | None, where: str, *, required: bool) -> float | int:
    if key is None or key not in node:
        if required:
            raise GraphFileError(f"{where}.{key}: missing; every node needs it")
        return 0
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise GraphFileError(f"{where}.{key}: expected a non-negative number, got {value!r}")
    return value


def _bytes(value: float) -> int:
    """Whole bytes; a fractional size rounds up."""
    return value if isinstance(value, int) else math.ceil(value)

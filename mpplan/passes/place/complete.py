"""Completing a placement: from the anchors (forward ops) a strategy places to every op.

A backward op runs where its forward op ran, a recompute where its original ran (so
recomputing never adds cross-device traffic of its own), an op that updates a
parameter or optimizer state in place runs where that tensor is used, and any other
op follows the producer of its inputs.  Pure view ops stay with their base.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from mpplan.graph import Graph, Kind, is_pure_view


def complete(graph: Graph, order: Sequence[int], anchors: Mapping[int, str]) -> tuple[str, ...]:
    """Extend ``anchors`` (op id -> label) to every op by the rules in the module docstring."""
    topo = graph.topology
    label: dict[int, str] = dict(anchors)
    by_name = topo.op_index
    for k, op in enumerate(graph.ops):
        origin = op.backward_of if op.backward_of is not None else op.recompute_of
        if k not in label and origin is not None and by_name[origin] in label:  # a graph's links name its ops
            label[k] = label[by_name[origin]]
    user_label: dict[int, str] = {}  # storage -> label of its first placed reader that does not write it
    for k in order:
        if k in label:
            written = {topo.storage_of[topo.tensor_index[t]] for t in graph.ops[k].in_place}
            for s in topo.op_storages[k]:
                if s not in written:
                    user_label.setdefault(s, label[k])
    for k in order:
        if k in label:
            continue
        for name in graph.ops[k].in_place:
            s = topo.storage_of[topo.tensor_index[name]]
            if topo.producer[s] < 0 and s in user_label:
                label[k] = user_label[s]
                break
    _follow_state(graph, order, label, user_label)
    default = label[order[0]] if order and order[0] in label else next(iter(anchors.values()), "")
    for k in order:
        if k in label:
            continue
        label[k] = _follow(graph, k, label) or default
    for k in range(len(graph.ops)):
        if is_pure_view(graph, k):
            producer = topo.producer[topo.storage_of[topo.op_inputs[k][0]]]
            if producer >= 0:
                label[k] = label[producer]
    return tuple(label[k] for k in range(len(graph.ops)))


def _follow_state(graph: Graph, order: Sequence[int], label: dict[int, str], state_label: dict[int, str]) -> None:
    """Label the optimizer's ops where the gradients they read were made, and keep each
    piece of pre-existing state (Adam's moments) with the ops that update it.

    Propagates to a fixpoint: ``exp_avg_sq.mul_(beta2)`` learns its device only from the
    later ``exp_avg_sq.addcmul_(grad, grad)``, whose gradient's producer is placed.
    """
    topo = graph.topology
    pending = [k for k in order if k not in label]
    changed = True
    while changed and pending:
        changed = False
        for k in pending:
            found = None
            for s in topo.op_storages[k]:
                p = topo.producer[s]
                found = label.get(p) if p >= 0 else state_label.get(s)
                if found is not None:
                    break
            if found is None:
                continue
            label[k], changed = found, True
            for s in topo.op_storages[k]:
                if topo.producer[s] < 0:
                    state_label.setdefault(s, found)
        pending = [k for k in pending if k not in label]


def _follow(graph: Graph, k: int, label: dict[int, str]) -> str | None:
    topo = graph.topology
    for t in topo.op_inputs[k]:
        p = topo.producer[topo.storage_of[t]]
        if p >= 0 and p in label:
            return label[p]
    for t in topo.op_outputs[k]:
        for c in topo.consumers[t]:
            if c in label:
                return label[c]
    return None


def forward_ops(graph: Graph, order: Sequence[int]) -> list[int]:
    """Ops in ``order`` that belong to the forward pass: the anchors a partition places.

    After the forward pass: backward ops, recomputes, ops that read gradients or
    optimizer state (the optimizer's arithmetic), and every op that reads what one of
    those made.  Not anchors either: in-place updates of pre-existing state (a batch
    norm's running stats: the op follows its tensor) and views of weights (they touch
    no dynamic storage, and must run with their reader, or a view decides the weight's home).
    """
    topo = graph.topology
    state_kinds = (Kind.GRAD, Kind.OPTIMIZER_STATE)
    storage_of, producer, is_static = topo.storage_of, topo.producer, topo.is_static
    # per tensor id: state, or a storage made after the forward pass (marks grow as the walk goes)
    after = bytearray(tensor.kind in state_kinds for tensor in graph.tensors)
    marked, static = after.__getitem__, is_static.__getitem__  # by ``map``: no generator frame per op
    op_storages, op_inputs, op_outputs, ops = topo.op_storages, topo.op_inputs, topo.op_outputs, graph.ops
    forward = []
    for k in order:
        storages = op_storages[k]
        inputs = op_inputs[k]
        op = ops[k]
        if op.backward_of is not None or op.recompute_of is not None or any(map(marked, storages)):
            for t in op_outputs[k]:  # new storages only: a view of a weight or an in-place update makes none
                if storage_of[t] == t and t not in inputs:
                    after[t] = 1
            continue
        if all(map(static, storages)):
            continue
        if not any(producer[storage_of[t]] < 0 for t in op_outputs[k] if t in inputs):  # updates no state
            forward.append(k)
    return forward

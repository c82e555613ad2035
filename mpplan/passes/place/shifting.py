"""Shift placement: Caffe2's ShiftActivationDevices, generalised, with a greedy choice of what to shift.

Everything starts on ``from``; the named activations, or those ``auto_shift`` picks
one at a time while the worst device ratio falls, move to ``to`` with the forward
and backward ops that touch them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from mpplan.errors import ConfigError, InfeasibleError
from mpplan.graph import Graph, Kind
from mpplan.passes.place.manual import place_single
from mpplan.passes.place.scoring import score


def shift(
    graph: Graph,
    order: Sequence[int],
    op_device: Sequence[str],
    activations: Sequence[str],
    src: str,
    dst: str,
) -> tuple[str, ...]:
    """Caffe2's ShiftActivationDevices on the IR: move ``activations`` from ``src`` to ``dst``.

    Label propagation over the ops on ``src`` in schedule order: the named
    activations are labelled ``dst``, every other activation ``src``; an op takes
    the label of the last activation among its inputs and outputs (outputs come
    last, so they decide), else of any labelled tensor, else keeps its device; its
    unlabelled tensors then inherit the op's label.  Forward ops producing a named
    activation and backward ops consuming it therefore move together.
    """
    topo = graph.topology
    index = topo.tensor_index
    missing = [a for a in activations if a not in index]
    if missing:
        raise InfeasibleError(f"shift: unknown tensor {missing[0]!r}")
    chosen = {index[a] for a in activations}
    label: dict[int, str] = {}
    for t, tensor in enumerate(graph.tensors):
        if tensor.kind is Kind.ACTIVATION and not topo.is_static[topo.storage_of[t]]:
            label[t] = dst if t in chosen else src
    result = list(op_device)
    for k in order:
        if op_device[k] != src:
            continue
        tensors = [*topo.op_inputs[k], *topo.op_outputs[k]]
        device = None
        for t in tensors:
            if t in label and (graph.tensors[t].kind is Kind.ACTIVATION or device is None):
                device = label[t]
        device = device or op_device[k]
        for t in tensors:
            label.setdefault(t, device)
        result[k] = device
    return tuple(result)


def shift_placement(
    graph: Graph,
    order: Sequence[int],
    capacity: Mapping[str, int],
    *,
    activations: Any = "auto",
    src: str | None = None,
    dst: str | None = None,
) -> tuple[str, ...]:
    """Everything on ``src`` (default: the first device), then ``activations`` (names, or ``"auto"``:
    chosen by ``auto_shift``) moved to ``dst`` (default: the second device)."""
    names = list(capacity)
    src = src or names[0]
    dst = dst or (names[1] if len(names) > 1 else names[0])
    for key, value in (("from", src), ("to", dst)):
        if value not in names:
            raise ConfigError(f"planner.shift.{key}: unknown device {value!r}; devices are {', '.join(names)}")
    base = place_single(graph, src)
    if activations != "auto":
        return shift(graph, order, base, list(activations), src, dst)
    return auto_shift(graph, order, base, src, dst, capacity)


def auto_shift(
    graph: Graph,
    order: Sequence[int],
    base: tuple[str, ...],
    src: str,
    dst: str,
    capacity: Mapping[str, int],
    *,
    candidates_per_round: int = 12,
    max_rounds: int = 32,
) -> tuple[str, ...]:
    """Greedily move the activation whose shift lowers the worst device ratio most, while it helps."""
    chosen: list[str] = []
    current = base
    best = score(graph, order, current, capacity)[0]
    activations = [t for t in graph.tensors if t.kind is Kind.ACTIVATION and t.alias_of is None]
    activations.sort(key=lambda t: (-t.nbytes, t.name))
    for _ in range(max_rounds):
        trial_best, trial_choice = best, None
        tried = 0
        for tensor in activations:
            if tensor.name in chosen:
                continue
            if tried >= candidates_per_round:
                break
            tried += 1
            trial = shift(graph, order, base, [*chosen, tensor.name], src, dst)
            ratio = score(graph, order, trial, capacity)[0]
            if ratio < trial_best:
                trial_best, trial_choice = ratio, (tensor.name, trial)
        if trial_choice is None:
            break
        chosen.append(trial_choice[0])
        current, best = trial_choice[1], trial_best
    return current

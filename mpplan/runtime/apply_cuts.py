"""Where ``apply`` recomputes a tensor: a plan's cut point (``from_op``) as autograd's backward nodes meet it.

A remat record's ``from_op`` is the op from which on the tensor's readers read its
recompute (the start of its late region); the readers before it read the original.
In eager autograd the readers are backward *nodes* (the IR ops sharing one
``backward_of``): a node unpacks its saved tensors when it starts and drops them when
it ends (``apply_memory``).  So ``apply`` honours a cut node by node:

* the nodes whose readers all come before the cut read the original, which autograd
  holds until the last of them ends (``recompute.RecomputeHooks`` counts them);
* every other reader node reads the recompute, made when the first of them starts
  and dropped when the last of them ends.

A cut inside a node (a reader of that node before it) moves to the node's first
reader: the node unpacks once, so it reads the recompute whole; a cut at a backward op
that reads nothing of the tensor moves to the next reader.  ``Cut`` records the
cut so moved (``from_op``, what ``apply_memory`` predicts with) and how many nodes read
the original first (``early_nodes``).  A cut at the tensor's first backward reader
has none: the recompute serves every backward reader, as in plans without a cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.errors import PlanError

__all__ = ["Cut", "cuts_of"]

#: What a record's ``from_op`` must name for ``apply`` to honour it, said in its refusal.
_HINT = "apply() recomputes before one of the tensor's backward readers"


@dataclass(frozen=True, slots=True)
class Cut:
    """Recomputed output ``output`` of forward op ``op`` (IR tensor ``tensor``) is read late from ``from_op`` on.

    ``from_op`` is the first backward op of the first node that reads the recompute;
    ``early_nodes`` how many backward nodes read the original before it (module docstring).
    """

    tensor: str
    op: str
    output: int
    from_op: str
    early_nodes: int


def cuts_of(program: CapturedProgram, records: Iterable[Mapping[str, Any]]) -> tuple[Cut, ...]:
    """The ``Cut`` of every record of ``records`` (``Plan.remat``) that states a ``from_op``.

    Records of ops that are no forward op of ``program`` (a later round's, repeating a
    recompute) are not ``apply``'s to honour and are skipped, as ``RecomputePolicy``
    skips them.  A ``from_op`` that is no backward op of the graph, or comes after every
    backward reader of the tensor, raises one ``PlanError`` naming the record.
    """
    graph = program.graph
    topo = graph.topology
    phase = program.op_phases
    readers: dict[int, list[tuple[int, str]]] = {}  # storage -> (op index, node) of each backward reader
    for k, op in enumerate(graph.ops):
        if phase.get(op.name) != "backward":
            continue
        for s in dict.fromkeys(topo.storage_of[t] for t in topo.op_inputs[k]):
            readers.setdefault(s, []).append((k, op.backward_of or op.name))
    cuts = []
    for n, record in enumerate(records):
        tensor, op, cut = record["tensor"], record["op"], record.get("from_op")
        if cut is None or phase.get(op) != "forward" or tensor not in graph.op(op).outputs:
            continue
        where = f"plan remat[{n}]: tensor {tensor!r} has from_op {cut!r}"
        at = topo.op_index.get(cut)
        if at is None or phase.get(cut) != "backward":
            what = "no op of the graph" if at is None else f"in the {phase.get(cut, 'forward')} phase"
            raise PlanError(f"{where}; {_HINT}, and {cut!r} is {what}: plan with the budget policy on the "
                            "training graph for apply()")
        reading = readers.get(topo.storage_of[topo.tensor_index[tensor]], [])
        late = {node for k, node in reading if k >= at}
        if not late:
            raise PlanError(f"{where}; {_HINT}, and {cut!r} comes after the last of them: plan with the "
                            "budget policy on the training graph for apply()")
        first = next(k for k, node in reading if node in late)
        early = {node for _, node in reading if node not in late}
        cuts.append(Cut(tensor, op, graph.op(op).outputs.index(tensor), graph.ops[first].name, len(early)))
    return tuple(cuts)

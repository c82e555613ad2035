"""The graph a plan runs: the graph rewritten with the recomputes ``plan.remat`` lists."""

from __future__ import annotations

from mpplan.errors import ConfigError, VerificationError
from mpplan.graph import Graph
from mpplan.passes.remat import apply_recompute
from mpplan.plan import Plan


def with_recomputes(graph: Graph, plan: Plan) -> Graph:
    """The graph the plan runs: ``graph`` rewritten with the recomputes ``plan.remat`` lists.

    The rewrite is the one documented contract of ``remat`` (recompute ``op`` before
    the late readers of its outputs); everything the plan then claims about the
    rewritten graph is checked like any other plan.
    """
    if not plan.remat:
        return graph
    try:
        rewritten = apply_recompute(graph, dict.fromkeys(str(r["op"]) for r in plan.remat))
    except (ConfigError, KeyError) as exc:
        _fail(f"remat: {exc}")
    ops = {op.name for op in rewritten.ops}
    tensors = {t.name: t for t in rewritten.tensors}
    for r in plan.remat:
        if r.get("recompute_op") not in ops:
            _fail(f"remat: recompute op {r.get('recompute_op')!r} of {r.get('tensor')!r} is not in the rewritten graph")
        tensor = tensors.get(str(r.get("recompute_tensor")))
        if tensor is None or tensor.nbytes != r.get("bytes"):
            _fail(f"remat: recompute tensor {r.get('recompute_tensor')!r} is missing or has other bytes than listed")
    return rewritten


def _fail(message: str) -> None:
    raise VerificationError(message)

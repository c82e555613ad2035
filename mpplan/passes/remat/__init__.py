"""remat(graph, policy) -> RematResult: recompute activations instead of keeping them.

A recomputed op runs again, as a real op ``<F>@recompute``, right before the first
late reader of its outputs, so the originals die after their last early use; the
rules (what is early and late, what may be recomputed, how views and chains are
rewritten) are ``mpplan.passes.remat.model``'s, which every policy decides on.

Policies (``POLICIES``):

``none``
    the graph unchanged.
``mirror``
    MXNet's mirror plan at ``threshold`` bytes per recomputed stretch, or at the
    threshold MXNet's search picks (``mpplan.passes.remat.policies``).
``sqrt``
    Chen et al.'s sqrt(n) checkpoints (``mpplan.passes.remat.policies``).
``budget``
    fit ``budget`` bytes (an ``int``, or a ``float`` fraction of the no-remat peak,
    ``static + LOAD`` of the as-given order) with the least added op cost: a greedy
    heuristic over single and chained recomputes, or a MILP warm-started by it
    (``mpplan.passes.remat.budget``); on graphs without a backward pass also with
    late regions starting at cut points it chooses (``mpplan.passes.remat.cuts``,
    recorded as ``from_op``), in a second round (``mpplan.passes.remat.rounds``) and,
    with ``solver="auto"``, by a local search on the cuts (``cutsearch``) and then a
    large-neighbourhood search on the cut MILP built per neighbourhood
    (``mpplan.passes.remat.cutwindow``), or on graphs whose double-drop MILP builds in
    seconds, one on that MILP, with tensors dropped at two of their gaps
    (``mpplan.passes.remat.cutlns2``).
    The exact reference for the cuts is a MILP choosing recomputes and cuts together
    (``mpplan.passes.remat.cutmilp``, solved by ``cutexact``): the tests hold the
    heuristic to it, and ``scripts/bench_remat_moccasin.py --milp`` reports its bound.

All memory accounting is of the rewritten graph in its own as-given order, the
order ``sim`` scores: ``peak = static + LOAD``.  A budget under the smallest peak any
choice of recomputes reaches raises ``InfeasibleError`` naming that smallest
feasible budget in bytes (proved minimal by the MILP when one is installed).

Example: a three-layer training chain.  ``a`` waits through the whole backward of
``B`` and ``C``; recomputing it right before ``B``'s backward lowers the peak by 100
bytes for one op's cost.

>>> from mpplan.graph import Graph, Kind, Op, Tensor
>>> acts = [Tensor(t, 100) for t in "abc"] + [Tensor("l", 1)]
>>> grads = [Tensor(g, 100, Kind.GRAD) for g in ("gc", "gb", "ga")] + [Tensor("gx", 8, Kind.GRAD)]
>>> forward = [Op("A", "f", ("x",), ("a",), 1.0), Op("B", "f", ("a",), ("b",), 1.0),
...            Op("C", "f", ("b",), ("c",), 1.0), Op("L", "loss", ("c",), ("l",), 1.0)]
>>> backward = [Op("L.bw", "g", ("l", "c"), ("gc",), 1.0, backward_of="L"),
...             Op("C.bw", "g", ("gc", "b"), ("gb",), 1.0, backward_of="C"),
...             Op("B.bw", "g", ("gb", "a"), ("ga",), 1.0, backward_of="B"),
...             Op("A.bw", "g", ("ga", "x"), ("gx",), 1.0, backward_of="A")]
>>> g = Graph("mlp", (Tensor("x", 8, Kind.INPUT), *acts, *grads), (*forward, *backward), ("l", "gx"))
>>> r = remat(g, "budget", budget=350)
>>> r.baseline_peak_bytes, r.peak_bytes, r.recomputed, r.recompute_ops
(409, 309, ('a',), ('A@recompute',))
>>> [op.name for op in r.graph.ops][5:]
['C.bw', 'A@recompute', 'B.bw', 'A.bw']
"""

from mpplan.passes.remat.api import POLICIES, remat
from mpplan.passes.remat.budget import EXACT_MAX_OPS, SOLVERS, min_feasible_budget
from mpplan.passes.remat.evaluation import Evaluation, evaluate
from mpplan.passes.remat.model import MIN_GAP, NEVER, SUFFIX, RematModel, build_model, is_random
from mpplan.passes.remat.policies import MirrorPlan, mirror_plan, mirror_search, mirror_thresholds, sqrt_checkpoints
from mpplan.passes.remat.result import RematInfeasibleError, RematResult
from mpplan.passes.remat.rewriting import RECOMPUTES_ONLY, apply_recompute, candidate_indices, recomputable, rewrite

__all__ = [
    "EXACT_MAX_OPS",
    "MIN_GAP",
    "NEVER",
    "POLICIES",
    "RECOMPUTES_ONLY",
    "SOLVERS",
    "SUFFIX",
    "Evaluation",
    "MirrorPlan",
    "RematInfeasibleError",
    "RematModel",
    "RematResult",
    "apply_recompute",
    "build_model",
    "candidate_indices",
    "evaluate",
    "is_random",
    "min_feasible_budget",
    "mirror_plan",
    "mirror_search",
    "mirror_thresholds",
    "recomputable",
    "remat",
    "rewrite",
    "sqrt_checkpoints",
]

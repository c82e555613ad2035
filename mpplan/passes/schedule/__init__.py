"""schedule(graph) -> order: a topological order of the ops that keeps few bytes live.

The package: ``memory`` (the model every method scores against), ``heuristics``, ``frontiers`` (the
exact search), ``climber`` and ``local_search`` (``auto``'s improvement), ``searching`` (``exact``,
``auto``) and ``registry`` (``SCHEDULERS``, ``schedule``).

The score of an order is its LOAD, ``mpplan.sim.order_load``: the most dynamic bytes
live at one step, where a storage is live, inclusively, from the first op that
touches it through the last one (graph outputs to the end), so while op ``k`` runs
its inputs, its outputs and everything needed later are all resident.  Static
storage is the same under every order and plays no part.  Every method thinks in
storages, not tensor names: a view or an in-place update touches its base's storage,
and a storage read by several ops dies with the last of them.

Methods (``SCHEDULERS``; all deterministic, ``auto`` for a given seed):

``as_given``
    the graph's own op order.
``longest_path``
    Caffe2 memonger's ordering: sources whose longest path to the end is longer run
    first, grouped by the tree their longest paths form, then a depth-first
    topological order from them.
``greedy_free``
    Mesh TensorFlow's greedy list scheduler: run the ready op that frees the most
    bytes net (bytes whose last use it is, minus bytes it allocates).
``least_peak``
    run the ready op whose own step is smallest (bytes live while it runs), then
    the one leaving the fewest bytes live after it.
``dfs`` / ``bfs``
    depth-first (last enabled, first run) and breadth-first topological orders.
``exact``
    a best-first search over frontiers (``frontiers``): the least LOAD, for
    graphs up to a few dozen ops; wider graphs raise ``SearchLimitError``.
``auto``
    every heuristic above, the best kept; then, on graphs of up to
    ``AUTO_EXACT_SMALL_OPS`` ops, the exact search; on larger ones a local search
    bounded by work (hill climbing with single-op moves across the peak steps and
    exact reorderings of short segments around them, then random kicks), and on
    graphs of up to ``AUTO_EXACT_MAX_OPS`` ops a short exact search bounded by its
    result.  Never worse than any heuristic; exact on small graphs; near-linear on
    large ones.

Example: ``A`` makes a large tensor that only ``C`` reads, so ``C`` should run
before ``B`` adds its own output.

>>> from mpplan.graph import Graph, Kind, Op, Tensor
>>> from mpplan.sim import order_load
>>> g = Graph(
...     "fork",
...     (Tensor("x", 8, Kind.INPUT), Tensor("a", 100), Tensor("b", 10), Tensor("c", 1)),
...     (Op("A", "f", ("x",), ("a",)), Op("B", "f", ("x",), ("b",)), Op("C", "f", ("a",), ("c",))),
...     outputs=("b", "c"),
... )
>>> order_load(g, schedule(g, "as_given")), order_load(g, schedule(g, "auto"))
(111, 101)
>>> [g.ops[k].name for k in schedule(g)]
['A', 'C', 'B']
"""

from __future__ import annotations

from mpplan.passes.schedule.frontiers import DEFAULT_STATE_LIMIT, SearchLimitError, exact_search, min_peak_order
from mpplan.passes.schedule.heuristics import as_given, bfs, dfs, greedy_free, least_peak, longest_path
from mpplan.passes.schedule.memory import TIME_LIMIT, Order, Scheduler
from mpplan.passes.schedule.registry import SCHEDULERS, schedule
from mpplan.passes.schedule.searching import auto, exact

__all__ = [
    "DEFAULT_STATE_LIMIT",
    "SCHEDULERS",
    "TIME_LIMIT",
    "Order",
    "Scheduler",
    "SearchLimitError",
    "as_given",
    "auto",
    "bfs",
    "dfs",
    "exact",
    "exact_search",
    "greedy_free",
    "least_peak",
    "longest_path",
    "min_peak_order",
    "schedule",
]

"""Buffer assignment: offsets in one arena, or memonger-style shared objects.

The package: ``records`` (the input records, the result records, LOAD), ``heuristics``
(greedy by size, best fit), ``offsets`` (``assign_offsets``: heuristics, then the
improving ``stages``: ``skyline``, ``squeaky`` wheel and the branch and bound in
``search``), ``objects`` (``share_objects``) and ``arena`` (one device's arena by the
configured assigner, and ``ASSIGNERS``, the registry of ``planner.assign`` choices).
"""

from __future__ import annotations

from mpplan.passes.assign.arena import ASSIGNERS, Arena, Assigner, assign_arena
from mpplan.passes.assign.heuristics import best_fit, greedy_by_size
from mpplan.passes.assign.objects import (
    OBJECT_ALGORITHMS,
    ObjectAlgorithm,
    exact_objects,
    greedy_objects,
    share_objects,
    size_objects,
)
from mpplan.passes.assign.offsets import OFFSET_ALGORITHMS, OffsetAlgorithm, assign_offsets
from mpplan.passes.assign.records import MayShare, OffsetAssignment, Record, SharedObjects, records_load
from mpplan.passes.assign.search import search_offsets
from mpplan.passes.assign.skyline import RANK_RULES, rank_by
from mpplan.passes.assign.squeaky import round_cost, squeaky_wheel

__all__ = [
    "ASSIGNERS",
    "OBJECT_ALGORITHMS",
    "OFFSET_ALGORITHMS",
    "RANK_RULES",
    "Arena",
    "Assigner",
    "MayShare",
    "ObjectAlgorithm",
    "OffsetAlgorithm",
    "OffsetAssignment",
    "Record",
    "SharedObjects",
    "assign_arena",
    "assign_offsets",
    "best_fit",
    "exact_objects",
    "greedy_by_size",
    "greedy_objects",
    "rank_by",
    "records_load",
    "round_cost",
    "search_offsets",
    "share_objects",
    "size_objects",
    "squeaky_wheel",
]

"""One device's arena: offsets for its live ranges by the configured assigner; ``ASSIGNERS`` names them all.

``ASSIGNERS`` is the one list of ``planner.assign`` choices: the config's schema and
the generated reference take their names from it.  Offset assigners place records in
one arena directly; shared-object assigners group them into objects laid out back to
back (memonger), so either way the result is an offset per storage and an arena size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.liveness import Liveness
from mpplan.passes.assign.objects import ObjectAlgorithm, share_objects
from mpplan.passes.assign.offsets import OffsetAlgorithm, assign_offsets
from mpplan.passes.assign.records import MayShare, Record
from mpplan.passes.concurrency import dag_may_share

#: An assigner: (records, alignment, may_share) -> (offset per record, arena bytes).
Assigner = Callable[[Sequence[Record], int, "MayShare | None"], tuple[Sequence[int], int]]


def _in_one_arena(algorithm: OffsetAlgorithm) -> Assigner:
    def run(records: Sequence[Record], alignment: int, may_share: MayShare | None) -> tuple[Sequence[int], int]:
        found = assign_offsets(records, alignment=alignment, algorithm=algorithm, may_share=may_share)
        return found.offsets, found.arena

    return run


def _as_objects(algorithm: ObjectAlgorithm) -> Assigner:
    def run(records: Sequence[Record], alignment: int, may_share: MayShare | None) -> tuple[Sequence[int], int]:
        shared = share_objects(records, algorithm=algorithm, may_share=may_share, alignment=alignment)
        return shared.offsets(), shared.total

    return run


#: Every ``planner.assign`` choice by name (``exact`` is ``search``'s alias).
ASSIGNERS: dict[str, Assigner] = {
    "auto": _in_one_arena("auto"),
    "greedy_by_size": _in_one_arena("greedy_by_size"),
    "best_fit": _in_one_arena("best_fit"),
    "search": _in_one_arena("search"),
    "exact": _in_one_arena("search"),
    "shared_greedy": _as_objects("greedy"),
    "shared_dp": _as_objects("dp"),
}


@dataclass(frozen=True, slots=True)
class Arena:
    """Offsets of one device's dynamic storages (by storage id) and the arena size."""

    offsets: dict[int, int]
    sizes: dict[int, int]
    arena: int


def assign_arena(graph: Graph, liveness: Liveness, *, assigner: str, alignment: int, parallel_safe: bool) -> Arena:
    """Offsets for the ranges in ``liveness`` by ``ASSIGNERS[assigner]``; with ``parallel_safe``, two
    storages share bytes only when the DAG itself orders one's last use before the other's producer."""
    if assigner not in ASSIGNERS:
        raise ConfigError(f"planner.assign: expected one of {', '.join(ASSIGNERS)}, got {assigner!r}")
    ranges = liveness.ranges
    records = [(r.nbytes, r.first, r.last) for r in ranges]
    storages = [r.storage for r in ranges]
    may_share = dag_may_share(graph, storages) if parallel_safe else None
    offsets, arena = ASSIGNERS[assigner](records, alignment, may_share)
    return Arena(
        offsets={s: off for s, off in zip(storages, offsets)},
        sizes={s: -(-r.nbytes // alignment) * alignment for s, r in zip(storages, ranges)},
        arena=arena,
    )

"""Offsets in one arena: the fast heuristics, then the improving stages where they miss LOAD.

LOAD, the most bytes live at one step (after rounding sizes up to the
alignment), bounds every arena from below.  ``assign_offsets(..., "auto")`` runs
the cheap heuristics and stops at the first that reaches LOAD.  Otherwise, piece by
piece (instances split at steps no range crosses, each piece only needing to fit
under the global LOAD), worst piece first, it tries in turn, each from the best
packing so far and while the piece misses LOAD: bottom-up skyline packings under a
few priority rules (``skyline``), a squeaky-wheel search over their ranks
(``squeaky``), and a branch and bound (``search``).  Every stage has
a fixed work budget, so the result is deterministic and the cost bounded; only a
better packing replaces the one kept, so ``auto`` is the best of what it tried.

Parallel-safe plans.  A buffer may be reused only once the DAG orders its last
reader before the new producer.  Stretching each range over the steps of the ops
that may run concurrently with it is safe but not exact: happens-before in a DAG
is not an interval order (two parallel chains a1->a2, b1->b2 make a "2+2"
pattern no set of intervals reproduces), so stretched ranges forbid sharings the
DAG allows.  So ``assign`` takes the exact rule as a predicate ``may_share(i, j)``
(called with ``i < j``, only for records disjoint in time) and consults it only
where a placement would really put two records on the same bytes; callers that
prefer near-linear cost over the last bytes can pass stretched ranges and no
predicate.  With a predicate the search runs only on instances of at most
``SEARCH_PREDICATE_LIMIT`` records, since its conflict lists need every pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from mpplan.passes.assign.heuristics import best_fit, greedy_by_size, overlap_pairs, time_neighbours
from mpplan.passes.assign.records import (
    MayShare,
    OffsetAssignment,
    Record,
    arena_end,
    normalise,
    offset_result,
    sweep_load,
)
from mpplan.passes.assign.stages import (
    SEARCH_NODE_COST,
    SEARCH_PREDICATE_LIMIT,
    SEARCH_RECORD_LIMIT,
    SEARCH_WORK,
    SKYLINE_WORK,
    SQUEAKY_WORK,
    Found,
    StageBudget,
    conflicts_of,
    search_piece,
    skyline_stage,
    squeaky_stage,
)

OffsetAlgorithm = Literal["auto", "greedy_by_size", "best_fit", "search"]

OFFSET_ALGORITHMS: tuple[str, ...] = ("auto", "greedy_by_size", "best_fit", "search")

#: ``auto`` skips greedy by size when ranges overlap in more pairs than this (it walks them all).
GREEDY_PAIR_LIMIT = 5_000_000


def assign_offsets(
    records: Sequence[Record],
    alignment: int = 1,
    algorithm: OffsetAlgorithm = "auto",
    *,
    may_share: MayShare | None = None,
    max_nodes: int | None = None,
) -> OffsetAssignment:
    """Offsets for ``records`` in one arena, as small as the chosen algorithm finds.

    ``"greedy_by_size"``: largest first into the best-fitting gap (TFLite).
    ``"best_fit"``: in lifetime order into the best-fitting free block.
    ``"search"``: all the heuristics, then, where they miss LOAD, skyline packings,
    the squeaky-wheel search and the branch and bound; exhaustive (exact) when
    ``max_nodes`` suffices, best found otherwise.
    ``"auto"``: the same, stopping at the first stage that reaches LOAD.
    ``max_nodes`` bounds the search in placements (default: ``SEARCH_WORK`` divided
    by the size of the piece searched); zero-size records get offset 0.
    Deterministic: ties go to the lower record index.

    >>> offsets, arena = assign_offsets([(4, 0, 1), (4, 1, 2), (4, 2, 3)])
    >>> offsets, arena
    ((0, 4, 0), 8)
    >>> assign_offsets([(100, 0, 1), (60, 2, 3), (40, 2, 3)]).arena
    100
    """
    if algorithm not in OFFSET_ALGORITHMS:
        raise ValueError(f"assign_offsets: expected algorithm in {OFFSET_ALGORITHMS}, got {algorithm!r}")
    if max_nodes is not None and max_nodes < 0:
        raise ValueError(f"assign_offsets: expected max_nodes >= 0, got {max_nodes}")
    sizes, first, last = normalise(records, alignment)
    load = sweep_load(sizes, first, last)
    if algorithm == "greedy_by_size":
        offsets = greedy_by_size(sizes, first, last, may_share=may_share)
        return offset_result(offsets, sizes, load, algorithm, proven=False)
    if algorithm == "best_fit":
        offsets = best_fit(sizes, first, last, may_share=may_share)
        return offset_result(offsets, sizes, load, algorithm, proven=False)
    return _portfolio(sizes, first, last, load, may_share, max_nodes, search_always=algorithm == "search")


def _pieces(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> list[list[int]]:
    """Groups of non-empty records split at steps that no range crosses, in time order;
    each group by index, so that the stages, which break ties by local index, break them by id."""
    active = sorted([j for j in range(len(sizes)) if sizes[j]], key=first.__getitem__)  # stable: ties by index
    pieces: list[list[int]] = []
    reach = None
    for j in active:
        if reach is None or first[j] > reach:
            pieces.append([])
            reach = last[j]
        pieces[-1].append(j)
        reach = max(reach, last[j])
    return [sorted(piece) for piece in pieces]


def _portfolio(
    sizes: list[int],
    first: list[int],
    last: list[int],
    load: int,
    may_share: MayShare | None,
    max_nodes: int | None,
    *,
    search_always: bool,
) -> OffsetAssignment:
    """``auto`` and ``search``: the best heuristic per piece, then the improving stages where it still misses."""
    fitted = best_fit(sizes, first, last, may_share=may_share)
    if not search_always and arena_end(fitted, sizes) == load:
        # nothing beats LOAD, and every piece would keep best fit's offsets (first on ties): skip the
        # pair count, the pieces and the stages (a third of assign's time on the 100k-op plan)
        return offset_result(fitted, sizes, load, "best_fit", proven=True)
    active = [j for j in range(len(sizes)) if sizes[j]]
    candidates: list[tuple[str, list[int]]] = [("best_fit", fitted)]
    heavy = overlap_pairs(first, last, active, stop_above=GREEDY_PAIR_LIMIT) > GREEDY_PAIR_LIMIT
    nbrs = time_neighbours(first, last, active) if search_always or not heavy else {}  # shared by the variants
    for name, options in (
        ("greedy_by_size", {}),
        ("greedy_by_size", {"fit": "first"}),
        ("greedy_by_size", {"order": "size_length"}),
        ("greedy_by_size", {"order": "breadth"}),
        ("greedy_by_size", {"order": "breadth", "fit": "first"}),
    ):
        if heavy and not search_always:
            break
        if not search_always and any(arena_end(c[1], sizes) == load for c in candidates):
            break
        candidates.append((name, greedy_by_size(sizes, first, last, may_share=may_share, neighbours=nbrs, **options)))
    # with a predicate, records in different time pieces may still conflict: one piece
    pieces = [active] if may_share is not None else _pieces(sizes, first, last)
    offsets = [0] * len(sizes)
    source: list[str] = []  # what produced each piece's offsets
    arena_of: list[int] = []
    minimal: list[bool] = []  # piece proven minimal (or within LOAD, which is all that matters)
    for members in pieces:
        name, chosen = min(candidates, key=lambda c: arena_end(c[1], sizes, members))
        for j in members:
            offsets[j] = chosen[j]
        source.append(name)
        arena_of.append(arena_end(offsets, sizes, members))
        minimal.append(arena_of[-1] <= load)
    budget = StageBudget(SKYLINE_WORK, SQUEAKY_WORK, SEARCH_WORK if max_nodes is None else max_nodes)
    record_limit = SEARCH_PREDICATE_LIMIT if may_share is not None else SEARCH_RECORD_LIMIT

    def adopt(p: int, found: Found | None) -> None:
        if found is not None and found.arena < arena_of[p]:
            for j, o in zip(pieces[p], found.offsets):
                offsets[j] = o
            arena_of[p] = found.arena
            source[p] = found.name

    # improve the pieces that miss LOAD, worst first, while the budgets last
    for p in sorted(range(len(pieces)), key=lambda p: (-arena_of[p], p)):
        members = pieces[p]
        searchable = len(members) <= record_limit and budget.search > 0
        conflicts = None if minimal[p] else conflicts_of(members, first, last, nbrs, may_share, budget, searchable)
        if conflicts is None:
            continue
        local_sizes = [sizes[j] for j in members]
        local_first, local_last = [first[j] for j in members], [last[j] for j in members]
        packings = skyline_stage(local_sizes, local_first, local_last, conflicts, load, budget)
        if packings:
            adopt(p, packings[0][0])
        if packings and arena_of[p] > load:
            adopt(p, squeaky_stage(local_sizes, conflicts, [rank for _, rank in packings], load, budget))
        minimal[p] = arena_of[p] <= load
        size = len(members) + SEARCH_NODE_COST
        nodes = budget.search // size if max_nodes is None else budget.search
        if minimal[p] or not searchable or nodes <= 0:
            continue
        result = search_piece(members, sizes, first, last, conflicts, offsets, arena_of[p], load, nodes)
        budget.search -= result.nodes * (size if max_nodes is None else 1)
        adopt(p, Found(result.offsets, result.arena, "search"))
        minimal[p] = result.proven
    if not pieces:
        return offset_result(offsets, sizes, load, "best_fit", proven=True)
    worst = max(range(len(pieces)), key=lambda p: (arena_of[p], -p))
    # the worst piece alone needs the arena: proven there means proven overall
    return offset_result(offsets, sizes, load, source[worst], proven=minimal[worst])

"""The improving stages of offset assignment, run on one piece (local records) where the heuristics miss LOAD:
skyline packings under a few rank rules, a squeaky-wheel search over their ranks, and a branch and bound.

Every stage has a fixed work budget, so results are deterministic and the cost bounded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpplan.passes.assign.heuristics import overlap_pairs, time_neighbours
from mpplan.passes.assign.records import MayShare, arena_end
from mpplan.passes.assign.search import search_offsets
from mpplan.passes.assign.skyline import RANK_RULES, rank_by, skyline
from mpplan.passes.assign.squeaky import round_cost, squeaky_wheel

#: Default search budgets in work units: a placement (offsets) costs its piece's record
#: count plus ``SEARCH_NODE_COST``; a join-or-open choice (objects) twice the record
#: count.  Fixed numbers, not clock time, so plans are deterministic; each budget is
#: a second or a few of one core at most (a unit is roughly 0.2-0.3 microseconds).
#: The offset search comes after the skyline stages, which leave it the harder pieces.
SEARCH_WORK = 4_000_000
SEARCH_NODE_COST = 150
#: Largest piece the offset search takes on (one dive costs O(piece^2)).
SEARCH_RECORD_LIMIT = 2_000
#: With ``may_share``, conflict lists need the predicate on every pair: keep that quadratic step small.
SEARCH_PREDICATE_LIMIT = 1_500
#: Budgets of the skyline rules and of the squeaky-wheel search, in ``round_cost`` units
#: (one per record and per conflict-list entry of the piece packed; a unit is roughly
#: 0.1-0.3 microseconds): one to two seconds of one core each at most.
SKYLINE_WORK = 6_000_000
SQUEAKY_WORK = 5_000_000
#: The squeaky wheel runs only on pieces its budget gives at least this many rounds, and
#: starts from one more skyline rule per this many rounds (up to all of them).
SQUEAKY_MIN_ROUNDS = 10
SQUEAKY_ROUNDS_PER_START = 100


@dataclass(slots=True)
class StageBudget:
    """Work left to each improving stage, spent across the pieces (mutable: one per call)."""

    skyline: int
    squeaky: int
    search: int


@dataclass(frozen=True, slots=True)
class Found:
    """A stage's best packing of one piece: offsets in the piece's order, its arena, the stage."""

    offsets: tuple[int, ...]
    arena: int
    name: str


def conflicts_of(
    members: list[int],
    first: list[int],
    last: list[int],
    nbrs: dict[int, list[int]],
    may_share: MayShare | None,
    budget: StageBudget,
    searchable: bool,
) -> list[list[int]] | None:
    """Conflict lists of one piece in local indices (the order of ``members``), or None
    when no stage could afford them: building them costs as much as one skyline packing.

    Overlaps in time come from ``nbrs`` when it was built, else from a sweep over the
    piece; with a predicate, every pair disjoint in time is asked too (pieces of at
    most ``SEARCH_PREDICATE_LIMIT`` records only).
    """
    if may_share is not None and len(members) > SEARCH_PREDICATE_LIMIT:
        return None
    entries = len(members) + 2 * overlap_pairs(first, last, members)
    if not searchable and entries > budget.skyline and SQUEAKY_MIN_ROUNDS * entries > budget.squeaky:
        return None
    if not nbrs:
        nbrs = time_neighbours(first, last, members)
    local = {j: i for i, j in enumerate(members)}
    conflicts = [[local[k] for k in nbrs[j]] for j in members]
    if may_share is not None:
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                i, j = members[a], members[b]
                if (first[i] > last[j] or first[j] > last[i]) and not may_share(min(i, j), max(i, j)):
                    conflicts[a].append(b)
                    conflicts[b].append(a)
    return conflicts


def skyline_stage(
    sizes: list[int], first: list[int], last: list[int], conflicts: list[list[int]], load: int, budget: StageBudget
) -> list[tuple[Found, list[int]]]:
    """Skyline packings of a piece (local records) under ``RANK_RULES``, best first (ties in
    rule order), each with its rank; stops at LOAD or when the next would overrun the budget."""
    cost = round_cost(conflicts)
    packings: list[tuple[Found, list[int]]] = []
    for rule in RANK_RULES:
        if cost > budget.skyline or any(found.arena <= load for found, _ in packings):
            break
        budget.skyline -= cost
        rank = rank_by(rule, sizes, first, last, conflicts)
        packed = skyline(sizes, conflicts, rank)
        packings.append((Found(tuple(packed), arena_end(packed, sizes), "skyline"), rank))
    return sorted(packings, key=lambda packing: packing[0].arena)


def squeaky_stage(
    sizes: list[int], conflicts: list[list[int]], starts: list[list[int]], load: int, budget: StageBudget
) -> Found | None:
    """Squeaky wheel on a piece (local records) towards LOAD, from the best skyline ranks in turn.

    Where a search ends hinges on its start (even on how ties fell in it), so when the
    budget affords ``SQUEAKY_ROUNDS_PER_START`` rounds per start, it is shared between
    several starts, best rule first, rather than spent on one long search.
    """
    cost = round_cost(conflicts)
    rounds = budget.squeaky // cost
    if rounds < SQUEAKY_MIN_ROUNDS:
        return None  # too few rounds to climb from the skyline packing it starts from
    count = max(1, min(len(starts), rounds // SQUEAKY_ROUNDS_PER_START))
    share = budget.squeaky // count
    best: Found | None = None
    for start in starts[:count]:
        result = squeaky_wheel(sizes, conflicts, start, target=load, budget=share)
        budget.squeaky -= result.work
        if best is None or result.arena < best.arena:
            best = Found(result.offsets, result.arena, "squeaky_wheel")
        if best.arena <= load:
            break
    return best


@dataclass(frozen=True, slots=True)
class Scaled:
    """A search result scaled back from gcd units to bytes."""

    offsets: tuple[int, ...]
    arena: int
    proven: bool
    nodes: int


def search_piece(
    members: list[int],
    sizes: list[int],
    first: list[int],
    last: list[int],
    conflicts: list[list[int]],
    offsets: list[int],
    arena: int,
    load: int,
    budget: int,
) -> Scaled:
    """Run the branch and bound on one piece, in units of the gcd of its sizes."""
    unit = 0
    for j in members:
        unit = math.gcd(unit, sizes[j])
    result = search_offsets(
        [sizes[j] // unit for j in members],
        [first[j] for j in members],
        [last[j] for j in members],
        conflicts,
        lower_bound=load // unit,  # reaching the global LOAD is all that matters for this piece
        incumbent=[offsets[j] // unit for j in members],
        incumbent_arena=arena // unit,
        max_nodes=budget,
    )
    return Scaled(tuple(o * unit for o in result.offsets), result.arena * unit, result.proven, result.nodes)

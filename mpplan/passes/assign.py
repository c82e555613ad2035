"""Buffer assignment: offsets in one arena, or memonger-style shared objects.

Input is a list of live-range *records* ``(size, first, last)``: ``size`` bytes
live from step ``first`` through step ``last``, inclusive (so ``[a, b]`` and
``[b, c]`` overlap at ``b``).  Two records *conflict* when their ranges overlap
or when the optional ``may_share(i, j)`` says False; conflicting records must not
overlap in memory.

LOAD, the most bytes live at one step (after rounding sizes up to the
alignment), bounds every arena from below.  ``assign_offsets(..., "auto")`` runs
the cheap heuristics and stops at the first that reaches LOAD.  Otherwise, piece by
piece (instances split at steps no range crosses, each piece only needing to fit
under the global LOAD), worst piece first, it tries in turn, each from the best
packing so far and while the piece misses LOAD: bottom-up skyline packings under a
few priority rules (``assign_skyline``), a squeaky-wheel search over their ranks
(``assign_squeaky``), and a branch and bound (``assign_search``).  Every stage has
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

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mpplan.passes.assign_heuristics import best_fit, greedy_by_size, overlap_pairs, time_neighbours
from mpplan.passes.assign_objects import exact_objects, greedy_objects, size_objects
from mpplan.passes.assign_search import search_offsets
from mpplan.passes.assign_skyline import RANK_RULES, rank_by, skyline
from mpplan.passes.assign_squeaky import round_cost, squeaky_wheel

Record = tuple[int, int, int]
MayShare = Callable[[int, int], bool]
OffsetAlgorithm = Literal["auto", "greedy_by_size", "best_fit", "search"]
ObjectAlgorithm = Literal["greedy", "dp"]

OFFSET_ALGORITHMS: tuple[str, ...] = ("auto", "greedy_by_size", "best_fit", "search")
OBJECT_ALGORITHMS: tuple[str, ...] = ("greedy", "dp")

#: Default search budgets in work units: a placement (offsets) costs its piece's record
#: count plus ``SEARCH_NODE_COST``; a join-or-open choice (objects) twice the record
#: count.  Fixed numbers, not clock time, so plans are deterministic; each budget is
#: a second or a few of one core at most (a unit is roughly 0.2-0.3 microseconds).
#: The offset search comes after the skyline stages, which leave it the harder pieces.
SEARCH_WORK = 4_000_000
SEARCH_NODE_COST = 150
OBJECT_SEARCH_WORK = 5_000_000
#: Largest piece the offset search takes on (one dive costs O(piece^2)).
SEARCH_RECORD_LIMIT = 2_000
#: Largest input the exact object search takes on; beyond it ``dp`` keeps the best greedy.
OBJECT_SEARCH_RECORDS = 400
#: Fit tests greedy-by-size objects may spend in ``dp`` before giving up on it.
OBJECT_GREEDY_CHECKS = 5_000_000
#: With ``may_share``, conflict lists need the predicate on every pair: keep that quadratic step small.
SEARCH_PREDICATE_LIMIT = 1_500
#: ``auto`` skips greedy by size when ranges overlap in more pairs than this (it walks them all).
GREEDY_PAIR_LIMIT = 5_000_000
#: Budgets of the skyline rules and of the squeaky-wheel search, in ``round_cost`` units
#: (one per record and per conflict-list entry of the piece packed; a unit is roughly
#: 0.1-0.3 microseconds): one to two seconds of one core each at most.
SKYLINE_WORK = 6_000_000
SQUEAKY_WORK = 5_000_000
#: The squeaky wheel runs only on pieces its budget gives at least this many rounds, and
#: starts from one more skyline rule per this many rounds (up to all of them).
SQUEAKY_MIN_ROUNDS = 10
SQUEAKY_ROUNDS_PER_START = 100


@dataclass(frozen=True, slots=True)
class OffsetAssignment:
    """One offset per record (same order) in an arena of ``arena`` bytes.

    Invariant: records that conflict never overlap in memory; every offset and
    every rounded size is a multiple of the alignment; ``load <= arena``.
    ``optimal`` says the arena is proven minimal (it meets ``load``, or an
    exhaustive search found nothing smaller).  Unpacks as ``offsets, arena``.
    """

    offsets: tuple[int, ...]
    arena: int
    load: int
    algorithm: str
    optimal: bool

    def __iter__(self) -> Iterator[Any]:
        yield self.offsets
        yield self.arena


@dataclass(frozen=True, slots=True)
class SharedObjects:
    """Records grouped into objects: ``object_of[j]`` per record, ``object_sizes`` per object.

    Invariant: members of an object never conflict; an object is as large as its
    largest (rounded) member; ``total == sum(object_sizes) >= load``.
    """

    object_of: tuple[int, ...]
    object_sizes: tuple[int, ...]
    total: int
    load: int
    algorithm: str
    optimal: bool

    def offsets(self) -> tuple[int, ...]:
        """Per record, the offset of its object when objects are laid out back to back."""
        base, running = [], 0
        for size in self.object_sizes:
            base.append(running)
            running += size
        return tuple(base[o] for o in self.object_of)


def records_load(records: Sequence[Record], alignment: int = 1) -> int:
    """LOAD: the most bytes live at one step, sizes rounded up to ``alignment``.

    >>> records_load([(10, 0, 1), (20, 1, 2), (30, 3, 3)])
    30
    """
    sizes, first, last = _normalise(records, alignment)
    return _load(sizes, first, last)


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
    sizes, first, last = _normalise(records, alignment)
    load = _load(sizes, first, last)
    if algorithm == "greedy_by_size":
        offsets = greedy_by_size(sizes, first, last, may_share=may_share)
        return _result(offsets, sizes, load, algorithm, proven=False)
    if algorithm == "best_fit":
        offsets = best_fit(sizes, first, last, may_share=may_share)
        return _result(offsets, sizes, load, algorithm, proven=False)
    return _portfolio(sizes, first, last, load, may_share, max_nodes, search_always=algorithm == "search")


def share_objects(
    records: Sequence[Record],
    algorithm: ObjectAlgorithm = "greedy",
    may_share: MayShare | None = None,
    alignment: int = 1,
    *,
    max_nodes: int | None = None,
) -> SharedObjects:
    """Group records into shared objects (memonger's blob sharing); minimise the total size.

    ``"greedy"``: memonger's greedy (lifetime order, reuse the free object nearest
    in size).  ``"dp"``: the better of that and greedy by size, improved by an exact
    branch and bound bounded by ``max_nodes`` choices (default: ``OBJECT_SEARCH_WORK``
    divided by the input size); inputs over ``OBJECT_SEARCH_RECORDS`` records keep
    the better greedy.  Exact whenever the search finishes (``optimal``).

    >>> shared = share_objects([(8, 0, 1), (4, 2, 3), (8, 2, 3)], "dp")
    >>> shared.object_of, shared.object_sizes, shared.total
    ((0, 1, 0), (8, 4), 12)
    """
    if algorithm not in OBJECT_ALGORITHMS:
        raise ValueError(f"share_objects: expected algorithm in {OBJECT_ALGORITHMS}, got {algorithm!r}")
    sizes, first, last = _normalise(records, alignment)
    load = _load(sizes, first, last)
    found = greedy_objects(sizes, first, last, may_share=may_share)
    if algorithm == "dp":
        by_size = size_objects(sizes, first, last, may_share=may_share, max_checks=OBJECT_GREEDY_CHECKS)
        if by_size is not None and sum(by_size.sizes) < sum(found.sizes):
            found = by_size
        records_in = sum(1 for s in sizes if s)
        if records_in <= OBJECT_SEARCH_RECORDS:
            budget = max_nodes if max_nodes is not None else max(1, OBJECT_SEARCH_WORK // (2 * records_in + 1))
            found = exact_objects(sizes, first, last, may_share=may_share, incumbent=found, max_nodes=budget)
    total = sum(found.sizes)
    return SharedObjects(found.object_of, found.sizes, total, load, algorithm, found.proven or total == load)


# ---------------------------------------------------------------------------------------------
# internals


def _normalise(records: Sequence[Record], alignment: int) -> tuple[list[int], list[int], list[int]]:
    """Check the records and alignment; sizes rounded up to the alignment."""
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"assign: expected a positive integer alignment, got {alignment!r}")
    sizes, first, last = [], [], []
    for j, record in enumerate(records):
        try:
            size, lo, hi = record
        except (TypeError, ValueError):
            raise ValueError(f"assign: record #{j}: expected (size, first, last), got {record!r}") from None
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (size, lo, hi)):
            raise ValueError(f"assign: record #{j}: expected integers (size, first, last), got {record!r}")
        if size < 0:
            raise ValueError(f"assign: record #{j}: expected size >= 0, got {size}")
        if lo > hi:
            raise ValueError(f"assign: record #{j}: expected first <= last, got {lo}..{hi}")
        sizes.append(-(-size // alignment) * alignment)
        first.append(lo)
        last.append(hi)
    return sizes, first, last


def _load(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> int:
    """Peak of live bytes over steps, by a sweep over range ends (steps need not be dense)."""
    events: dict[int, int] = {}
    for s, lo, hi in zip(sizes, first, last):
        if s:
            events[lo] = events.get(lo, 0) + s
            events[hi + 1] = events.get(hi + 1, 0) - s
    running = peak = 0
    for step in sorted(events):
        running += events[step]
        peak = max(peak, running)
    return peak


def _arena(offsets: Sequence[int], sizes: Sequence[int], members: Sequence[int] | None = None) -> int:
    idx = range(len(sizes)) if members is None else members
    return max((offsets[j] + sizes[j] for j in idx if sizes[j]), default=0)


def _result(offsets: Sequence[int], sizes: Sequence[int], load: int, algorithm: str, proven: bool) -> OffsetAssignment:
    clean = tuple(o if s else 0 for o, s in zip(offsets, sizes))
    arena = _arena(clean, sizes)
    return OffsetAssignment(clean, arena, load, algorithm, proven or arena == load)


def _pieces(sizes: Sequence[int], first: Sequence[int], last: Sequence[int]) -> list[list[int]]:
    """Groups of non-empty records split at steps that no range crosses, in time order;
    each group by index, so that the stages, which break ties by local index, break them by id."""
    active = sorted((j for j in range(len(sizes)) if sizes[j]), key=lambda j: (first[j], j))
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
    active = [j for j in range(len(sizes)) if sizes[j]]
    candidates: list[tuple[str, list[int]]] = [("best_fit", best_fit(sizes, first, last, may_share=may_share))]
    heavy = overlap_pairs(first, last, active) > GREEDY_PAIR_LIMIT
    nbrs = time_neighbours(first, last, active) if search_always or not heavy else {}  # shared by the variants
    for name, options in (
        ("greedy_by_size", {}),
        ("greedy_by_size", {"fit": "first"}),
        ("greedy_by_size", {"order": "size_length"}),
    ):
        if heavy and not search_always:
            break
        if not search_always and any(_arena(c[1], sizes) == load for c in candidates):
            break
        candidates.append((name, greedy_by_size(sizes, first, last, may_share=may_share, neighbours=nbrs, **options)))
    # with a predicate, records in different time pieces may still conflict: one piece
    pieces = [active] if may_share is not None else _pieces(sizes, first, last)
    offsets = [0] * len(sizes)
    source: list[str] = []  # what produced each piece's offsets
    arena_of: list[int] = []
    minimal: list[bool] = []  # piece proven minimal (or within LOAD, which is all that matters)
    for members in pieces:
        name, chosen = min(candidates, key=lambda c: _arena(c[1], sizes, members))
        for j in members:
            offsets[j] = chosen[j]
        source.append(name)
        arena_of.append(_arena(offsets, sizes, members))
        minimal.append(arena_of[-1] <= load)
    budget = _Budget(SKYLINE_WORK, SQUEAKY_WORK, SEARCH_WORK if max_nodes is None else max_nodes)
    record_limit = SEARCH_PREDICATE_LIMIT if may_share is not None else SEARCH_RECORD_LIMIT

    def adopt(p: int, found: _Found | None) -> None:
        if found is not None and found.arena < arena_of[p]:
            for j, o in zip(pieces[p], found.offsets):
                offsets[j] = o
            arena_of[p] = found.arena
            source[p] = found.name

    # improve the pieces that miss LOAD, worst first, while the budgets last
    for p in sorted(range(len(pieces)), key=lambda p: (-arena_of[p], p)):
        members = pieces[p]
        searchable = len(members) <= record_limit and budget.search > 0
        conflicts = None if minimal[p] else _conflicts(members, first, last, nbrs, may_share, budget, searchable)
        if conflicts is None:
            continue
        local_sizes = [sizes[j] for j in members]
        local_first, local_last = [first[j] for j in members], [last[j] for j in members]
        packings = _skyline_stage(local_sizes, local_first, local_last, conflicts, load, budget)
        if packings:
            adopt(p, packings[0][0])
        if packings and arena_of[p] > load:
            adopt(p, _squeaky_stage(local_sizes, conflicts, [rank for _, rank in packings], load, budget))
        minimal[p] = arena_of[p] <= load
        size = len(members) + SEARCH_NODE_COST
        nodes = budget.search // size if max_nodes is None else budget.search
        if minimal[p] or not searchable or nodes <= 0:
            continue
        result = _search_piece(members, sizes, first, last, conflicts, offsets, arena_of[p], load, nodes)
        budget.search -= result.nodes * (size if max_nodes is None else 1)
        adopt(p, _Found(result.offsets, result.arena, "search"))
        minimal[p] = result.proven
    if not pieces:
        return _result(offsets, sizes, load, "best_fit", proven=True)
    worst = max(range(len(pieces)), key=lambda p: (arena_of[p], -p))
    # the worst piece alone needs the arena: proven there means proven overall
    return _result(offsets, sizes, load, source[worst], proven=minimal[worst])


@dataclass(slots=True)
class _Budget:
    """Work left to each improving stage, spent across the pieces (mutable: one per call)."""

    skyline: int
    squeaky: int
    search: int


@dataclass(frozen=True, slots=True)
class _Found:
    """A stage's best packing of one piece: offsets in the piece's order, its arena, the stage."""

    offsets: tuple[int, ...]
    arena: int
    name: str


def _conflicts(
    members: list[int],
    first: list[int],
    last: list[int],
    nbrs: dict[int, list[int]],
    may_share: MayShare | None,
    budget: _Budget,
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


def _skyline_stage(
    sizes: list[int], first: list[int], last: list[int], conflicts: list[list[int]], load: int, budget: _Budget
) -> list[tuple[_Found, list[int]]]:
    """Skyline packings of a piece (local records) under ``RANK_RULES``, best first (ties in
    rule order), each with its rank; stops at LOAD or when the next would overrun the budget."""
    cost = round_cost(conflicts)
    packings: list[tuple[_Found, list[int]]] = []
    for rule in RANK_RULES:
        if cost > budget.skyline or any(found.arena <= load for found, _ in packings):
            break
        budget.skyline -= cost
        rank = rank_by(rule, sizes, first, last, conflicts)
        packed = skyline(sizes, conflicts, rank)
        packings.append((_Found(tuple(packed), _arena(packed, sizes), "skyline"), rank))
    return sorted(packings, key=lambda packing: packing[0].arena)


def _squeaky_stage(
    sizes: list[int], conflicts: list[list[int]], starts: list[list[int]], load: int, budget: _Budget
) -> _Found | None:
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
    best: _Found | None = None
    for start in starts[:count]:
        result = squeaky_wheel(sizes, conflicts, start, target=load, budget=share)
        budget.squeaky -= result.work
        if best is None or result.arena < best.arena:
            best = _Found(result.offsets, result.arena, "squeaky_wheel")
        if best.arena <= load:
            break
    return best


@dataclass(frozen=True, slots=True)
class _Scaled:
    """A search result scaled back from gcd units to bytes."""

    offsets: tuple[int, ...]
    arena: int
    proven: bool
    nodes: int


def _search_piece(
    members: list[int],
    sizes: list[int],
    first: list[int],
    last: list[int],
    conflicts: list[list[int]],
    offsets: list[int],
    arena: int,
    load: int,
    budget: int,
) -> _Scaled:
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
    return _Scaled(tuple(o * unit for o in result.offsets), result.arena * unit, result.proven, result.nodes)

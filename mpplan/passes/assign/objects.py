"""Shared objects: memonger's blob sharing, greedy and exact (``share_objects``).

An *object* is one buffer that several records use in turn; members must be
pairwise disjoint in time (and allowed to share by ``may_share``), and the object
is as large as its largest member.  The cost of a sharing is the sum of object
sizes.  Records of size 0 each get an object of size 0 of their own.

``greedy_objects`` is memonger's greedy: records in lifetime order, each reusing
the free object closest to it in size.  ``size_objects`` is greedy by size (as in
TFLite's shared-object planner): records in decreasing size, each joining the
smallest compatible object.  ``exact_objects`` is a branch and bound (the role of
memonger's DP) over the same decisions: in decreasing size an object costs what
its first member costs, and each record joins a compatible object or opens one.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal, TypeAlias

from mpplan.passes.assign.records import MayShare, Record, SharedObjects, normalise, sweep_load


ObjectAlgorithm = Literal["greedy", "dp"]

OBJECT_ALGORITHMS: tuple[str, ...] = ("greedy", "dp")

#: Work units the exact object search may spend: a join-or-open choice costs twice the record count.
#: A fixed number, not clock time, so plans are deterministic.
OBJECT_SEARCH_WORK = 5_000_000
#: Largest input the exact object search takes on; beyond it ``dp`` keeps the best greedy.
OBJECT_SEARCH_RECORDS = 400
#: Fit tests greedy-by-size objects may spend in ``dp`` before giving up on it.
OBJECT_GREEDY_CHECKS = 5_000_000
#: A search level: a generator that yields, per child, the generator of the level below.
_Expansion: TypeAlias = Iterator["_Expansion"]


@dataclass(frozen=True, slots=True)
class ObjectsResult:
    """``object_of[j]`` for each record, ``sizes`` per object, whether the total is proven minimal."""

    object_of: tuple[int, ...]
    sizes: tuple[int, ...]
    proven: bool


def _may(j: int, k: int, may_share: MayShare | None) -> bool:
    if may_share is None:
        return True
    return may_share(j, k) if j < k else may_share(k, j)


def _shares_with_all(j: int, members: list[list[int]], may_share: MayShare, obj: int) -> bool:
    return all(_may(j, k, may_share) for k in members[obj])


def _renumber(object_of: list[int], sizes: Sequence[int], n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Objects numbered by their lowest member index; zero-size records get their own objects."""
    names: dict[int, int] = {}
    out = [0] * n
    obj_sizes: list[int] = []
    for j in range(n):
        key = object_of[j]
        if key < 0:
            out[j] = len(obj_sizes)
            obj_sizes.append(0)
            continue
        if key not in names:
            names[key] = len(obj_sizes)
            obj_sizes.append(0)
        out[j] = names[key]
        obj_sizes[out[j]] = max(obj_sizes[out[j]], sizes[j])
    return tuple(out), tuple(obj_sizes)


def greedy_objects(
    sizes: Sequence[int], first: Sequence[int], last: Sequence[int], *, may_share: MayShare | None = None
) -> ObjectsResult:
    """Memonger's greedy: by first step (ties: index), reuse the free object nearest in size.

    An object is free once its current member's last step has passed.  Ties in
    size distance prefer the object that need not grow, then the older object.
    O(n log n) plus, with ``may_share``, a check against each member of a candidate.
    """
    n = len(sizes)
    object_of = [-1] * n
    members: list[list[int]] = []
    obj_size: list[int] = []
    free: list[tuple[int, int]] = []  # (size, object)
    busy: list[tuple[int, int]] = []  # (last step, object)
    for j in sorted((j for j in range(n) if sizes[j] > 0), key=lambda k: (first[k], k)):
        while busy and busy[0][0] < first[j]:
            _, obj = heapq.heappop(busy)
            bisect.insort(free, (obj_size[obj], obj))
        allowed = None if may_share is None else partial(_shares_with_all, j, members, may_share)
        pos = _pick_free(free, sizes[j], allowed)
        chosen = -1
        if pos >= 0:
            chosen = free.pop(pos)[1]
        if chosen < 0:
            chosen = len(members)
            members.append([])
            obj_size.append(0)
        members[chosen].append(j)
        obj_size[chosen] = max(obj_size[chosen], sizes[j])
        object_of[j] = chosen
        heapq.heappush(busy, (last[j], chosen))
    out, obj_sizes = _renumber(object_of, sizes, n)
    return ObjectsResult(out, obj_sizes, False)


def _pick_free(free: list[tuple[int, int]], size: int, allowed: Callable[[int], bool] | None) -> int:
    """Position in ``free`` (sorted (size, object) pairs) of the object nearest ``size``, or -1.

    Nearest by absolute size difference; ties prefer an object that need not grow,
    then the lower object id.  With ``allowed``, the nearest object it accepts.
    """

    def key(pos: int) -> tuple[int, bool, int]:
        obj_size, obj = free[pos]
        return abs(obj_size - size), obj_size < size, obj

    if allowed is None:
        up = bisect.bisect_left(free, (size, -1))
        candidates = [up] if up < len(free) else []
        if up > 0:
            candidates.append(bisect.bisect_left(free, (free[up - 1][0], -1)))
        return min(candidates, key=key, default=-1)
    return next((pos for pos in sorted(range(len(free)), key=key) if allowed(free[pos][1])), -1)


def size_objects(
    sizes: Sequence[int],
    first: Sequence[int],
    last: Sequence[int],
    *,
    may_share: MayShare | None = None,
    max_checks: int,
) -> ObjectsResult | None:
    """Greedy by size: largest record first, into the smallest object it fits in time, else a new one.

    Each object keeps its members' ranges sorted, so a fit test is one bisection;
    a record tests objects smallest first.  Returns None once ``max_checks`` fit
    tests are spent (so callers can bound it on huge inputs).
    """
    n = len(sizes)
    object_of = [-1] * n
    starts: list[list[int]] = []  # per object, member first steps, sorted
    ends: list[list[int]] = []  # the matching last steps
    members: list[list[int]] = []
    checks = 0
    for j in sorted((j for j in range(n) if sizes[j] > 0), key=lambda k: (-sizes[k], k)):
        lo, hi = first[j], last[j]
        chosen = -1
        # objects are created in decreasing size, so the newest is the smallest
        for obj in range(len(members) - 1, -1, -1):
            checks += 1
            if checks > max_checks:
                return None
            i = bisect.bisect_left(starts[obj], lo)
            if i < len(starts[obj]) and starts[obj][i] <= hi:
                continue  # a member starts inside j's range
            if i > 0 and ends[obj][i - 1] >= lo:
                continue  # the member before j still lives at j's start
            if may_share is not None and not all(_may(j, k, may_share) for k in members[obj]):
                continue
            chosen = obj
            starts[obj].insert(i, lo)
            ends[obj].insert(i, hi)
            break
        if chosen < 0:
            chosen = len(members)
            starts.append([lo])
            ends.append([hi])
            members.append([])
        members[chosen].append(j)
        object_of[j] = chosen
    out, obj_sizes = _renumber(object_of, sizes, n)
    return ObjectsResult(out, obj_sizes, False)


class _OutOfBudget(Exception):
    """Raised inside the search when the node budget is spent."""


def exact_objects(
    sizes: Sequence[int],
    first: Sequence[int],
    last: Sequence[int],
    *,
    may_share: MayShare | None = None,
    incumbent: ObjectsResult | None = None,
    max_nodes: int,
) -> ObjectsResult:
    """Minimum total object size by branch and bound, starting from ``incumbent``.

    Records go in decreasing size (ties: index), so an object costs its opener's
    size and later members join for free.  Lower bound at a node: at every step,
    the unassigned records live there need distinct objects; each object with no
    member live there can take one of them for free (say the largest), the rest pay
    at least their own size.  Returns the best found within ``max_nodes`` choices;
    ``proven`` when the search finished or the incumbent meets the root bound.
    """
    n = len(sizes)
    if incumbent is None:
        incumbent = greedy_objects(sizes, first, last, may_share=may_share)
    search = _ObjectSearch(sizes, first, last, may_share)
    best_total = sum(incumbent.sizes)
    if best_total <= search.root_bound():
        return ObjectsResult(incumbent.object_of, incumbent.sizes, True)
    best: list[int] | None = None
    proven = False
    try:
        for assignment, total in search.solutions(best_total, max_nodes):
            best, best_total = assignment, total
        proven = True
    except _OutOfBudget:
        pass
    if best is None:
        return ObjectsResult(incumbent.object_of, incumbent.sizes, proven)
    out, obj_sizes = _renumber(best, sizes, n)
    return ObjectsResult(out, obj_sizes, proven)


class _ObjectSearch:
    """Depth-first join-or-open search over the records in decreasing size."""

    def __init__(
        self, sizes: Sequence[int], first: Sequence[int], last: Sequence[int], may_share: MayShare | None
    ) -> None:
        self.n = len(sizes)
        self.sizes = sizes
        self.first = first
        self.last = last
        self.may_share = may_share
        self.order = sorted((j for j in range(self.n) if sizes[j] > 0), key=lambda k: (-sizes[k], k))
        coords = sorted({first[j] for j in self.order} | {last[j] for j in self.order})
        where = {c: i for i, c in enumerate(coords)}
        self.steps = len(coords)
        self.window = {j: (where[first[j]], where[last[j]] + 1) for j in self.order}
        # per step, prefix sums of the sizes of the records live there, in search order:
        # records are assigned in that order, so the unassigned ones are always a suffix
        self.prefix: list[list[int]] = [[0] for _ in range(self.steps)]
        for j in self.order:
            lo, hi = self.window[j]
            for t in range(lo, hi):
                self.prefix[t].append(self.prefix[t][-1] + sizes[j])

    def root_bound(self) -> int:
        return max((p[-1] for p in self.prefix), default=0)

    def solutions(self, best_total: int, max_nodes: int) -> Iterator[tuple[list[int], int]]:
        """Yield each strictly better complete assignment; return once the space is exhausted."""
        order, sizes, prefix = self.order, self.sizes, self.prefix
        objects: list[list[int]] = []
        assigned = [-1] * self.n
        cost = 0
        nodes = 0

        def bound() -> int:
            # at a step, the assigned records live there hold distinct objects and the idle
            # objects can absorb the next largest records: all but the first len(objects)
            # records live there (in search order) must open objects of at least their size
            count = len(objects)
            return cost + max(p[-1] - p[min(len(p) - 1, count)] for p in prefix)

        def fits(j: int, obj: int) -> bool:
            lo, hi = self.first[j], self.last[j]
            for k in objects[obj]:
                if self.first[k] <= hi and lo <= self.last[k]:
                    return False
                if self.may_share is not None and not _may(j, k, self.may_share):
                    return False
            return True

        def expand(depth: int) -> _Expansion:
            nonlocal nodes, cost
            j = order[depth]
            # join the smallest compatible object first (keep big ones for big records), else open one
            joinable = sorted((o for o in range(len(objects)) if fits(j, o)), key=lambda o: (sizes[objects[o][0]], o))
            for obj in joinable + [len(objects)]:
                nodes += 1
                if nodes > max_nodes:
                    raise _OutOfBudget
                if obj == len(objects):
                    objects.append([])
                    cost += sizes[j]
                objects[obj].append(j)
                assigned[j] = obj
                if bound() < best_total:
                    yield expand(depth + 1)
                assigned[j] = -1
                objects[obj].pop()
                if not objects[obj]:
                    objects.pop()
                    cost -= sizes[j]

        stack = [expand(0)]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
            elif len(stack) == len(order):
                best_total = cost  # later leaves must beat this one
                yield list(assigned), cost
            else:
                stack.append(child)


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
    sizes, first, last = normalise(records, alignment)
    load = sweep_load(sizes, first, last)
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

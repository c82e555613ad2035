"""One chain walk of the budget greedy: the moves grown from one unchosen candidate
(it alone, then with its producers level by level, as in Chen's segments), their
estimated gains as terms, and what the walk read of the choice (so ``MoveCache`` in
``mpplan.passes.remat.moves`` knows when it goes stale)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mpplan.passes.remat.model import NEVER, RematModel

__all__ = ["CHAIN_LEVELS", "CHAIN_MAX_OPS", "Chain", "anchor_of", "walk"]

#: A chain move has at most this many levels (the candidate and its producers' levels
#: above it) and this many candidates.
CHAIN_LEVELS = 6
CHAIN_MAX_OPS = 8


@dataclass(frozen=True, slots=True)
class Chain:
    """One origin's walk.

    ``moves``: (members, how many of ``terms`` make its gain), one per level;
    ``terms``: (signed bytes, x, y), each worth ``bytes * over(x, y)``; ``tests``:
    (x, y, whether ``over(x, y)`` was 0) for the growth decisions; ``chosen_reads``:
    candidates whose being chosen it read; ``anchor_reads``: (candidate, where its
    recompute would run) for the anchors it read.  The walk comes out the same while
    none of these read otherwise.
    """

    moves: tuple[tuple[tuple[int, ...], int], ...]
    terms: tuple[tuple[int, int, int], ...]
    tests: tuple[tuple[int, int, bool], ...]
    chosen_reads: tuple[int, ...]
    anchor_reads: tuple[tuple[int, int], ...]


def walk(model: RematModel, anchor: dict[int, int], i: int, over: Callable[[int, int], int]) -> Chain:
    """The moves grown from unchosen candidate ``i``: ``i`` alone, then with each further
    level of producers of the inputs the members would keep alive.

    A member's input is kept alive by its recompute when it is not recomputed and its
    last use comes before the member's anchor; when that adds life at steps over the
    budget, its producer, when a candidate, joins the next level and runs right before
    that member (a chain).  Growth stops at ``CHAIN_LEVELS`` levels, at
    ``CHAIN_MAX_OPS`` members, or when no input is kept alive over the budget.  The
    gain is over-budget byte-steps freed: the members' outputs between their last
    early use and their recompute, less the kept inputs' extra life until the latest
    recompute reading them; it is updated member by member, so a chain costs what its
    members read.
    """
    at = anchor_of(model, anchor, i)
    anchor_reads = [(i, at)]
    if at >= NEVER:
        return Chain((), (), (), (), tuple(anchor_reads))
    size, early_last, last, producer = model.size, model.early_last, model.last, model.producer
    cand_inputs = model.cand_inputs
    members: dict[int, int] = {}
    extended: dict[int, int] = {}  # kept input -> the latest anchor reading it
    terms: list[tuple[int, int, int]] = []
    tests: list[tuple[int, int, bool]] = []
    chosen_reads: list[int] = []
    moves: list[tuple[tuple[int, ...], int]] = []

    def add(member: int, at: int) -> None:
        members[member] = at
        for j in model.cand_outputs[member]:
            terms.append((size[j], early_last[j], at))
            if j in extended:  # no longer kept: its extra life is not paid
                terms.append((size[j], last[j], extended.pop(j)))
        for j in cand_inputs[member]:
            p = producer[j]
            if p in members:
                continue
            if p >= 0:
                chosen_reads.append(p)
            if p in anchor or extended.get(j, -1) >= at:
                continue
            if j in extended:
                terms.append((size[j], last[j], extended[j]))
            extended[j] = at
            terms.append((-size[j], last[j], at))

    add(i, at)
    frontier = [i]
    for _ in range(CHAIN_LEVELS - 1):
        moves.append((tuple(sorted(members)), len(terms)))
        grown: dict[int, int] = {}
        for member in frontier:
            at = members[member]
            for j in cand_inputs[member]:
                p = producer[j]
                if p < 0:
                    continue
                chosen_reads.append(p)
                if p in anchor or p in members:
                    continue
                zero = over(last[j], at) == 0
                tests.append((last[j], at, zero))
                if zero:
                    continue
                at_p = anchor_of(model, anchor, p)
                anchor_reads.append((p, at_p))
                grown[p] = min(grown.get(p, NEVER), at, at_p)
        if not grown or len(members) + len(grown) > CHAIN_MAX_OPS:
            break
        for p, at in grown.items():
            add(p, at)
        frontier = list(grown)
    else:
        moves.append((tuple(sorted(members)), len(terms)))
    return Chain(tuple(moves), tuple(terms), tuple(tests), tuple(set(chosen_reads)), tuple(anchor_reads))


def anchor_of(model: RematModel, anchor: dict[int, int], i: int) -> int:
    """Where candidate ``i``'s recompute would run if chosen now: before its first late
    use or before the earliest chosen recompute reading it (``NEVER``: not needed)."""
    at = model.cand_first_late[i]
    for c in model.cand_consumers[i]:
        if c in anchor and anchor[c] < at:
            at = anchor[c]
    return at


"""The budget greedy's moves and their ranking, kept up to date as the choice changes.

A *move* is a candidate alone or with its chain: the producers of the inputs its
recompute would keep alive, level by level, as in Chen's segments (recomputing one
link of a chain of equal-sized tensors frees nothing, the whole segment frees all but
its head).  Its estimated gain is the over-budget byte-steps it frees: its members'
outputs between their last early use and their recompute, less the kept inputs'
extra life until the latest recompute reading them (``mpplan.passes.remat.chains``).  ``ranked`` orders
the moves by gain per unit cost (or by gain), best first.

Every gain is a sum of terms ``bytes * over(x, y)``, ``over(x, y)`` being the steps
over the budget strictly between original ops ``x`` and ``y``; the walk that finds a
candidate's chain reads the choice only through which candidates near it are chosen
and where they run, and through whether some ``over(x, y)`` are zero.  So the cache
keeps, for each unchosen candidate (the chain's *origin*), its moves as terms, the
candidates it read and the zero tests it made.  A ranking walks again only the chains
that read a candidate whose anchor changed (``note_moved``) or whose zero tests came
out otherwise, and scores the terms of all chains in one vectorised pass.  The
ranking is the one a fresh walk of every chain gives.

Example: in a chain of four layers trained, the first activation waits longest for
its backward, so recomputing it frees the most.

>>> from mpplan.capture import synthetic
>>> from mpplan.passes.remat.choice import Choice
>>> from mpplan.passes.remat.model import build_model
>>> model = build_model(synthetic.chain(4, train=True))
>>> choice = Choice.build(model)
>>> moves = choice.ranked(choice.load - 1, levels=CHAIN_LEVELS, limit=2)
>>> [[model.candidate_names()[i] for i in move] for move in moves]
[['layers.0'], ['layers.1']]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from mpplan.passes.remat.chains import CHAIN_LEVELS, CHAIN_MAX_OPS, Chain, anchor_of, walk
from mpplan.passes.remat.model import RematModel

__all__ = ["CHAIN_LEVELS", "CHAIN_MAX_OPS", "MoveCache", "in_order", "steps_over"]

#: Rows are compacted once the dead ones outnumber the live ones by this much.
COMPACT_SLACK = 4096


class _Rows:
    """Append-only columns of rows tagged with the origin and generation of the chain
    they belong to; a row is live while its origin's generation is its own."""

    __slots__ = ("columns", "size")

    def __init__(self, **dtypes: type) -> None:
        self.columns: dict[str, np.ndarray] = {
            name: np.zeros(64, dtype) for name, dtype in {"origin": np.int64, "gen": np.int64, **dtypes}.items()
        }
        self.size = 0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name][: self.size]

    def append(self, values: Mapping[str, Sequence[float]]) -> None:
        end = self.size + len(values["origin"])
        for name, column in self.columns.items():
            if end > len(column):
                grown = np.zeros(max(end, 2 * len(column)), column.dtype)
                grown[: self.size] = column[: self.size]
                self.columns[name] = column = grown
            column[self.size : end] = values[name]
        self.size = end

    def live(self, gen: np.ndarray) -> np.ndarray:
        return self["gen"] == gen[self["origin"]]

    def compact(self, keep: np.ndarray) -> None:
        count = int(keep.sum())
        for column in self.columns.values():
            column[:count] = column[: self.size][keep]
        self.size = count

    def copy(self) -> _Rows:
        twin = _Rows.__new__(_Rows)
        twin.columns = {name: column[: max(self.size, 1)].copy() for name, column in self.columns.items()}
        twin.size = self.size
        return twin


class MoveCache:
    """The chains of one choice's unchosen candidates, walked again only when stale
    (module docstring).

    ``gen[i]``: origin ``i``'s generation (rows of older ones are dead); ``terms``,
    ``moves`` (with ``members``, parallel), ``tests`` and ``reads`` (a candidate, and
    the anchor read, or -1 for whether it is chosen): the chains' rows; ``counts[i]``:
    origin ``i``'s live term rows; ``stale``: origins to walk at the next ranking;
    ``moved``/``toggled``: candidates whose anchor changed / that started or stopped
    running since the last one.
    """

    __slots__ = ("model", "producers", "gen", "terms", "moves", "members", "tests", "reads", "counts", "stale",
                 "moved", "toggled")

    def __init__(self, model: RematModel, producers: tuple[tuple[int, ...], ...]) -> None:
        self.model, self.producers = model, producers
        self.gen = np.zeros(model.num_candidates, np.int64)
        self.terms = _Rows(coef=np.int64, x=np.int64, y=np.int64)
        self.moves = _Rows(level=np.int64, first=np.int64, last=np.int64, cost=np.float64,
                           **{f"m{k}": np.int64 for k in range(CHAIN_MAX_OPS)})
        self.members: list[tuple[int, ...]] = []
        self.tests = _Rows(x=np.int64, y=np.int64, zero=np.bool_)
        self.reads = _Rows(cand=np.int64, value=np.int64)
        self.counts = np.zeros(model.num_candidates, np.int64)
        self.stale = set(range(model.num_candidates))
        self.moved: set[int] = set()
        self.toggled: set[int] = set()

    def copy(self) -> MoveCache:
        twin = MoveCache.__new__(MoveCache)
        twin.model, twin.producers, twin.gen = self.model, self.producers, self.gen.copy()
        twin.terms, twin.moves, twin.tests, twin.reads = (
            self.terms.copy(), self.moves.copy(), self.tests.copy(), self.reads.copy())
        twin.members, twin.counts = list(self.members), self.counts.copy()
        twin.stale, twin.moved, twin.toggled = set(self.stale), set(self.moved), set(self.toggled)
        return twin

    def note_moved(self, moved: Iterable[int], toggled: Iterable[int]) -> None:
        """Candidates whose anchor changed, and those of them that started or stopped running."""
        self.moved.update(moved)
        self.toggled.update(toggled)

    def ranked(
        self,
        anchor: dict[int, int],
        over_counts: tuple[np.ndarray, np.ndarray],
        *,
        levels: int,
        per_cost: bool,
        banned: frozenset[int],
        limit: int,
    ) -> list[tuple[int, ...]]:
        """The best ``limit`` moves of up to ``levels`` levels that free over-budget
        bytes and avoid ``banned``, by estimated gain per unit cost (or by gain,
        ``per_cost=False``), best first; ties go to the smaller move.  ``anchor`` is the
        choice's (candidate -> where it runs), ``over_counts`` its ``Choice.over_counts``
        at the budget."""
        through, own = over_counts
        ahead = through - own

        def over(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return steps_over(through, ahead, x, y)

        self._refresh(anchor, through, own, over)
        # Gains as differences of one running sum over every term row; int64 may wrap
        # in the running sum, never in a difference (one chain's gain).
        terms, moves = self.terms, self.moves
        with np.errstate(over="ignore"):
            running = np.concatenate(([0], np.cumsum(terms["coef"] * over(terms["x"], terms["y"]))))
            gain = running[moves["last"]] - running[moves["first"]]
        which = np.nonzero(moves.live(self.gen) & (moves["level"] <= levels) & (gain > 0))[0]
        gain = gain[which]
        score = -gain / np.maximum(moves["cost"][which], 1e-9) if per_cost else -gain
        return self._best(which, score, banned, limit)

    def _best(self, which: np.ndarray, score: np.ndarray, banned: frozenset[int], limit: int) -> list[tuple[int, ...]]:
        """The ``limit`` moves of least ``(score, members)`` that avoid ``banned``.

        Members are sorted tuples of at most ``CHAIN_MAX_OPS`` candidates, kept padded
        with -1 in the columns ``m0``...: sorting by those columns is sorting by the
        tuples (a shorter one first), so the many ties of a repetitive graph (its layers
        alike) are ordered by ``lexsort`` (``in_order``), not as Python tuples.
        """
        take = limit + len(banned) * 8
        while True:
            if len(score) > take:
                cut = score[np.argpartition(score, take - 1)[:take]].max()
                near = np.nonzero(score <= cut)[0]  # every tie with the last one taken
            else:
                near = np.arange(len(score))
            best: list[tuple[int, ...]] = []
            members = [self.moves[f"m{k}"] for k in range(CHAIN_MAX_OPS)]
            for rows in in_order(members, which[near], score[near], take):
                for k in rows.tolist():
                    if banned.isdisjoint(self.members[k]):
                        best.append(self.members[k])
                        if len(best) == limit:
                            return best
            if len(near) == len(score):
                return best
            take *= 4

    def _refresh(
        self,
        anchor: dict[int, int],
        through: np.ndarray,
        own: np.ndarray,
        over: Callable[[np.ndarray, np.ndarray], np.ndarray],
    ) -> None:
        """Walk again the chains that are stale under ``anchor`` and these over counts:
        those that read a candidate that started or stopped running, an anchor that is
        now elsewhere, or a zero test that now comes out otherwise."""
        stale, self.stale = self.stale, set()
        reads = self.reads
        live = reads.live(self.gen)
        if self.toggled:
            stale |= self.toggled
            hit = (reads["value"] < 0) & np.isin(reads["cand"], np.fromiter(self.toggled, np.int64))
            stale.update(reads["origin"][hit & live].tolist())
        if self.moved:
            # An anchor read depends on the reader's consumers: recheck those whose consumers moved.
            now = np.full(self.model.num_candidates, -1, np.int64)
            for x in {x for c in self.moved for x in self.producers[c]}:
                now[x] = anchor_of(self.model, anchor, x)
            seen = now[reads["cand"]]
            hit = (reads["value"] >= 0) & (seen >= 0) & (seen != reads["value"])
            stale.update(reads["origin"][hit & live].tolist())
        self.moved, self.toggled = set(), set()
        tests = self.tests
        flipped = tests.live(self.gen) & ((over(tests["x"], tests["y"]) == 0) != tests["zero"])
        stale.update(tests["origin"][flipped].tolist())
        if stale:
            self._walk_all(sorted(stale), anchor, through, own)

    def _walk_all(self, origins: list[int], anchor: dict[int, int], through: np.ndarray, own: np.ndarray) -> None:
        """Walk ``origins``' chains again (none for a chosen one) and append their rows."""

        def over(x: int, y: int) -> int:
            return int(through[y] - through[x] - own[y]) if y > x else 0

        model = self.model
        self.gen[origins] += 1
        self.counts[origins] = 0
        terms: dict[str, list[int]] = {"origin": [], "gen": [], "coef": [], "x": [], "y": []}
        moves: dict[str, list[int]] = {"origin": [], "gen": [], "level": [], "first": [], "last": []}
        costs: list[float] = []
        padded: list[list[int]] = [[] for _ in range(CHAIN_MAX_OPS)]  # members, column by column
        tests: dict[str, list[int]] = {"origin": [], "gen": [], "x": [], "y": [], "zero": []}
        reads: dict[str, list[int]] = {"origin": [], "gen": [], "cand": [], "value": []}
        base = self.terms.size
        for i in origins:
            if i in anchor:
                continue
            chain = walk(model, anchor, i, over)
            g = int(self.gen[i])
            first = base + len(terms["coef"])
            if chain.moves:
                levels = len(chain.moves)
                _extend(moves, i, g, level=range(1, levels + 1), first=[first] * levels,
                        last=[first + count for _, count in chain.moves])
                for members, _ in chain.moves:
                    costs.append(sum(model.cand_cost[c] for c in members))
                    self.members.append(members)
                    for k in range(CHAIN_MAX_OPS):
                        padded[k].append(members[k] if k < len(members) else -1)
            if chain.terms:
                coef, x, y = zip(*chain.terms)
                _extend(terms, i, g, coef=coef, x=x, y=y)
            if chain.tests:
                x, y, zero = zip(*chain.tests)
                _extend(tests, i, g, x=x, y=y, zero=zero)
            cand, value = zip(*chain.anchor_reads)
            _extend(reads, i, g, cand=chain.chosen_reads + cand, value=(-1,) * len(chain.chosen_reads) + value)
            self.counts[i] = len(chain.terms)
        self.terms.append(terms)
        move_rows: dict[str, Sequence[float]] = {**moves, "cost": costs,
                                                 **{f"m{k}": column for k, column in enumerate(padded)}}
        self.moves.append(move_rows)
        self.tests.append(tests)
        self.reads.append(reads)
        if self.terms.size > 2 * int(self.counts.sum()) + COMPACT_SLACK:
            self._compact()

    def _compact(self) -> None:
        """Drop the dead rows; moves then point at their terms' new places."""
        live_terms = self.terms.live(self.gen)
        place = np.concatenate(([0], np.cumsum(live_terms)))
        live_moves = self.moves.live(self.gen)
        self.members = [self.members[k] for k in np.nonzero(live_moves)[0].tolist()]
        self.moves.compact(live_moves)
        self.moves["first"][:] = place[self.moves["first"]]
        self.moves["last"][:] = place[self.moves["last"]]
        self.terms.compact(live_terms)
        self.tests.compact(self.tests.live(self.gen))
        self.reads.compact(self.reads.live(self.gen))


def steps_over(through: np.ndarray, ahead: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The steps over the budget strictly between original ops ``x`` and ``y`` (0 unless
    ``y > x``), from ``Choice.over_counts``' ``through`` and ``ahead = through - own``.

    ``through[y] - through[x] - own[y]`` for ``y > x``; otherwise it is at most 0
    (``through`` never falls, and ``own[y]`` is one of the steps ``through[y]`` counts
    past ``through[y - 1]``), so clipping at 0 gives both cases in one subtraction."""
    return np.maximum(ahead[y] - through[x], 0)


def in_order(members: Sequence[np.ndarray], rows: np.ndarray, score: np.ndarray, take: int) -> Iterator[np.ndarray]:
    """``rows`` in order of ``(score, members)`` (``members[k][row]``: a move's ``k``-th
    candidate, -1 past its last), in runs: the rows under the greatest score, then its
    ties by their first member, the ``take`` least first.  A repetitive graph ties
    thousands of moves and a ranking reads only the first few: the rest are sorted
    only when reached."""
    if not len(rows):
        return
    under = score < score.max()
    yield _sorted(members, rows[under], score[under])
    ties = rows[~under]
    first = members[0][ties]
    if len(ties) > take:
        low = first <= first[np.argpartition(first, take - 1)[take - 1]]
        yield _sorted(members, ties[low])
        ties = ties[~low]
    yield _sorted(members, ties)


def _sorted(members: Sequence[np.ndarray], rows: np.ndarray, score: np.ndarray | None = None) -> np.ndarray:
    """``rows`` sorted by ``(score, members)`` (by members alone without ``score``)."""
    keys = [column[rows] for column in reversed(members)]
    if score is not None:
        keys.append(score)
    return rows[np.lexsort(keys)]


def _extend(rows: dict[str, list[int]], origin: int, gen: int, **values: Sequence[int]) -> None:
    """Add rows of ``origin``'s chain of generation ``gen`` to the columns ``rows``."""
    count = len(next(iter(values.values())))
    rows["origin"].extend([origin] * count)
    rows["gen"].extend([gen] * count)
    for name, column in values.items():
        rows[name].extend(column)

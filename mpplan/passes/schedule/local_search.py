"""``auto``'s local search: hill climbing on the peak steps, then an iterated local search with random kicks."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence

from mpplan.passes.schedule.climber import (
    BUILD_WORK,
    IMPROVE_RADIUS,
    KICK_MOVES,
    KICK_PATIENCE,
    MOVE_WORK,
    SEGMENT_OPS,
    SEGMENT_TRIES,
    Budget,
    Climber,
    Move,
)
from mpplan.passes.schedule.memory import Memory, Order


def climb(climber: Climber, rng: random.Random, budget: Budget) -> list[Move]:
    """Hill-climb until no move lowers the score (see ``Climber``) or the budget runs out.

    At the peak steps, from a random one on, try first the single-op moves around
    each, then an exact reordering of the ``SEGMENT_OPS`` steps around each; make the
    best improving move found at the first step that has one.  Returns the inverses of
    the moves made, in order, so a caller can undo them.
    """
    n = len(climber.order)
    undo: list[Move] = []
    while not budget.exhausted:
        current = climber.score
        best: Move | None = None
        for p in climber.peak_steps(rng.randrange(n)):
            for k, j in climber.candidates(p, IMPROVE_RADIUS):
                budget.units -= MOVE_WORK + 2 * abs(climber.pos[k] - j)
                move = climber.evaluate(k, j)
                if move.score < (best.score if best is not None else current):
                    best = move
            if best is not None or budget.exhausted:
                break
        if best is None:
            for p in itertools.islice(climber.peak_steps(rng.randrange(n)), SEGMENT_TRIES):
                if budget.exhausted:
                    break
                lo = max(0, min(p - SEGMENT_OPS // 2, n - SEGMENT_OPS))
                reordered = climber.reorder(lo, min(n, lo + SEGMENT_OPS) - 1, budget)
                if reordered is not None and reordered.score < current:
                    best = reordered
                    break
        if best is None:
            break
        undo.append(climber.apply(best))
    return undo


def kick(climber: Climber, rng: random.Random, budget: Budget) -> list[Move]:
    """Perturb the order: ``KICK_MOVES`` random valid moves of ops near a random peak step.
    Returns the inverses of the moves made."""
    n = len(climber.order)
    p = next(climber.peak_steps(rng.randrange(n)))
    undo = []
    for _ in range(KICK_MOVES):
        x = rng.randint(max(0, p - IMPROVE_RADIUS), min(n - 1, p + IMPROVE_RADIUS))
        k = climber.order[x]
        lo, hi = climber.window(k)
        j = rng.randint(max(lo, x - IMPROVE_RADIUS), min(hi, x + IMPROVE_RADIUS))
        if j != x:
            budget.units -= MOVE_WORK + 2 * abs(x - j)
            undo.append(climber.apply(climber.evaluate(k, j)))
    return undo


def local_search(
    mem: Memory,
    starts: Sequence[Order],
    rng: random.Random,
    budget: Budget,
    profiles: Mapping[Order, list[int]] | None = None,
) -> tuple[Order, int]:
    """Improve the best of ``starts`` (ascending LOAD) within ``budget``; its order and LOAD.

    ``profiles`` may hold the starts' step profiles (``Memory.profile``), which the
    climbers then take over instead of simulating each start again.

    Each start is hill-climbed in turn (building a climber costs ``BUILD_WORK`` units
    per op); then an iterated local search kicks the best one and climbs again,
    keeping the result unless it is worse, until ``KICK_PATIENCE`` rounds in a row
    bring nothing better.
    """
    best: Climber | None = None
    for start in starts:
        if budget.exhausted and best is not None:
            break
        budget.units -= BUILD_WORK * mem.num_ops
        climber = Climber(mem, start, profiles.get(start) if profiles is not None else None)
        climb(climber, rng, budget)
        if best is None or climber.tree.top < best.tree.top:
            best = climber
    assert best is not None, "at least one start"
    best_load = best.tree.top
    stale = 0
    while stale < KICK_PATIENCE and not budget.exhausted:
        undo = kick(best, rng, budget)
        undo += climb(best, rng, budget)
        load = best.tree.top
        if load < best_load:
            best_load, stale = load, 0
            continue
        stale += 1
        if load > best_load:
            for move in reversed(undo):
                best.apply(move)
    return tuple(best.order), best_load

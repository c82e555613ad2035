"""The searching methods: ``exact`` (the least LOAD, small graphs) and ``auto`` (heuristics, local search, exact)."""

from __future__ import annotations

import random
import time

from mpplan.graph import Graph
from mpplan.passes.schedule.climber import IMPROVE_WORK, Budget
from mpplan.passes.schedule.frontiers import DEFAULT_STATE_LIMIT, SearchLimitError, exact_search
from mpplan.passes.schedule.heuristics import HEURISTICS
from mpplan.passes.schedule.local_search import local_search
from mpplan.passes.schedule.memory import TIME_LIMIT, Memory, Order

#: ``auto`` runs the exact search first on graphs of up to ``AUTO_EXACT_SMALL_OPS``
#: ops, generating up to ``AUTO_EXACT_SMALL_STATES`` frontiers; and last, to polish
#: the local search's order, on graphs of up to ``AUTO_EXACT_MAX_OPS`` ops, generating
#: up to ``AUTO_EXACT_WORK`` / n frontiers.
AUTO_EXACT_SMALL_OPS = 20
AUTO_EXACT_SMALL_STATES = 50_000
AUTO_EXACT_MAX_OPS = 400
AUTO_EXACT_WORK = 500_000


def exact(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """An order of least LOAD, found by ``frontiers.exact_search`` bounded by the best
    greedy order.  Raises ``SearchLimitError`` past ``DEFAULT_STATE_LIMIT`` frontiers or
    ``time_limit`` seconds: exact for graphs of up to a few dozen ops, or narrow larger ones."""
    mem = Memory.of(graph)
    bound = min((HEURISTICS["greedy_free"](mem), HEURISTICS["least_peak"](mem)), key=mem.load)
    return exact_search(
        graph, upper_bound=bound, state_limit=DEFAULT_STATE_LIMIT, deadline=time.monotonic() + time_limit
    )


def auto(graph: Graph, *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """The best order the heuristics, a local search and the exact search find.

    Runs every heuristic and keeps the lowest LOAD, so it is never worse than any of
    them.  Graphs of up to ``AUTO_EXACT_SMALL_OPS`` ops then get the exact search
    (optimal unless the graph is too wide for ``AUTO_EXACT_SMALL_STATES`` frontiers).
    Otherwise a local search spends ``IMPROVE_WORK`` units on the heuristics' orders,
    and graphs of up to ``AUTO_EXACT_MAX_OPS`` ops get a short exact search bounded by
    its result (``AUTO_EXACT_WORK`` / n frontiers).  Everything past the heuristics is
    bounded by work, so ``auto`` is near-linear and, for a given ``seed``, deterministic
    unless ``time_limit`` cuts it short.
    """
    deadline = time.monotonic() + time_limit
    mem = Memory.of(graph)
    n = mem.num_ops
    orders = list(dict.fromkeys(heuristic(mem) for heuristic in HEURISTICS.values()))
    # handed to the local search, which would simulate them again
    profiles: dict[Order, list[int]] = dict(zip(orders, mem.profiles(orders)))
    found = {order: max(profile, default=0) for order, profile in profiles.items()}
    ranked = sorted(found, key=found.__getitem__)  # stable: ties keep HEURISTICS' preference
    best, best_load = ranked[0], found[ranked[0]]
    if n <= AUTO_EXACT_SMALL_OPS:
        try:
            return exact_search(graph, upper_bound=best, state_limit=AUTO_EXACT_SMALL_STATES, deadline=deadline)
        except SearchLimitError:
            pass  # too wide: search locally instead
    if n >= 2:
        order, load = local_search(mem, ranked, random.Random(seed), Budget(IMPROVE_WORK, deadline), profiles)
        if load < best_load:
            best, best_load = order, load
    if AUTO_EXACT_SMALL_OPS < n <= AUTO_EXACT_MAX_OPS:
        try:
            best = exact_search(graph, upper_bound=best, state_limit=AUTO_EXACT_WORK // n, deadline=deadline)
        except SearchLimitError:
            pass  # too wide for an exact order: keep the local search's
    return best

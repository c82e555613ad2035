"""Every scheduling method by name: the one list the config's ``planner.schedule`` choices and the docs come from."""

from __future__ import annotations

from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.passes.schedule.heuristics import as_given, bfs, dfs, greedy_free, least_peak, longest_path
from mpplan.passes.schedule.memory import TIME_LIMIT, Order, Scheduler
from mpplan.passes.schedule.searching import auto, exact

#: Every method by name, all with the ``Scheduler`` signature; the default first, as the config lists them.
SCHEDULERS: dict[str, Scheduler] = {
    "auto": auto,
    "as_given": as_given,
    "longest_path": longest_path,
    "greedy_free": greedy_free,
    "least_peak": least_peak,
    "dfs": dfs,
    "bfs": bfs,
    "exact": exact,
}


def schedule(graph: Graph, method: str = "auto", *, seed: int = 0, time_limit: float = TIME_LIMIT) -> Order:
    """A topological order of ``graph``'s op ids chosen by ``method`` (see the module docstring).

    ``time_limit`` caps the seconds ``exact`` and ``auto`` search; ``auto`` is
    bounded by work first, so the cap only binds on very slow machines, and then its
    result may depend on machine speed.  Raises ``ConfigError`` for an unknown method
    and ``SearchLimitError`` when ``exact`` meets a graph too wide for it.
    """
    if method not in SCHEDULERS:
        raise ConfigError(f"schedule method: expected one of {', '.join(SCHEDULERS)}, got {method!r}")
    if time_limit <= 0:
        raise ConfigError(f"schedule time_limit: expected a positive number of seconds, got {time_limit!r}")
    return SCHEDULERS[method](graph, seed=seed, time_limit=time_limit)

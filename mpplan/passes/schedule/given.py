"""Whether a heuristic would run the ops in their given order, checked at its choices only.

A list scheduler (and DFS or BFS) runs, at each step, one of the ready ops.  Along the
given order ``0..n-1`` (always valid: ``Graph.validate`` demands it) op ``t`` is ready
from step ``ready_from[t]`` (one past its last predecessor) through its own step ``t``.
At a step where only the op of that step is ready there is no choice, so a heuristic
follows the given order unless, at some step ``i`` with rivals (ops ``t > i`` already
ready), it would rather run a rival.  Before such a step exactly the ops ``0..i-1`` have
run, so what the heuristic compares is known in closed form: a list scheduler's key from
the touchers of the op's storages (see ``_key``), a queue's or stack's order from the
step each op became ready.  Checking those steps alone decides, exactly, whether the
heuristic's order is the given one: on a graph whose ops are nearly a chain (a synthetic
transformer's training step: one choice in 100k steps) that is a few lookups instead of
a run over every edge.  Graphs with more rivals than ops are left to the heuristic (``None``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from mpplan.passes.schedule.memory import Memory


def keeps_given_order(mem: Memory, peak_first: bool) -> bool | None:
    """Whether ``heuristics._list_schedule(mem, peak_first)`` is ``0..n-1``; ``None``: not checked
    (too many rivals, see ``Memory.rivals``)."""
    return _wins_every_choice(mem, lambda t, step: _key(mem, t, step, peak_first))


def queue_keeps_given_order(mem: Memory, ready: Literal["fifo", "lifo"]) -> bool | None:
    """Whether ``topo.topological_order(mem.succs, indegrees, ready=ready)`` (``"fifo"``, BFS, or
    ``"lifo"``, DFS) is ``0..n-1``; ``None``: not checked.

    Along the given order an op is queued when its last predecessor runs (sources first), the
    ops one op enables in the order of its ``succs`` (sources by id).  ``fifo`` runs the op
    queued first, ``lifo`` the one queued last, first in its group.
    """
    sign = 1 if ready == "fifo" else -1

    def key(t: int, step: int) -> tuple[int, int]:
        ready_from = mem.ready_from[t]
        return sign * ready_from, mem.succs[ready_from - 1].index(t) if ready_from else t

    return _wins_every_choice(mem, key)


def _wins_every_choice(mem: Memory, key: Callable[[int, int], tuple[int, ...]]) -> bool | None:
    """Whether, at every step with rivals, the op of that step has a smaller ``key(op, step)``
    than each rival; ``None`` when ``Memory.rivals`` declines."""
    rivals = mem.rivals
    if rivals is None:
        return None
    for step, ops in rivals.items():
        own = key(step, step)
        if any(key(t, step) < own for t in ops):
            return False
    return True


def _key(mem: Memory, t: int, step: int, peak_first: bool) -> tuple[int, ...]:
    """The list scheduler's key for unrun op ``t`` once ops ``0..step-1`` have run.

    ``t`` allocates each of its storages that no op before ``step`` touched (its first
    toucher is at ``step`` or later; once per touch, as the scheduler counts it), and frees
    each non-output storage whose last touch is its own and whose touch before that ran
    (or that it alone touches once).
    """
    touchers, nbytes, to_end = mem.touchers, mem.nbytes, mem.to_end
    allocated = freed = 0
    for s in mem.storages[t]:
        ts = touchers[s]
        if ts[0] >= step:
            allocated += nbytes[s]
        if not to_end[s] and ts[-1] == t and (len(ts) == 1 or ts[-2] < step):
            freed += nbytes[s]
    net = allocated - freed
    return (allocated, net, t) if peak_first else (net, t)

"""Whether a greedy list scheduler would run the ops in their given order, checked at its choices only.

A list scheduler runs, at each step, the ready op of least key.  Along the given order
``0..n-1`` (always valid: ``Graph.validate`` demands it) op ``t`` is ready from step
``ready_from[t]`` (one past its last predecessor) through its own step ``t``.  At a step
where only the op of that step is ready the scheduler has no choice, so it follows the
given order unless, at some step ``i`` with rivals (ops ``t > i`` already ready), it
would rather run a rival.  Before such a step exactly the ops ``0..i-1`` have run, so
each key is known in closed form from the touchers of the op's storages (see
``_key``).  Checking those steps alone decides, exactly, whether the scheduler's order
is the given one: on a graph whose ops are nearly a chain (a synthetic transformer's
training step: one choice in 100k steps) that is a few lookups instead of a run over
every edge.  Graphs with more rivals than ops are left to the scheduler (``None``).
"""

from __future__ import annotations

from mpplan.passes.schedule.memory import Memory


def rivals_by_step(mem: Memory) -> dict[int, list[int]] | None:
    """For each step ``i`` of the given order where another op is ready, those ops (``t > i``),
    ascending; ``None`` when there are more (step, rival) pairs than ops."""
    rivals: dict[int, list[int]] = {}
    pairs = 0
    for t, preds in enumerate(mem.preds):
        ready_from = max(preds) + 1 if preds else 0
        if ready_from < t:
            pairs += t - ready_from
            if pairs > mem.num_ops:
                return None
            for i in range(ready_from, t):
                rivals.setdefault(i, []).append(t)
    return rivals


def keeps_given_order(mem: Memory, peak_first: bool) -> bool | None:
    """Whether ``heuristics._list_schedule(mem, peak_first)`` is ``0..n-1``; ``None``: not checked
    (too many rivals, see ``rivals_by_step``)."""
    rivals = rivals_by_step(mem)
    if rivals is None:
        return None
    for step, ops in rivals.items():
        own = _key(mem, step, step, peak_first)
        if any(_key(mem, t, step, peak_first) < own for t in ops):
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

"""The pipeline's exact DP: contiguous stages over units, and ``SegmentCost``, the bytes of one stage.

The DP minimises the largest predicted ``peak / capacity``, then uneven stages,
then cross-device bytes, exactly over all contiguous splits.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from mpplan.graph import Graph


def partition(
    num_units: int, capacities: Sequence[int], cost: Callable[[int, int], tuple[int, int]]
) -> tuple[int, ...]:
    """Split units ``0..num_units-1`` into ``len(capacities)`` contiguous non-empty stages.

    ``cost(i, j)`` gives (peak bytes, incoming copy bytes) of a stage holding
    units ``i..j`` inclusive.  Minimises the largest ``peak / capacity`` (exactly), then
    uneven stages (the sum of squared ratios), then the total copy bytes; returns the first
    unit of every stage after the first.  Balance comes before copies so that a stage
    whose peak is forced (one large unit) does not leave the other devices nearly empty.
    Exact over all contiguous splits (a DP over (stage, last unit)).
    """
    stages = min(len(capacities), num_units)
    inf = (float("inf"), float("inf"), float("inf"))
    # best[d][j]: (max ratio, sum of squared ratios, copy bytes) placing units 0..j on devices 0..d.
    best = [[inf] * num_units for _ in range(stages)]
    cut = [[-1] * num_units for _ in range(stages)]
    for j in range(num_units):
        peak, copied = cost(0, j)
        ratio = peak / capacities[0]
        best[0][j] = (ratio, ratio * ratio, copied)
    for d in range(1, stages):
        for j in range(d, num_units):
            for i in range(d, j + 1):
                prev = best[d - 1][i - 1]
                if prev[0] == float("inf"):
                    continue
                peak, copied = cost(i, j)
                ratio = peak / capacities[d]
                cand = (max(prev[0], ratio), prev[1] + ratio * ratio, prev[2] + copied)
                if cand < best[d][j]:
                    best[d][j], cut[d][j] = cand, i
    starts, j = [], num_units - 1
    for d in range(stages - 1, 0, -1):
        i = cut[d][j]
        starts.append(i)
        j = i - 1
    return tuple(reversed(starts))


class SegmentCost:
    """Predicted (peak, incoming copy bytes) of a device running a contiguous run of units.

    Estimates what ``inject_copies`` + liveness would give for that device: its
    own storages live from their birth to their last local use or their first use
    elsewhere (when the copy out runs); storages from elsewhere arrive as copies
    live over their local uses.  The final plan is computed exactly.

    Storages used by one unit only are summed once per unit into a live profile
    over the schedule, and the profiles are prefix-summed over units, so a stage's
    profile is one vector difference; only storages crossing units are walked.
    """

    def __init__(self, graph: Graph, order: Sequence[int], unit_of_op: Sequence[int], num_units: int) -> None:
        topo = graph.topology
        steps = len(order)
        spans: dict[int, dict[int, tuple[int, int]]] = {}
        for step, k in enumerate(order):
            u = unit_of_op[k]
            for s in topo.op_storages[k]:
                uses = spans.setdefault(s, {})
                uses[u] = (uses[u][0], step) if u in uses else (step, step)
        delta = np.zeros((num_units, steps + 1), dtype=np.int64)
        static = np.zeros(num_units + 1, dtype=np.int64)
        self._crossing: list[tuple[int, int, bool, int, dict[int, tuple[int, int]]]] = []
        self._crossing_of_unit: list[list[int]] = [[] for _ in range(num_units)]
        for s, uses in spans.items():
            size = topo.nbytes[s]
            home = unit_of_op[topo.producer[s]] if topo.producer[s] >= 0 else min(uses, key=lambda u: uses[u][0])
            if len(uses) == 1:
                first, last = uses[home]
                if topo.is_static[s]:
                    static[home + 1] += size
                else:
                    last = steps - 1 if s in topo.output_storages else last
                    delta[home, first] += size
                    delta[home, last + 1] -= size
                continue
            index = len(self._crossing)
            self._crossing.append((size, home, topo.is_static[s], int(s in topo.output_storages), uses))
            for u in uses:
                self._crossing_of_unit[u].append(index)
        profiles = np.cumsum(delta[:, :steps], axis=1)
        self._cum = np.vstack([np.zeros((1, steps), dtype=np.int64), np.cumsum(profiles, axis=0)])
        self._static = np.cumsum(static)
        self._end = steps - 1
        self._memo: dict[tuple[int, int], tuple[int, int]] = {}

    def __call__(self, i: int, j: int) -> tuple[int, int]:
        key = (i, j)
        if key not in self._memo:
            self._memo[key] = self._evaluate(i, j)
        return self._memo[key]

    def _evaluate(self, i: int, j: int) -> tuple[int, int]:
        profile = self._cum[j + 1] - self._cum[i]
        static = int(self._static[j + 1] - self._static[i])
        copied = 0
        crossing = {c for u in range(i, j + 1) for c in self._crossing_of_unit[u]}
        for c in sorted(crossing):
            size, home, is_static, is_output, uses = self._crossing[c]
            inside = [use for u, use in uses.items() if i <= u <= j]
            first = min(use[0] for use in inside)
            last = max(use[1] for use in inside)
            if i <= home <= j:
                if is_static:
                    static += size
                    continue
                later = [use[0] for u, use in uses.items() if not i <= u <= j and use[0] > first]
                if later:
                    last = max(last, min(later))
                if is_output:
                    last = self._end
            else:
                copied += size
            profile[first : last + 1] += size
        return static + int(profile.max(initial=0)), copied

"""Objectives: how candidates are ranked by prediction, and how the best measured one is chosen.

Every ranking is a sort key, smaller is better, ending in the candidate key so ties
break the same way in every run (a resumed search picks the same best).

* ``min_peak``: lowest peak over the devices.  Predicted: the plan's max peak.
* ``min_time_that_fits``: fastest measured step among candidates that fit.  The
  planner predicts memory, not time, so the prediction ranks by the extra work a
  plan adds, recompute (``compute_overhead``) then cross-device bytes, then peak.
* ``max_batch``: the largest batch that fits, then (predicted) the least recompute
  and the lowest peak, (measured) the lowest peak, then time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mpplan.cluster.records import Result, Status
from mpplan.units import format_size

_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Objective:
    """An objective by name; ``batch_key`` is the dotted config key ``max_batch`` maximises."""

    name: str
    batch_key: str = "workload.batch"

    def predicted_rank(self, result: Result) -> tuple[Any, ...]:
        """Sort key of a planned candidate by its prediction alone."""
        predicted = result.predicted or {}
        peak = predicted.get("max_peak_bytes", _INF)
        if self.name == "min_time_that_fits":
            return (predicted.get("compute_overhead", 0.0), predicted.get("cross_device_bytes", 0), peak, result.key)
        if self.name == "max_batch":
            return (-self.batch(result), predicted.get("compute_overhead", 0.0), peak, result.key)
        return (peak, result.key)

    def measured_rank(self, result: Result) -> tuple[Any, ...]:
        """Sort key of a measured candidate (status ``ok``)."""
        peak = result.measured_peak_bytes
        time = result.step_time_s
        peak_key = _INF if peak is None else peak
        time_key = _INF if time is None else time
        if self.name == "min_time_that_fits":
            return (time_key, peak_key, result.key)
        if self.name == "max_batch":
            return (-self.batch(result), peak_key, time_key, result.key)
        return (peak_key, time_key, result.key)

    def batch(self, result: Result) -> float:
        """The value of the bisected key a result ran with: its override, else its workload entry."""
        if self.batch_key in result.overrides:
            return float(result.overrides[self.batch_key])
        return float(result.workload.get(self.batch_key.removeprefix("workload."), 0))

    def best(self, results: Iterable[Result], *, measured: bool) -> Result | None:
        """The best result: among ``ok`` ones by measurement, or among ``predicted_fit`` ones by prediction."""
        if measured:
            eligible = [r for r in results if r.status is Status.OK]
            return min(eligible, key=self.measured_rank, default=None)
        eligible = [r for r in results if r.status is Status.PREDICTED_FIT]
        return min(eligible, key=self.predicted_rank, default=None)

    def describe(self, result: Result | None) -> str:
        """The best-so-far value in a few words, for progress lines."""
        if result is None:
            return "none yet"
        peak = result.measured_peak_bytes if result.status is Status.OK else result.predicted_peak_bytes
        text = "?" if peak is None else format_size(peak)
        if self.name == "max_batch":
            return f"{self.batch_key.removeprefix('workload.')} {self.batch(result):g} ({text})"
        if self.name == "min_time_that_fits" and result.step_time_s is not None:
            return f"{result.step_time_s * 1e3:.1f} ms ({text})"
        return text

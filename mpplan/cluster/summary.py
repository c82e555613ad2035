"""The record of how a search went, as ``run_search`` returns it and ``summary.json`` holds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpplan.cluster.records import Result
from mpplan.units import format_size

SUMMARY_SCHEMA = "mpplan.search.summary/1"


@dataclass(frozen=True)
class SearchSummary:
    """How a search went; ``summary.json`` holds the same.

    ``counts`` are results by status over the candidates this run resolved (resumed
    ones included); ``measured`` and ``evaluations`` count this run's candidates
    finished on actors and attempts made (retries included); ``measure_seconds`` is
    the wall time from the first evaluation handed to an actor to the last result.
    """

    out: Path
    objective: str
    state: str
    candidates: int
    counts: dict[str, int]
    resumed: int
    measured: int
    evaluations: int
    actors: int
    best: Result | None
    best_plan: Path | None
    seconds: float
    measure_seconds: float
    space: dict[str, list[Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SUMMARY_SCHEMA,
            "out": str(self.out),
            "objective": self.objective,
            "state": self.state,
            "candidates": self.candidates,
            "counts": dict(self.counts),
            "resumed": self.resumed,
            "measured": self.measured,
            "evaluations": self.evaluations,
            "actors": self.actors,
            "best": None if self.best is None else self.best.to_dict(),
            "best_plan": None if self.best_plan is None else str(self.best_plan),
            "seconds": self.seconds,
            "measure_seconds": self.measure_seconds,
            "space": self.space,
        }

    def text(self) -> str:
        """A few lines for the terminal: how the search ended and where its best plan is."""
        counts = ", ".join(f"{n} {status}" for status, n in sorted(self.counts.items()) if n)
        lines = [
            f"search {self.state}: {self.candidates} candidates ({counts or 'none resolved'}), "
            f"{self.measured} measured on {self.actors} actor(s), {self.resumed} resumed, {self.seconds:.1f} s",
        ]
        if self.best is None:
            lines.append(f"no candidate met the objective {self.objective}")
        else:
            measured = self.best.measured_peak_bytes
            predicted = self.best.predicted_peak_bytes
            overrides = " ".join(f"{k}={v}" for k, v in sorted(self.best.overrides.items())) or "(base config)"
            lines.append(f"best ({self.objective}): {overrides}")
            if predicted is not None:
                lines.append(f"  predicted peak {format_size(predicted)}")
            if measured is not None:
                lines.append(f"  measured peak  {format_size(measured)}")
            if self.best.step_time_s is not None:
                lines.append(f"  step time      {self.best.step_time_s * 1e3:.1f} ms")
        if self.best_plan is not None:
            lines.append(f"best plan: {self.best_plan}")
        lines.append(f"results: {self.out}")
        return "\n".join(lines)

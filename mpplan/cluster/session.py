"""One search run's shared state, and the shape of the work its measuring loop runs.

``Session`` holds the store, the point planner, the best result so far and the tallies
that become the ``SearchSummary``; ``Work`` is what the two ways of choosing what to
measure (``mpplan.cluster.choose``) hand to the measuring loop in ``mpplan.cluster.driver``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mpplan.cluster.evaluator import EvaluateFn
from mpplan.cluster.objective import Objective
from mpplan.cluster.planning import Outcome, PointPlanner
from mpplan.cluster.progress import Progress
from mpplan.cluster.records import Candidate, Result, Status, blocks_unknown
from mpplan.cluster.space import Axis, base_raw
from mpplan.cluster.store import ResultStore
from mpplan.cluster.summary import SearchSummary
from mpplan.config import Config

logger = logging.getLogger("mpplan")


class Work(Protocol):
    """What the measuring loop runs: candidates to start with, and more as results come in."""

    def want(self) -> int:
        """The most candidates it could use measured at once."""

    def devices(self) -> int:
        """The most devices any of its candidates plans for (GPUs an actor needs on a GPU cluster)."""

    def start(self, actors: int) -> list[Candidate]:
        """The first candidates to measure, given how many actors there are."""

    def follow(self, result: Result) -> list[Candidate]:
        """More candidates to measure now that ``result`` is in."""

    def estimate(self) -> int:
        """About how many candidates it will measure (for the progress bar)."""


@dataclass
class Session:
    """One run's shared state: the store, the planner, the best so far, and tallies for the summary."""

    config: Config
    objective: Objective
    store: ResultStore
    progress: Progress
    evaluate_candidate: EvaluateFn | None
    on_result: Callable[[Result], None] | None
    space_axes: tuple[Axis, ...]
    planner: PointPlanner = field(init=False)
    best: Result | None = None
    candidates: int = 0
    measured: int = 0
    evaluations: int = 0
    actors: int = 0
    measure_seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)
    connect: Callable[[], None] = field(default=lambda: None, repr=False)
    """Be connected to Ray (set by ``run_search``; started lazily: nothing to measure, no Ray)."""

    def __post_init__(self) -> None:
        self.planner = PointPlanner(
            base_raw(self.config), self.config.source, self.store, self.record, fit=self.config.search.fit,
            step_in_backward=self.config.search.step_in_backward,
        )

    @property
    def measuring(self) -> bool:
        return self.config.search.top_k > 0

    def record(self, result: Result) -> None:
        """Make ``result`` final: durably stored, best updated, caller told."""
        if not self.store.add(result):
            return
        self.planner.keys.add(result.key)
        best = self.objective.best([r for r in (self.best, result) if r is not None], measured=self.measuring)
        if best is not None and best is not self.best:
            self.best = best
            self._publish(best)
        if self.on_result is not None:
            self.on_result(result)

    def start_best(self) -> None:
        """After planning: the best among this space's finished results, and ``best/`` made to match it.

        Warns of resumed results of a torch model predicted without arena blocks and scratch
        (``records.blocks_unknown``): they rank by other peaks than the points predicted now."""
        mine = [self.store.results[k] for k in sorted(self.planner.keys) if k in self.store.results]
        if self.config.model.torch is not None:
            old = sum(1 for r in mine if r.key in self.store.loaded_keys and blocks_unknown(r))
            if old:
                logger.warning(
                    "search: %d resumed result(s) in %s were predicted without arena blocks and scratch (written "
                    "before results recorded predicted.planned_for); their predicted peaks differ from this "
                    "run's by what arena mode holds: search into a new --out to predict every point alike",
                    old, self.store.path)
        self.best = self.objective.best(mine, measured=self.measuring)
        if self.best is not None and self.store.best_on_disk() != self.best.key:
            self._publish(self.best)  # a run killed between results.jsonl and best/ left it behind

    def resumed(self, outcome: Outcome) -> bool:
        return isinstance(outcome, Result) and outcome.key in self.store.loaded_keys

    def summary(self, state: str) -> SearchSummary:
        """The summary now, also written to ``summary.json``."""
        mine = [self.store.results[k] for k in self.planner.keys if k in self.store.results]
        counts = {s.value: 0 for s in Status}
        for r in mine:
            counts[r.status.value] += 1
        summary = SearchSummary(
            out=self.store.out,
            objective=self.objective.name,
            state=state,
            candidates=self.candidates,
            counts=counts,
            resumed=sum(1 for r in mine if r.key in self.store.loaded_keys),
            measured=self.measured,
            evaluations=self.evaluations,
            actors=self.actors,
            best=self.best,
            best_plan=None if self.best is None else self.store.out / "best" / "plan.json",
            seconds=round(time.monotonic() - self.started, 3),
            measure_seconds=round(self.measure_seconds, 3),
            space={a.key: list(a.values) for a in self.space_axes},
        )
        self.store.write_summary(summary.to_dict())
        return summary

    def _publish(self, best: Result) -> None:
        plan_ = self.planner.plans.get(best.key)
        if plan_ is None:
            plan_ = self.planner.candidate(best).plan
        self.store.write_best(plan_, best)
        self.summary("running")

"""The two ways a search chooses what to measure, each a ``Work`` for the measuring loop.

- ``plan_grid`` (``min_peak``, ``min_time_that_fits``): plan every point, measure the
  ``top_k`` best predicted at once.
- ``plan_max_batch`` (``max_batch``): bisect the batch axis by prediction for each
  combination of the other axes, then bisect the ``top_k`` most promising combinations
  again on measured fit, one round of probes per combination at a time.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from mpplan.cluster.batch import BatchChain, largest_fitting
from mpplan.cluster.planning import Outcome, predicted_to_fit, result_of
from mpplan.cluster.records import Candidate, Result, Status
from mpplan.cluster.session import Session
from mpplan.cluster.space import Axis, Overrides, grid, split_batch_axis


# --- min_peak and min_time_that_fits: a grid ---------------------------------------------------


@dataclass
class _GridWork:
    """Measure a fixed list of candidates, all at once."""

    candidates: list[Candidate]

    def want(self) -> int:
        return len(self.candidates)

    def devices(self) -> int:
        return max((len(c.plan.devices) for c in self.candidates), default=0)

    def start(self, actors: int) -> list[Candidate]:
        return list(self.candidates)

    def follow(self, result: Result) -> list[Candidate]:
        return []

    def estimate(self) -> int:
        return len(self.candidates)


def plan_grid(session: Session) -> _GridWork:
    """Plan every point, record what ends here, and return the ``top_k`` best predicted still to measure."""
    points = list(grid(session.space_axes))
    session.candidates = len(points)
    session.progress.begin("planning", len(points))
    outcomes: dict[str, Outcome] = {}
    for overrides in points:
        outcome = session.planner.resolve(overrides)
        outcomes.setdefault(outcome.key, outcome)
        session.progress.planned(_planned_status(outcome), resumed=session.resumed(outcome))
    session.start_best()
    fitting = sorted(
        (o for o in outcomes.values() if predicted_to_fit(o)),
        key=lambda o: session.objective.predicted_rank(_as_result(o)),
    )
    top_k = session.config.search.top_k
    chosen, rest = fitting[:top_k], fitting[top_k:]
    for outcome in rest:
        if isinstance(outcome, Candidate):
            session.record(result_of(outcome, Status.PREDICTED_FIT))
    session.planner.forget({o.key for o in rest})  # the best among them, if any, is already published
    todo = [_to_measure(session, o) for o in chosen]
    work = _GridWork([c for c in todo if c is not None])
    session.progress.end_planning(len(work.candidates))
    return work


# --- max_batch: bisection --------------------------------------------------------------------


@dataclass
class _BatchWork:
    """Measured bisection of the batch axis for the chosen combinations of the other axes."""

    session: Session
    batch: Axis
    combos: list[Overrides]
    chosen: list[tuple[int, int]]
    """(combination index, index of its largest batch predicted to fit)."""
    probes: dict[tuple[int, int], Outcome] = field(default_factory=dict)
    waiters: dict[str, list[tuple[BatchChain, int]]] = field(default_factory=dict)

    def outcome(self, combo: int, index: int) -> Outcome:
        """Plan (once) the point of combination ``combo`` at batch ``values[index]``."""
        if (combo, index) not in self.probes:
            point = (*self.combos[combo], (self.batch.key, self.batch.values[index]))
            self.probes[combo, index] = self.session.planner.resolve(point)
        return self.probes[combo, index]

    def want(self) -> int:
        return sum(top + 1 for _, top in self.chosen)

    def devices(self) -> int:
        return max((len(c.plan.devices) for c in self.probes.values() if isinstance(c, Candidate)), default=0)

    def estimate(self) -> int:
        return sum(math.ceil(math.log2(top + 2)) for _, top in self.chosen)

    def start(self, actors: int) -> list[Candidate]:
        width = max(1, actors // max(1, len(self.chosen)))
        submits: list[Candidate] = []
        for combo, top in self.chosen:
            submits += self._advance(BatchChain(combo, lo=-1, hi=top + 1, width=width))
        return submits

    def follow(self, result: Result) -> list[Candidate]:
        submits: list[Candidate] = []
        for chain, index in self.waiters.pop(result.key, []):
            if chain.answer(index, result.status is Status.OK):
                submits += self._advance(chain)
        return submits

    def _advance(self, chain: BatchChain) -> list[Candidate]:
        """Probe rounds until one needs measuring (or the chain is done); finished probes answer at once."""
        submits: list[Candidate] = []
        while not chain.done and not chain.waiting:
            for index in chain.next_round():
                outcome = self.outcome(chain.combo, index)
                final = _final(self.session, outcome)
                if final is not None:
                    chain.answer(index, final.status is Status.OK)
                    continue
                candidate = _to_measure(self.session, outcome)
                assert candidate is not None
                self.probes[chain.combo, index] = candidate
                if candidate.key not in self.waiters:
                    submits.append(candidate)
                self.waiters.setdefault(candidate.key, []).append((chain, index))
        return submits


def plan_max_batch(session: Session) -> _BatchWork:
    """Bisect every combination by prediction; keep the ``top_k`` most promising for measuring."""
    search = session.config.search
    batch, others = split_batch_axis(search, session.space_axes)
    combos = list(grid(others))
    session.candidates = len(combos) * len(batch.values)
    session.progress.begin("planning", len(combos))
    work = _BatchWork(session, batch, combos, chosen=[])
    tops: list[tuple[int, int]] = []
    for combo in range(len(combos)):
        top = largest_fitting(len(batch.values), functools.partial(_fits_by_prediction, work, combo))
        status = None if top >= 0 else Status.PREDICTED_MISFIT
        session.progress.planned(status, resumed=top >= 0 and session.resumed(work.outcome(combo, top)))
        if top >= 0:
            tops.append((combo, top))
    session.start_best()
    tops.sort(key=lambda t: session.objective.predicted_rank(_as_result(work.outcome(*t))))
    work.chosen, rest = tops[: search.top_k], tops[search.top_k :]
    for combo, top in rest:
        outcome = work.outcome(combo, top)
        if isinstance(outcome, Candidate):
            session.record(result_of(outcome, Status.PREDICTED_FIT))
    session.progress.end_planning(work.estimate() if session.measuring else 0)
    return work


# --- shared helpers ------------------------------------------------------------------------------


def _to_measure(session: Session, outcome: Outcome) -> Candidate | None:
    """The candidate to measure for a planned point, or None when its result is already final."""
    if isinstance(outcome, Candidate):
        return outcome
    if outcome.status is Status.PREDICTED_FIT and session.measuring:
        return session.planner.candidate(outcome)
    return None


def _fits_by_prediction(work: _BatchWork, combo: int, index: int) -> bool:
    return predicted_to_fit(work.outcome(combo, index))


def _final(session: Session, outcome: Outcome) -> Result | None:
    """The point's final result if it has one by now (another combination may have measured its key)."""
    stored = session.store.get(outcome.key)
    if stored is None or (stored.status is Status.PREDICTED_FIT and session.measuring):
        return None
    return stored


def _as_result(outcome: Outcome) -> Result:
    return result_of(outcome, Status.PREDICTED_FIT) if isinstance(outcome, Candidate) else outcome


def _planned_status(outcome: Outcome) -> Status | None:
    return None if isinstance(outcome, Candidate) else outcome.status

"""The search: plan every point of ``search.space`` on the driver, measure the best on Ray actors.

1. **Check** (before Ray starts): the config and its search section are valid, the
   output folder is free (or ``resume``), and there is something to measure with.
2. **Plan** every point on the driver, no GPU needed.  Predicted misfits and invalid
   points end there (``predicted_misfit``, ``error``); points already in
   ``results.jsonl`` are skipped (resume).
3. **Rank** by the objective's prediction.  ``min_peak`` and ``min_time_that_fits``
   measure the ``top_k`` best points in parallel and record the rest as
   ``predicted_fit``.  ``max_batch`` bisects the batch axis by prediction for each
   combination of the other axes, then bisects the ``top_k`` most promising
   combinations again on measured fit, one round of probes per combination at a time.
4. **Measure** on an ``EvaluatorPool``; every candidate ends as one line of
   ``results.jsonl``, and the best so far is kept in ``best/`` and ``summary.json``.

A search killed anywhere and run again with ``resume=True`` repeats only the
candidates that had not finished; rankings are pure functions of the predictions
and tie-break on keys, so it measures what the uninterrupted run would have and
ends with the same best.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mpplan.cluster.actors import ClusterError, EvaluatorPool, PoolSettings, cluster_capacity, cluster_gpus, ray_session
from mpplan.cluster.batch import BatchChain, largest_fitting
from mpplan.cluster.evaluator import EvaluateFn, RuntimeEvaluator
from mpplan.cluster.objective import Objective
from mpplan.cluster.planning import Outcome, PointPlanner, predicted_to_fit, result_of
from mpplan.cluster.progress import Progress
from mpplan.cluster.records import Candidate, Result, Status
from mpplan.cluster.space import Axis, Overrides, axes, base_raw, grid, split_batch_axis
from mpplan.cluster.store import ResultStore
from mpplan.config import Config, batch_axis_key, load_config
from mpplan.errors import ConfigError
from mpplan.units import format_size

logger = logging.getLogger("mpplan")

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


def run_search(
    config: Config | str | Path,
    *,
    address: str | None = None,
    resume: bool = False,
    out: str | Path | None = None,
    progress: bool = True,
    evaluate_candidate: EvaluateFn | None = None,
    on_result: Callable[[Result], None] | None = None,
) -> SearchSummary:
    """Search ``config``'s ``search.space`` and return how it went; results land in ``out``.

    ``config`` is a ``Config`` or a YAML path.  ``address``: None starts Ray inside
    this call (or uses the session this process already has), ``"auto"`` or
    ``"ray://..."`` joins a cluster.  ``out`` defaults to ``output.dir``; a folder
    that holds ``results.jsonl`` is refused unless ``resume``.  ``progress`` draws a
    bar when stderr is a terminal (log lines otherwise).  ``evaluate_candidate``
    replaces the default ``RuntimeEvaluator`` (see ``mpplan.cluster.evaluator``);
    ``on_result`` sees every result this run records, as it is recorded.
    Bad input raises ``ConfigError`` before Ray starts.
    """
    if not isinstance(config, Config):
        config = load_config(config)
    search = config.search
    objective = Objective(search.objective, batch_axis_key(search))
    space_axes = axes(search, config.source, base=config)
    if search.top_k > 0 and evaluate_candidate is None:
        if config.model.torch is None:
            raise ConfigError(
                f"{config.source}: search.top_k: measuring runs model.torch; a synthetic graph or graph file "
                "can only be ranked by prediction (search.top_k: 0)"
            )
        measure = search.measure
        evaluate_candidate = RuntimeEvaluator(
            steps=measure.steps, warmup=measure.warmup, arena=measure.arena, eager=measure.eager
        )
    reporter = Progress.for_terminal(objective, progress)
    folder = Path(out) if out is not None else Path(config.output.dir)
    with ResultStore(folder, resume=resume) as store, ExitStack() as ray_scope:
        session = _Session(config, objective, store, reporter, evaluate_candidate, on_result, space_axes)
        session.connect = functools.partial(_connect_once, ray_scope, address)
        state = "interrupted"
        try:
            if address is not None and session.measuring:
                session.connect()  # a cluster: fail fast on a bad address; a local Ray starts only when needed
            work = _max_batch(session) if objective.name == "max_batch" else _grid(session)
            _measure(session, work)
            state = "finished"
        finally:
            reporter.close()
            summary = session.summary(state)
    return summary


def _connect_once(scope: ExitStack, address: str | None) -> None:
    """Be connected until ``scope`` closes; idempotent, since ``ray_session`` reuses a live session."""
    scope.enter_context(ray_session(address))


class _Work(Protocol):
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
class _Session:
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
        self.planner = PointPlanner(base_raw(self.config), self.config.source, self.store, self.record)

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
        """After planning: the best among this space's finished results, and ``best/`` made to match it."""
        mine = [self.store.results[k] for k in sorted(self.planner.keys) if k in self.store.results]
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


def _grid(session: _Session) -> _GridWork:
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

    session: _Session
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


def _max_batch(session: _Session) -> _BatchWork:
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


# --- measuring ---------------------------------------------------------------------------------


def _measure(session: _Session, work: _Work) -> None:
    """Run ``work`` on an evaluator pool sized to the cluster, recording every result as it lands."""
    if not session.measuring or work.want() == 0:
        return
    assert session.evaluate_candidate is not None
    session.connect()
    search = session.config.search
    biggest = cluster_gpus()
    gpus = _gpus_per_actor(search.gpus_per_actor, work.devices(), biggest)
    if gpus > biggest:
        raise ClusterError(
            f"each evaluator actor needs {gpus} GPUs (search.gpus_per_actor) but the largest node has {biggest}; "
            "set search.gpus_per_actor: 0 to measure on virtual devices"
        )
    capacity = cluster_capacity(1.0, gpus)
    session.actors = search.actors or max(1, min(capacity, work.want()))
    settings = PoolSettings(
        actors=session.actors,
        timeout_s=search.timeout_s,
        retries=search.retries,
        num_cpus=1.0,
        num_gpus=float(gpus),
        startup_timeout_s=search.startup_timeout_s,
    )
    with EvaluatorPool(session.evaluate_candidate, settings) as pool:
        for candidate in work.start(session.actors):
            pool.submit(candidate)
        total = work.estimate()
        session.progress.begin("measuring", total)
        while pool.pending:
            for done in pool.poll():
                evaluation = done.evaluation
                result = result_of(
                    done.candidate,
                    evaluation.status,
                    measurement=evaluation.measurement,
                    error=evaluation.error,
                    attempts=done.attempts,
                    seconds=evaluation.seconds,
                    worker=evaluation.worker,
                )
                session.measured += 1
                session.evaluations = pool.evaluations
                session.record(result)
                session.measure_seconds = time.monotonic() - (pool.first_dispatch or time.monotonic())
                session.progress.measured(result, session.best, total)
                for candidate in work.follow(result):
                    pool.submit(candidate)
        session.evaluations = pool.evaluations


def _gpus_per_actor(configured: int | None, devices: int, biggest: int) -> int:
    """GPUs each evaluator actor asks for: ``search.gpus_per_actor`` when set, else one per
    planned device when a node has that many, else none (virtual devices: a 2-device
    search on a 1-GPU laptop still measures, instead of waiting for a node that does not exist)."""
    if configured is not None:
        return configured
    if 0 < biggest < devices:
        logger.info("search: candidates plan %d devices, the largest node has %d GPUs: measuring on virtual devices",
                    devices, biggest)
    return devices if 0 < devices <= biggest else 0


def _to_measure(session: _Session, outcome: Outcome) -> Candidate | None:
    """The candidate to measure for a planned point, or None when its result is already final."""
    if isinstance(outcome, Candidate):
        return outcome
    if outcome.status is Status.PREDICTED_FIT and session.measuring:
        return session.planner.candidate(outcome)
    return None


def _fits_by_prediction(work: _BatchWork, combo: int, index: int) -> bool:
    return predicted_to_fit(work.outcome(combo, index))


def _final(session: _Session, outcome: Outcome) -> Result | None:
    """The point's final result if it has one by now (another combination may have measured its key)."""
    stored = session.store.get(outcome.key)
    if stored is None or (stored.status is Status.PREDICTED_FIT and session.measuring):
        return None
    return stored


def _as_result(outcome: Outcome) -> Result:
    return result_of(outcome, Status.PREDICTED_FIT) if isinstance(outcome, Candidate) else outcome


def _planned_status(outcome: Outcome) -> Status | None:
    return None if isinstance(outcome, Candidate) else outcome.status


__all__: Sequence[str] = ["SearchSummary", "run_search"]

"""Driver-side planning of search points: config, graph, key and plan, without a GPU.

Each point either ends here (``predicted_misfit``, ``error``, or found finished in
the store on resume) or becomes a ``Candidate`` predicted to fit, to be ranked and
perhaps measured.  Graphs are built once per (model, workload): a planner sweep
over one model captures it once, a batch sweep once per batch.  A torch model's plan
is the one ``mpplan plan`` makes, as arena mode runs it on virtual devices (its blocks,
and what ops hold outside them: ``runtime.scratch.plan_as_run``), so the peak it
predicts is the peak a measurement there finds; an actor on GPUs plans it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mpplan.capture import TRACED_FOR, graph_from_config, program_from_config
from mpplan.cluster.apply_fit import ApplyMisfit, plan_point
from mpplan.cluster.records import Candidate, Result, Status, predicted_of
from mpplan.cluster.space import (
    Overrides,
    candidate_config,
    candidate_key,
    invalid_key,
    planner_section,
    workload_key,
)
from mpplan.cluster.store import ResultStore
from mpplan.config import Config, Device, resolve_devices
from mpplan.graph import Graph
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan

if TYPE_CHECKING:
    from mpplan.capture.torch_capture import CapturedProgram

Outcome = Candidate | Result
"""What planning a point gives: a candidate still to rank and measure, or a finished result."""


@dataclass
class PointPlanner:
    """Plans points of one search; final outcomes go to ``record``, fitting plans are kept by key.

    ``store`` is read to skip finished points (resume); only ``record`` writes.
    ``fit`` is ``search.fit``: ``plan`` judges a point by its plan's own peak,
    ``apply`` by ``apply``'s prediction for the user's loop (``cluster.apply_fit``).
    """

    base: dict[str, Any]
    source: str
    store: ResultStore
    record: Callable[[Result], None]
    fit: str = "plan"
    step_in_backward: bool = False
    """``search.step_in_backward`` (with ``fit: apply``): the loop steps its optimizer inside backward."""
    plans: dict[str, Plan] = field(default_factory=dict)
    keys: set[str] = field(default_factory=set)
    """Every key this search resolved: the results that belong to the current space."""
    _graphs: dict[str, Graph] = field(default_factory=dict, repr=False)
    _programs: dict[str, CapturedProgram | None] = field(default_factory=dict, repr=False)

    def resolve(self, overrides: Overrides) -> Outcome:
        """The point's stored result if it has one, else its plan's verdict (recorded when final)."""
        try:
            config = candidate_config(self.base, overrides, self.source)
        except Exception as exc:  # noqa: BLE001 - an invalid combination is one bad candidate
            return self._finish(Result(invalid_key(overrides), Status.ERROR, dict(overrides), error=_message(exc)))
        try:
            program, graph = self._graph(config)
            devices = resolve_devices(config)
            settings = PlannerSettings.from_config(config.planner)
            # version 1 of the graph's hash, which keys written before version 2 hold: a stored search resumes
            key = candidate_key(graph.content_hash_v1, self._judged(config), devices, config.workload)
        except Exception as exc:  # noqa: BLE001
            return self._finish(Result(invalid_key(overrides), Status.ERROR, dict(overrides), error=_message(exc)))
        self.keys.add(key)
        stored = self.store.get(key)
        if stored is not None:
            return stored
        try:
            if not devices:
                raise ValueError("devices: needs at least one device to plan for")
            if self.fit == "apply":
                return self._plan_for_apply(key, overrides, config, devices, settings)
            made = self._plan(program, graph, devices, settings)
        except Exception as exc:  # noqa: BLE001 - a planner failure on one point must not stop the search
            failed = Result(
                key,
                Status.ERROR,
                dict(overrides),
                graph_hash=graph.content_hash,
                settings=settings.to_dict(),
                workload=dict(config.workload),
                error=_message(exc),
            )
            return self._finish(failed)
        candidate = Candidate(key, tuple(overrides), config, made, planned_for=_planned_for(program))
        if made.misfits:
            return self._finish(result_of(candidate, Status.PREDICTED_MISFIT))
        self.plans[key] = made
        return candidate

    def _judged(self, config: Config) -> dict[str, Any]:
        """What the key holds of the planner: its section, and the fit (and the step in backward, when on) when
        it is not the plan's own."""
        section = planner_section(config)
        if self.fit == "plan":
            return section
        if self.step_in_backward:  # another loop, another peak; absent when off, so old keys hold
            return {**section, "search_fit": self.fit, "step_in_backward": True}
        return {**section, "search_fit": self.fit}

    def _plan_for_apply(
        self, key: str, overrides: Overrides, config: Config, devices: Sequence[Device], settings: PlannerSettings
    ) -> Outcome:
        """The point planned so ``apply``'s peak fits (a candidate), or its predicted misfit (final)."""
        point = plan_point(config, devices, settings, step_in_backward=self.step_in_backward)
        if isinstance(point, ApplyMisfit):
            misfit = Result(
                key,
                Status.PREDICTED_MISFIT,
                dict(overrides),
                settings=settings.to_dict(),
                workload=dict(config.workload),
                capacities={d.name: d.usable for d in devices},
                predicted={"fit": "apply", "max_peak_bytes": point.least_peak_bytes,
                           "misfit_bytes": point.missing_bytes},
            )
            return self._finish(misfit)
        self.plans[key] = point.plan
        return Candidate(key, tuple(overrides), config, point.plan, apply_peak_bytes=point.predicted_peak_bytes)

    def candidate(self, result: Result) -> Candidate:
        """Plan a stored ``predicted_fit`` result again, to measure it (a resume with a larger ``top_k``)."""
        overrides = tuple(result.overrides.items())
        config = candidate_config(self.base, overrides, self.source)
        if self.fit == "apply":
            again = self._plan_for_apply(result.key, overrides, config, resolve_devices(config),
                                         PlannerSettings.from_config(config.planner))
            assert isinstance(again, Candidate), "a point predicted to fit fits again: planning is deterministic"
            return again
        program, graph = self._graph(config)
        made = self.plans.get(result.key) or self._plan(
            program, graph, resolve_devices(config), PlannerSettings.from_config(config.planner)
        )
        self.plans[result.key] = made
        return Candidate(result.key, overrides, config, made, planned_for=_planned_for(program))

    def _graph(self, config: Config) -> tuple[CapturedProgram | None, Graph]:
        """The config's captured torch model (None for another model) and its graph, built once per workload."""
        key = workload_key(config)
        if key not in self._graphs:
            program = program_from_config(config) if config.model.torch is not None else None
            self._programs[key] = program
            self._graphs[key] = graph_from_config(config, program)
        return self._programs[key], self._graphs[key]

    def _plan(self, program: CapturedProgram | None, graph: Graph, devices: Sequence[Device],
              settings: PlannerSettings) -> Plan:
        """The point's plan; a torch model's (``program``, ``graph`` its graph) as arena mode runs it on
        ``TRACED_FOR`` devices (module docstring), the same plan ``mpplan plan`` writes for these settings."""
        if program is None:
            return plan(graph, devices, settings)
        from mpplan.runtime.scratch import plan_as_run

        return plan_as_run(program, devices, settings, TRACED_FOR)

    def forget(self, keys: set[str]) -> None:
        """Drop the kept plans of ``keys`` (candidates that will not be measured)."""
        for key in keys:
            self.plans.pop(key, None)

    def _finish(self, result: Result) -> Result:
        self.keys.add(result.key)
        stored = self.store.get(result.key)
        if stored is not None:
            return stored
        self.record(result)
        return result


def result_of(candidate: Candidate, status: Status, **measured: Any) -> Result:
    """The result line of a planned candidate; ``measured`` adds measurement, error, attempts, seconds, worker."""
    plan_ = candidate.plan
    predicted = predicted_of(plan_)
    if candidate.planned_for is not None:  # the basis of the peaks: arena blocks and scratch for this device type
        predicted["planned_for"] = candidate.planned_for
    if candidate.apply_peak_bytes is not None:  # search.fit: apply: the search judges by the user's loop
        predicted.update(fit="apply", plan_max_peak_bytes=plan_.max_peak_bytes,
                         max_peak_bytes=candidate.apply_peak_bytes, misfit_bytes=0)
    return Result(
        key=candidate.key,
        status=status,
        overrides=dict(candidate.overrides),
        graph_hash=plan_.graph_hash,
        settings=dict(plan_.settings),
        workload=dict(candidate.config.workload),
        capacities={d.name: d.capacity_bytes for d in plan_.devices},
        predicted=predicted,
        **measured,
    )


def predicted_to_fit(outcome: Outcome) -> bool:
    """Whether the point's plan fits by prediction (a measured result was predicted to fit)."""
    if isinstance(outcome, Candidate):
        return True
    return outcome.predicted is not None and outcome.status is not Status.PREDICTED_MISFIT


def _planned_for(program: CapturedProgram | None) -> str | None:
    """The torch device type a point's plan counts arena blocks and scratch for: ``TRACED_FOR`` for a torch
    model, None for a graph planned without them."""
    return None if program is None else TRACED_FOR


def _message(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"

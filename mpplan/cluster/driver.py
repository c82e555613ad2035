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
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from mpplan.cluster.actors import ClusterError, EvaluatorPool, PoolSettings, cluster_capacity, cluster_gpus, ray_session
from mpplan.cluster.apply_fit import ApplyEvaluator
from mpplan.cluster.choose import plan_grid, plan_max_batch
from mpplan.cluster.evaluator import EvaluateFn, RuntimeEvaluator
from mpplan.cluster.objective import Objective
from mpplan.cluster.planning import result_of
from mpplan.cluster.progress import Progress
from mpplan.cluster.records import Result
from mpplan.cluster.session import Session, Work
from mpplan.cluster.space import axes
from mpplan.cluster.store import ResultStore
from mpplan.cluster.summary import SUMMARY_SCHEMA, SearchSummary
from mpplan.config import Config, batch_axis_key, load_config
from mpplan.errors import ConfigError

logger = logging.getLogger("mpplan")


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
    if search.fit == "apply" and config.model.torch is None:
        raise ConfigError(
            f"{config.source}: search.fit: apply trains model.torch in your loop; a synthetic graph or graph file "
            "has no model to train (search.fit: plan)"
        )
    if search.step_in_backward and (
        search.fit != "apply" or config.model.torch is None or config.model.torch.optimizer == "none"
    ):
        raise ConfigError(f"{config.source}: search.step_in_backward: steps your loop's optimizer in backward under "
                          "mpplan.apply: needs search.fit: apply and model.torch.optimizer")
    if search.top_k > 0 and evaluate_candidate is None:
        if config.model.torch is None:
            raise ConfigError(
                f"{config.source}: search.top_k: measuring runs model.torch; a synthetic graph or graph file "
                "can only be ranked by prediction (search.top_k: 0)"
            )
        measure = search.measure
        if search.fit == "apply":
            evaluate_candidate = ApplyEvaluator(steps=measure.steps, step_in_backward=search.step_in_backward)
        else:
            evaluate_candidate = RuntimeEvaluator(
                steps=measure.steps, warmup=measure.warmup, arena=measure.arena, eager=measure.eager
            )
    reporter = Progress.for_terminal(objective, progress)
    folder = Path(out) if out is not None else Path(config.output.dir)
    with ResultStore(folder, resume=resume) as store, ExitStack() as ray_scope:
        session = Session(config, objective, store, reporter, evaluate_candidate, on_result, space_axes)
        session.connect = functools.partial(_connect_once, ray_scope, address)
        state = "interrupted"
        try:
            if address is not None and session.measuring:
                session.connect()  # a cluster: fail fast on a bad address; a local Ray starts only when needed
            work = plan_max_batch(session) if objective.name == "max_batch" else plan_grid(session)
            _measure(session, work)
            state = "finished"
        finally:
            reporter.close()
            summary = session.summary(state)
    return summary


def _connect_once(scope: ExitStack, address: str | None) -> None:
    """Be connected until ``scope`` closes; idempotent, since ``ray_session`` reuses a live session."""
    scope.enter_context(ray_session(address))


# --- measuring ---------------------------------------------------------------------------------


def _measure(session: Session, work: Work) -> None:
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


__all__: Sequence[str] = ["SUMMARY_SCHEMA", "SearchSummary", "run_search"]

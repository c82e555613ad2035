"""Evaluator actors on Ray, and the pool that keeps them busy, timed, and alive.

One actor is one evaluation slot: it owns its devices (``num_gpus`` GPUs, or none
and virtual devices) and keeps its evaluator, with whatever the evaluator caches,
from one candidate to the next.  The pool hands out candidates, and turns every
infrastructure failure into data (in the spirit of ``ray.util.ActorPool``, plus
timeouts and replacement):

* an actor that dies (``RayActorError``) is replaced and the candidate retried, up
  to ``retries`` times, then finished as ``actor_died``;
* a candidate still running ``timeout_s`` after it was handed to a ready actor has
  its actor killed (``ray.kill``) and replaced, and is retried the same way, then
  finished as ``timeout``;
* OOMs and errors inside the evaluator are the actor's business (``evaluate_safely``):
  the actor survives them.

Only ``mpplan.cluster`` imports Ray, and within it only this module.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayActorError, RayError, WorkerCrashedError

from mpplan.cluster.evaluator import EvaluateFn, evaluate_safely
from mpplan.cluster.reaper import Reaper
from mpplan.cluster.records import Candidate, Evaluation, Status
from mpplan.errors import ConfigError, MpplanError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; never imported at run time

logger = logging.getLogger("mpplan")


class ClusterError(MpplanError, RuntimeError):
    """The cluster cannot host the evaluator actors (no resources, or actors that cannot start)."""


@contextmanager
def ray_session(address: str | None) -> Iterator[None]:
    """Be connected to Ray inside the block.

    A session this process already has (a notebook, a test fixture) is used as is
    and left running.  Otherwise ``address=None`` starts a new Ray locally for the
    block, even when a ``ray start`` cluster runs on this machine (or joins
    ``RAY_ADDRESS`` when set, as inside ``ray job submit``), ``"auto"``
    joins the cluster this machine belongs to, and ``ray://host:port`` connects a
    client, shipping the ``mpplan`` package to the cluster's workers.

    The embedded Ray is private: it listens on 127.0.0.1 only (``_private_node``)
    and dies with this process, even when it is killed (``mpplan.cluster.reaper``).
    """
    if ray.is_initialized():
        yield
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING}
    embedded = address is None and not os.environ.get("RAY_ADDRESS")
    if address is None:
        kwargs["include_dashboard"] = False
    if address is not None and address.startswith("ray://"):
        import mpplan

        kwargs["runtime_env"] = {"py_modules": [os.path.dirname(mpplan.__file__)]}
    reaper = Reaper.start() if embedded else None
    try:
        try:
            if embedded:
                with _private_node():
                    ray.init(address="local", _node_ip_address="127.0.0.1", **kwargs)  # never a `ray start` one
            else:
                ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"--address: cannot connect to Ray at {address or 'a local cluster'}: {exc}") from None
        try:
            yield
        finally:
            ray.shutdown()
    finally:
        if reaper is not None:
            reaper.close()


@contextmanager
def _private_node() -> Iterator[None]:
    """Start the embedded Ray on 127.0.0.1 only, with Ray's token authentication as a stated choice.

    Ray replaces a loopback ``_node_ip_address`` with the machine's reachable address
    unless it believes clusters are off (``ray_constants.ENABLE_RAY_CLUSTER``, as on
    macOS); with it off, GCS, raylet, agents and workers listen on 127.0.0.1 only.
    ``tests/test_cluster_private.py`` checks the listening sockets, so a Ray upgrade
    that changes this fails a test rather than opening ports.  ``RAY_AUTH_MODE``
    is left to Ray, whose default for a new local cluster is token authentication; mpplan
    documents that choice (docs/cluster.md) instead of passing on Ray's warning about
    it.  A user's own ``RAY_AUTH_MODE`` is respected.  The flag is restored after start-up.
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    auth_logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    quiet = _DropTokenDefaultWarning()
    ray_constants.ENABLE_RAY_CLUSTER = False
    auth_logger.addFilter(quiet)
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        auth_logger.removeFilter(quiet)


class _DropTokenDefaultWarning(logging.Filter):
    """Drops Ray's "Token authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out" (documented)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled")


def cluster_capacity(num_cpus: float, num_gpus: float) -> int:
    """How many actors needing ``num_cpus`` CPUs and ``num_gpus`` GPUs the alive nodes hold at once."""
    total = 0
    for node in _alive_nodes():
        resources = node.get("Resources", {})
        fits = [int(resources.get("CPU", 0) // num_cpus)] if num_cpus else []
        if num_gpus:
            fits.append(int(resources.get("GPU", 0) // num_gpus))
        total += min(fits) if fits else 0
    return total


def cluster_gpus() -> int:
    """The GPUs of the biggest alive node (an actor's devices live on one node)."""
    return max((int(n.get("Resources", {}).get("GPU", 0)) for n in _alive_nodes()), default=0)


def _alive_nodes() -> list[dict[str, Any]]:
    """The cluster's alive nodes as ``ray.nodes()`` describes them (``Resources``: name -> amount)."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [n for n in nodes if n.get("Alive")]


class EvaluatorActor:
    """One evaluation slot (a Ray actor): evaluates candidate after candidate with its own evaluator."""

    def __init__(self, evaluate_candidate: EvaluateFn) -> None:
        self._evaluate = evaluate_candidate
        self._worker = f"{socket.gethostname()}:{os.getpid()}"

    def ready(self) -> str:
        """Answer once constructed, with where it runs."""
        return self._worker

    def evaluate(self, candidate: Candidate) -> Evaluation:
        return evaluate_safely(self._evaluate, candidate, self._worker)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Resources per actor and the failure policy (``search.*`` in the config)."""

    actors: int
    timeout_s: float
    retries: int
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    startup_timeout_s: float = 300.0


@dataclass(frozen=True)
class Finished:
    """A candidate the pool is done with: its last attempt's evaluation and how many attempts it took."""

    candidate: Candidate
    evaluation: Evaluation
    attempts: int


@dataclass
class _Job:
    candidate: Candidate
    attempt: int
    ref: Any = None
    started: float = 0.0


@dataclass
class _Slot:
    actor: Any
    ready_ref: Any
    created: float
    job: _Job | None = None


class EvaluatorPool:
    """``settings.actors`` evaluator actors behind two verbs: ``submit`` a candidate, ``poll`` for finished ones.

    Use it as a context manager so its actors are killed however the block ends::

        with EvaluatorPool(evaluate_candidate, PoolSettings(actors=2, timeout_s=60, retries=1)) as pool:
            pool.submit(candidate)
            while pool.pending:
                for finished in pool.poll():
                    ...
    """

    def __init__(self, evaluate_candidate: EvaluateFn, settings: PoolSettings) -> None:
        if settings.actors < 1:
            raise ValueError(f"EvaluatorPool: expected at least 1 actor, got {settings.actors}")
        self.settings = settings
        self._cls = ray.remote(EvaluatorActor).options(
            num_cpus=settings.num_cpus, num_gpus=settings.num_gpus, max_restarts=0, max_task_retries=0
        )
        self._evaluator_ref = ray.put(evaluate_candidate)
        self._queue: deque[_Job] = deque()
        self._slots = [self._start_slot() for _ in range(settings.actors)]
        self.evaluations = 0
        """Attempts handed to actors so far."""
        self.replaced = 0
        """Actors killed or found dead, and replaced."""
        self.first_dispatch: float | None = None
        """``time.monotonic()`` when the first candidate reached a ready actor."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending(self) -> int:
        """Candidates submitted and not yet finished."""
        return len(self._queue) + sum(1 for s in self._slots if s.job is not None)

    def submit(self, candidate: Candidate) -> None:
        """Queue a candidate; it goes to the first ready actor."""
        self._queue.append(_Job(candidate, attempt=1))

    def poll(self, timeout_s: float | None = None) -> list[Finished]:
        """Wait until at least one candidate finishes (or ``timeout_s`` passes); return the finished ones."""
        until = None if timeout_s is None else time.monotonic() + timeout_s
        finished: list[Finished] = []
        while self.pending and not finished:
            self._dispatch()
            now = time.monotonic()
            wait = self._next_deadline(now)
            if until is not None:
                wait = min(wait, max(0.0, until - now))
            refs = [s.ready_ref for s in self._slots if s.ready_ref is not None]
            refs += [s.job.ref for s in self._slots if s.job is not None and s.job.ref is not None]
            done, _ = ray.wait(refs, num_returns=1, timeout=wait)
            if done:
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            finished += self._collect(set(done))
            finished += self._expire(time.monotonic())
            if until is not None and time.monotonic() >= until:
                break
        return finished

    def close(self) -> None:
        """Kill every actor (work in flight is abandoned; its candidates stay unfinished)."""
        for slot in self._slots:
            ray.kill(slot.actor, no_restart=True)
        self._slots = []
        self._queue.clear()

    # --- internals ---------------------------------------------------------------------------

    def _start_slot(self) -> _Slot:
        actor: Any = self._cls.remote(self._evaluator_ref)
        return _Slot(actor=actor, ready_ref=actor.ready.remote(), created=time.monotonic())

    def _replace(self, slot: _Slot) -> None:
        ray.kill(slot.actor, no_restart=True)
        fresh = self._start_slot()
        slot.actor, slot.ready_ref, slot.created, slot.job = fresh.actor, fresh.ready_ref, fresh.created, None
        self.replaced += 1

    def _dispatch(self) -> None:
        for slot in self._slots:
            if not self._queue:
                return
            if slot.job is None and slot.ready_ref is None:
                job = self._queue.popleft()
                job.ref = slot.actor.evaluate.remote(job.candidate)
                job.started = time.monotonic()
                slot.job = job
                self.evaluations += 1
                if self.first_dispatch is None:
                    self.first_dispatch = job.started

    def _next_deadline(self, now: float) -> float:
        deadlines = [s.job.started + self.settings.timeout_s for s in self._slots if s.job is not None]
        deadlines += [s.created + self.settings.startup_timeout_s for s in self._slots if s.ready_ref is not None]
        return max(0.0, min(deadlines, default=now + 1.0) - now)

    def _collect(self, done: set[Any]) -> list[Finished]:
        finished = []
        for slot in self._slots:
            if slot.ready_ref is not None and slot.ready_ref in done:
                self._started(slot)
            elif slot.job is not None and slot.job.ref in done:
                job = slot.job
                try:
                    evaluation = ray.get(job.ref)
                except (RayActorError, WorkerCrashedError) as exc:
                    logger.warning(
                        "evaluator actor died on %s (attempt %d): %s", job.candidate.key, job.attempt, _first_line(exc)
                    )
                    self._replace(slot)
                    finished += self._retry(job, Status.ACTOR_DIED, f"actor died: {_first_line(exc)}")
                    continue
                except RayError as exc:  # the call failed around the evaluator: e.g. an unpicklable result
                    evaluation = Evaluation(Status.ERROR, error=f"{type(exc).__name__}: {_first_line(exc)}")
                slot.job = None
                finished.append(Finished(job.candidate, evaluation, job.attempt))
        return finished

    def _started(self, slot: _Slot) -> None:
        try:
            where = ray.get(slot.ready_ref)
        except RayError as exc:
            raise ClusterError(f"an evaluator actor failed to start: {_first_line(exc)}") from None
        slot.ready_ref = None
        logger.debug("evaluator actor ready on %s", where)

    def _expire(self, now: float) -> list[Finished]:
        finished = []
        for slot in self._slots:
            if slot.ready_ref is not None and now - slot.created > self.settings.startup_timeout_s:
                raise ClusterError(
                    f"no evaluator actor started within {self.settings.startup_timeout_s:g}s; each needs "
                    f"{self.settings.num_cpus:g} CPU and {self.settings.num_gpus:g} GPU "
                    "(search.gpus_per_actor, search.startup_timeout_s)"
                )
            job = slot.job
            if job is not None and now - job.started > self.settings.timeout_s:
                logger.warning(
                    "candidate %s timed out after %gs (attempt %d)",
                    job.candidate.key,
                    self.settings.timeout_s,
                    job.attempt,
                )
                self._replace(slot)
                finished += self._retry(job, Status.TIMEOUT, f"no result within {self.settings.timeout_s:g}s")
        return finished

    def _retry(self, job: _Job, status: Status, error: str) -> list[Finished]:
        if job.attempt <= self.settings.retries:
            self._queue.appendleft(_Job(job.candidate, attempt=job.attempt + 1))
            return []
        return [Finished(job.candidate, Evaluation(status, error=error), job.attempt)]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "ClusterError",
    "EvaluatorActor",
    "EvaluatorPool",
    "Finished",
    "PoolSettings",
    "cluster_capacity",
    "cluster_gpus",
    "ray_session",
]

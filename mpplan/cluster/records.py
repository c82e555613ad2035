"""The search's records: statuses, candidates sent to actors, evaluations, and results.jsonl lines.

Every candidate ends as exactly one ``Result`` whatever happened to it; failures
are statuses here, never exceptions, so one bad candidate cannot stop a search.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mpplan.config import Config
from mpplan.errors import ConfigError
from mpplan.plan import Plan
from mpplan.search_status import Status as Status  # re-exported: the search's records hold it

RESULT_SCHEMA = "mpplan.search.result/1"


@dataclass(frozen=True)
class Candidate:
    """One planned point of the search space, as an evaluator actor receives it.

    ``config`` is the run config with ``overrides`` applied; ``plan`` is the
    driver's plan for it; ``key`` identifies it across runs (see ``space.candidate_key``).
    ``apply_peak_bytes`` is ``apply``'s predicted peak in the user's loop when the
    search judges fit by it (``search.fit: apply``), else None.  ``planned_for`` is the torch
    device type whose kernels ``plan``'s arena blocks and scratch were derived for
    (``capture.TRACED_FOR``), None when it counts none: an actor whose devices are of
    another type plans the point again for its own.
    """

    key: str
    overrides: tuple[tuple[str, Any], ...]
    config: Config
    plan: Plan
    apply_peak_bytes: int | None = None
    planned_for: str | None = None

    @property
    def workload(self) -> dict[str, int]:
        return dict(self.config.workload)


@dataclass(frozen=True)
class Evaluation:
    """What one attempt on an actor gave: ``measurement`` is the evaluator's dict when it returned one."""

    status: Status
    measurement: dict[str, Any] | None = None
    error: str | None = None
    seconds: float = 0.0
    worker: str | None = None


@dataclass(frozen=True)
class Result:
    """One line of ``results.jsonl``: a candidate, how it ended, what was predicted and measured.

    ``predicted`` holds ``max_peak_bytes``, ``cross_device_bytes``, ``compute_overhead``
    and ``devices`` ({name: peak bytes}), and for a torch model ``planned_for``, the torch
    device type whose arena blocks and scratch the peaks count (``blocks_unknown``: a
    result written before it was recorded); ``capacities`` the usable bytes per device;
    ``measurement`` the evaluator's dict (``devices[].measured_peak_bytes``,
    ``step_time_s``, ...).  ``attempts`` counts evaluations on actors (0: never sent).
    """

    key: str
    status: Status
    overrides: dict[str, Any]
    graph_hash: str | None = None
    settings: dict[str, Any] | None = None
    workload: dict[str, int] = field(default_factory=dict)
    capacities: dict[str, int] = field(default_factory=dict)
    predicted: dict[str, Any] | None = None
    measurement: dict[str, Any] | None = None
    error: str | None = None
    attempts: int = 0
    seconds: float = 0.0
    worker: str | None = None

    @property
    def predicted_peak_bytes(self) -> int | None:
        return None if self.predicted is None else int(self.predicted["max_peak_bytes"])

    @property
    def measured_peak_bytes(self) -> int | None:
        """The largest measured peak over the devices, when measured."""
        if not self.measurement or not self.measurement.get("devices"):
            return None
        return max(int(d["measured_peak_bytes"]) for d in self.measurement["devices"])

    @property
    def step_time_s(self) -> float | None:
        if not self.measurement or self.measurement.get("step_time_s") is None:
            return None
        return float(self.measurement["step_time_s"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RESULT_SCHEMA,
            "key": self.key,
            "status": self.status.value,
            "overrides": self.overrides,
            "graph_hash": self.graph_hash,
            "settings": self.settings,
            "workload": self.workload,
            "capacities": self.capacities,
            "predicted": self.predicted,
            "measurement": self.measurement,
            "error": self.error,
            "attempts": self.attempts,
            "seconds": self.seconds,
            "worker": self.worker,
        }

    def to_json(self) -> str:
        """One line of JSON, keys sorted, so equal results give equal bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Result:
        """Parse a ``results.jsonl`` line; ``ConfigError`` naming ``where`` on anything malformed."""
        if not isinstance(data, dict) or data.get("schema") != RESULT_SCHEMA:
            raise ConfigError(f"{where}: not a search result (expected schema {RESULT_SCHEMA!r})")
        try:
            return cls(
                key=str(data["key"]),
                status=Status(data["status"]),
                overrides=dict(data["overrides"]),
                graph_hash=data.get("graph_hash"),
                settings=data.get("settings"),
                workload=dict(data.get("workload") or {}),
                capacities=dict(data.get("capacities") or {}),
                predicted=data.get("predicted"),
                measurement=data.get("measurement"),
                error=data.get("error"),
                attempts=int(data.get("attempts", 0)),
                seconds=float(data.get("seconds", 0.0)),
                worker=data.get("worker"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: malformed search result ({type(exc).__name__}: {exc})") from None


def blocks_unknown(result: Result) -> bool:
    """Whether a torch model's stored plan-fit prediction does not say it counts arena blocks and scratch
    (``predicted.planned_for``): a search written before mpplan recorded it predicted the plain plan, which
    arena mode does not run as it is, so its peaks are not comparable with those predicted since.  Only a
    torch model's plans have blocks: the caller asks of those."""
    predicted = result.predicted
    return predicted is not None and "planned_for" not in predicted and predicted.get("fit") != "apply"


def predicted_of(plan: Plan) -> dict[str, Any]:
    """The prediction a result keeps from its plan."""
    return {
        "max_peak_bytes": plan.max_peak_bytes,
        "cross_device_bytes": plan.cross_device_bytes,
        "compute_overhead": plan.compute_overhead,
        "devices": {d.name: d.peak_bytes for d in plan.devices},
        "misfit_bytes": max((missing for _, missing in plan.misfits), default=0),
    }

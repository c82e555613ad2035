"""How a search candidate ended: its ``Status`` and what each status means, said once.

The search records statuses (``mpplan.cluster.records`` re-exports ``Status``); the report's legend
and the table of docs/cluster.md (``mpplan.reference.status_table``) say their meanings in these words.
It lives outside ``mpplan.cluster`` because importing anything there loads Ray, which the report must not.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """How a candidate ended; ``meaning`` says what each status means."""

    OK = "ok"
    PREDICTED_FIT = "predicted_fit"
    PREDICTED_MISFIT = "predicted_misfit"
    OOM = "oom"
    TIMEOUT = "timeout"
    ACTOR_DIED = "actor_died"
    ERROR = "error"

    @property
    def meaning(self) -> str:
        """What the status means, in the words of the report's legend and docs/cluster.md."""
        return _MEANINGS[self]

    @property
    def failed(self) -> bool:
        """A measurement was attempted and gave no usable number."""
        return self in (Status.OOM, Status.TIMEOUT, Status.ACTOR_DIED, Status.ERROR)


_MEANINGS = {
    Status.OK: "measured, and every device stayed within its capacity",
    Status.PREDICTED_FIT: "planned and predicted to fit, not measured (ranked below `top_k`, or `top_k` is 0)",
    Status.PREDICTED_MISFIT: "the plan's predicted peak is above a device's capacity: skipped, never measured",
    Status.OOM: "ran out of device memory while measured: an out-of-memory error, or a measured peak above capacity",
    Status.TIMEOUT: "still running after `search.timeout_s` on every attempt; "
                    "its actor was killed and replaced each time",
    Status.ACTOR_DIED: "its actor process died on every attempt (replaced each time)",
    Status.ERROR: "the config, the planner or the evaluation raised; `error` (in results.jsonl) says what",
}

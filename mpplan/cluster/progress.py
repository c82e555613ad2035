"""Search progress: a bar on a terminal, plain log lines elsewhere (``ray job logs``, CI, files).

Lines go to ``logging.getLogger("mpplan")`` at INFO; the command line decides
where they show.  The bar (``tqdm``) is used only when asked for and stderr is a
terminal.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from mpplan.cluster.objective import Objective
from mpplan.cluster.records import Result, Status

logger = logging.getLogger("mpplan")


@dataclass
class Counts:
    """What the search has done so far (mutable tallies, owned by one ``Progress``)."""

    planned: int = 0
    misfits: int = 0
    resumed: int = 0
    measured: int = 0
    failed: int = 0


@dataclass
class Progress:
    """Reports planning and measuring; ``bar=True`` draws bars, else logs a line per measured candidate."""

    objective: Objective
    bar: bool = False
    counts: Counts = field(default_factory=Counts)
    _bar: Any = field(default=None, init=False, repr=False)
    _last_log: float = field(default=0.0, init=False, repr=False)

    @classmethod
    def for_terminal(cls, objective: Objective, enabled: bool) -> Progress:
        """A bar when ``enabled`` and stderr is a terminal, log lines otherwise."""
        return cls(objective, bar=enabled and sys.stderr.isatty())

    def begin(self, phase: str, total: int) -> None:
        """Start ``planning`` or ``measuring`` ``total`` candidates."""
        self.close()
        self._last_log = time.monotonic()
        logger.info("search: %s %d candidates", phase, total)
        if self.bar and total:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=phase, unit="cand", file=sys.stderr, dynamic_ncols=True)

    def planned(self, status: Status | None, *, resumed: bool = False) -> None:
        """One candidate planned (``status`` None: it fits and waits for ranking)."""
        self.counts.planned += 1
        self.counts.resumed += resumed
        self.counts.misfits += status is Status.PREDICTED_MISFIT
        self._tick(f"{self.counts.misfits} misfit, {self.counts.resumed} resumed")
        now = time.monotonic()
        if not self.bar and now - self._last_log > 10.0:  # a heartbeat, not a line per plan
            self._last_log = now
            logger.info("search: planned %d (%d predicted misfits, %d resumed)", *self._planning())

    def measured(self, result: Result, best: Result | None, total: int) -> None:
        """One candidate finished on an actor (or was found finished on resume)."""
        self.counts.measured += 1
        self.counts.failed += result.status.failed
        best_text = self.objective.describe(best)
        self._tick(f"{self.counts.planned} planned, {self.counts.failed} failed, best {best_text}")
        if not self.bar:
            logger.info(
                "search: [%d/%d] %s %s%s | %d failed | best %s",
                self.counts.measured,
                total,
                result.status.value,
                _overrides_text(result),
                f" ({result.error})" if result.error else f" {self.objective.describe(result)}",
                self.counts.failed,
                best_text,
            )

    def end_planning(self, to_measure: int) -> None:
        logger.info(
            "search: planned %d (%d predicted misfits, %d resumed); %d to measure", *self._planning(), to_measure
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _planning(self) -> tuple[int, int, int]:
        return self.counts.planned, self.counts.misfits, self.counts.resumed

    def _tick(self, postfix: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(1)


def _overrides_text(result: Result) -> str:
    return " ".join(f"{k}={v}" for k, v in result.overrides.items()) or result.key

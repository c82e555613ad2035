"""The double-drop program built in a thread (``ProgramBuild``), so that ``solver: auto``'s
first fit and the build share the limit's time: HiGHS releases the GIL while it solves, and
the pure-Python build runs on the other core meanwhile instead of in the LNS's share.

The thread never outlives its use: ``cancel`` sets a stop event the program's memory rows
check beside their ``max_nonzeros`` check (the build then ends as a too-large program), and
``result`` waits only until a deadline, cancelling a build still running then.  ``remat``
cancels a build it did not consume (it raised, or skipped the LNS), since the build holds
the GIL and its memory (about 200 MB on RL250 at 0.8) while it runs.
"""

from __future__ import annotations

import sys
import threading
import time

from mpplan.passes.remat.cutmilp2 import DoubleProgram, double_program
from mpplan.passes.remat.model import RematModel

__all__ = ["ProgramBuild"]


class ProgramBuild:
    """The whole double-drop program of ``model`` at ``limit`` bytes (past
    ``formulation.MAX_NONZEROS``), built in a daemon thread from construction on until it is
    done or cancelled (module docstring)."""

    def __init__(self, model: RematModel, limit: int) -> None:
        self.model, self.limit = model, limit
        self._stop = threading.Event()
        self._program: DoubleProgram | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._build, name="double-program", daemon=True)
        self._thread.start()

    def _build(self) -> None:
        try:
            self._program = double_program(self.model, self.limit - self.model.static_bytes, max_nonzeros=sys.maxsize,
                                           stop=self._stop)
        except BaseException as exc:  # handed to the caller of ``result``
            self._error = exc

    def done(self) -> bool:
        """Whether the thread has ended (built, failed or cancelled)."""
        return not self._thread.is_alive()

    def cancel(self) -> None:
        """Asks the build to stop at its next memory row; its ``result`` is then ``None``.
        Harmless once it is done."""
        self._stop.set()

    def result(self, deadline: float | None = None) -> DoubleProgram | None:
        """The program (``None`` outside the cut model or when cancelled), once built: waits
        for the thread, until ``deadline`` (``time.perf_counter()``) when given, past which
        a build still running is cancelled and ``None`` returned at once."""
        self._thread.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        if self._thread.is_alive():
            self.cancel()
            return None
        if self._error is not None:
            raise self._error
        return self._program

"""MILP solves that cannot hang the planner: a big program is solved in a worker process,
killed when it overruns its time limit.

HiGHS 1.16's MIP presolve rule 13 ("parallel rows and columns") ignores ``time_limit``: a
neighbourhood sub-MILP of ``cutwindow`` on RL1000 at 0.8 (214k nonzeros) stayed in presolve
for over 400 s under a 5 s limit, and ``Highs.cancelSolve`` from another thread does not stop
it (docs/benchmarks.md).  Only a process can be stopped there, so ``MilpWorker.solve`` sends a
program of ``IN_PROCESS_NONZEROS`` or more to a worker process and kills it when no answer
comes ``grace`` seconds past the limit: the solve is then ``TIMED_OUT`` (no values), which
every caller reads as "nothing better found".  The next big solve starts a new worker.

Why a worker held by a context manager: the LNS loops solve dozens of 0.5-5 s sub-MILPs a
minute; a worker costs about 0.2 s to start and a solve in it a few ms more than in-process
(the arrays go as numpy buffers), so one per loop, not one per solve.  It starts at the
first big solve: a loop that holds one and solves only small programs starts none.  Programs
under ``IN_PROCESS_NONZEROS`` stay in the calling process, where nothing could stop them, with
HiGHS's presolve rule 13 off (``backends.in_process``): the rule known to ignore the limit,
whose loss of quality shows on big programs only.  The test suite solves thousands of them.

The worker is a fresh interpreter (``subprocess``: fork and exec at once, as
``multiprocessing``'s ``spawn`` does; never a bare ``fork`` of the planner, which has threads:
HiGHS's, ``programbuild``'s build thread, Ray's), started with ``-c`` so it does not import
the planner's ``__main__`` again as ``spawn`` would (0.1-0.3 s each start).  Its stdout is
``/dev/null``: HiGHS's banner never reaches the CLI's output.  It does not outlive the
planner: it exits when its requests' pipe closes (``close``, or the planner's exit), and a
thread in it exits the process when its lifeline pipe closes, i.e. the planner died, even
while the solve is stuck in a presolve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any, cast

from mpplan.milp.backends import Backend, MilpArrays, Solved, in_process

__all__ = ["GRACE_S", "GRACE_SHARE", "IN_PROCESS_NONZEROS", "MAX_WAIT_S", "TIMED_OUT", "MilpWorker", "isolates"]

#: Programs with fewer nonzeros are solved in the calling process (module docstring), with
#: presolve rule 13 off (``backends.in_process``).  The hang needs no big program: rows of the
#: 214k-nonzero repro removed while its presolve still hung left 183 rows, 473 columns and
#: 1,726 nonzeros (``tests/data/highs_presolve_hang.json.gz``), which without rule 13 solves
#: in process in 0.04 s.  Each solve sent to a worker that holds no worker yet pays a start
#: (0.2-0.6 s): with 1,000 here the test suite took 17.8 min instead of 12.5 (single solves of
#: 1,000-20,000 nonzeros), and every cell's solve has 97k nonzeros or more.
IN_PROCESS_NONZEROS = 20_000

#: A worker's solve is killed ``GRACE_S + GRACE_SHARE * limit`` seconds past its limit:
#: HiGHS checks its clock only now and then, and the program's transfer and load count
#: here, not in HiGHS's limit.  Measured past a 0.2-3 s limit on a 214k-nonzero program:
#: 0.04-0.27 s; on RL250's LNS sub-MILPs: at most 0.15 s.
GRACE_S = 1.0
GRACE_SHARE = 0.1

#: The answer of a solve killed past its limit: no values, no bound.
TIMED_OUT: Solved = ("time_limit", None, None, None)

#: The longest single wait on the replies' pipe: ``Connection.poll`` overflows past about 2e6 s
#: (a ``time_limit_s`` the config allows), so a longer limit is waited in these steps.
MAX_WAIT_S = 86_400.0

#: How long a worker may take to start (the interpreter, numpy, highspy) before it is given up.
START_TIMEOUT_S = 120.0

#: The worker's entry: argv is the three pipe ends, then the planner's ``sys.path``, which
#: replaces the worker's own (whose first entry, ``-c``'s working directory, could hold
#: another ``mpplan``).
_BOOT = ("import sys; sys.path[:] = sys.argv[4:]; from mpplan.milp.worker import serve; "
         "serve(*map(int, sys.argv[1:4]))")


@dataclass(frozen=True, slots=True)
class Arrays:
    """A program's arrays as numpy buffers: they pickle as bytes (a 214k-nonzero program's
    lists took 28 ms to pass as lists), and the program objects carry their model too."""

    cost: Any
    col_lo: Any
    col_hi: Any
    integer: Any
    row_lo: Any
    row_hi: Any
    starts: Any
    index_nz: Any
    values_nz: Any

    @classmethod
    def of(cls, f: MilpArrays) -> Arrays:
        import numpy as np

        def floats(values: list[float]) -> Any:
            return np.asarray(values, dtype=float)

        return cls(floats(f.cost), floats(f.col_lo), floats(f.col_hi), np.asarray(f.integer, dtype=bool),
                   floats(f.row_lo), floats(f.row_hi), np.asarray(f.starts, dtype=np.int32),
                   np.asarray(f.index_nz, dtype=np.int32), floats(f.values_nz))


def isolates() -> bool:
    """Whether solves can run in a worker here: the pipes it is given (``pass_fds``) and read
    (``Connection`` over file descriptors) are POSIX's."""
    return os.name == "posix"


class MilpWorker:
    """Solves MILPs with a backend (``backends.solve_highspy`` or ``solve_scipy``): small ones
    in this process, big ones in a worker process killed past its limit (module docstring).

    Use it as a context manager around a loop of solves; its worker, when one started, is
    stopped on exit.  The arguments default to ``IN_PROCESS_NONZEROS``, ``GRACE_S`` and
    ``GRACE_SHARE``; ``in_process_nonzeros=0`` sends every program to the worker."""

    def __init__(self, *, in_process_nonzeros: int | None = None, grace_s: float | None = None,
                 grace_share: float | None = None) -> None:
        # ``None``: the module's constants, read here, not bound at import, so a test can move them
        self._in_process_nonzeros = IN_PROCESS_NONZEROS if in_process_nonzeros is None else in_process_nonzeros
        self._grace_s = GRACE_S if grace_s is None else grace_s
        self._grace_share = GRACE_SHARE if grace_share is None else grace_share
        self._child: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self._lifeline = -1
        self._unavailable = False  # a worker failed to start: solve in this process from then on

    def __enter__(self) -> MilpWorker:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        """The worker process's id, or ``None`` while none runs."""
        return None if self._child is None else self._child.pid

    def grace(self, time_limit_s: float) -> float:
        """Seconds past ``time_limit_s`` a worker's solve gets before it is killed."""
        return self._grace_s + self._grace_share * time_limit_s

    def solve(self, backend: Backend, f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
        """``backend(f, time_limit_s, warm)``, or ``TIMED_OUT`` when a worker's solve overran
        its limit by ``grace``; ``("error", None, None, None)`` when the worker died (the next
        big solve starts another).  An exception the backend raised is raised here.  Where no
        worker can run (not POSIX, or one failed to start), every solve runs in this process,
        unguarded, as before the worker existed."""
        if len(f.values_nz) < self._in_process_nonzeros or self._unavailable or not isolates():
            return in_process(backend)(f, time_limit_s, warm)
        pipes = self._started()
        if pipes is None:
            return in_process(backend)(f, time_limit_s, warm)
        try:  # anything raised here (an interrupt, a signal handler) leaves a reply in flight: no later solve
            kind, value = self._exchange(*pipes, (backend, Arrays.of(f), time_limit_s, warm),  # may read it
                                         time.monotonic() + time_limit_s + self.grace(time_limit_s))
        except BaseException:
            self._kill()
            raise
        if kind == "raised":
            raise value
        return cast(Solved, value)

    def _exchange(self, requests: Connection, replies: Connection, request: tuple[Any, ...],
                  deadline: float) -> tuple[str, Any]:
        """Send ``request`` and wait for its reply until ``deadline`` (``time.monotonic``):
        ``("ok", solved)``, ``("raised", exception)``, or ``("ok", TIMED_OUT)`` / ``("ok", error)``
        with the worker killed."""
        try:
            requests.send(request)
        except OSError:  # the worker died while idle (killed from outside): the next solve starts another
            self._kill()
            return "ok", ("error", None, None, None)
        while not replies.poll(min(MAX_WAIT_S, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                self._kill()
                return "ok", TIMED_OUT
        try:
            return cast(tuple[str, Any], replies.recv())
        except (EOFError, OSError):  # the worker died in the solve (a crash in the backend)
            self._kill()
            return "ok", ("error", None, None, None)

    def close(self) -> None:
        """Stop the worker, if one runs: an idle one exits when its requests' pipe closes."""
        child = self._child
        for conn in (self._requests, self._replies):
            if conn is not None:
                conn.close()
        if self._lifeline >= 0:
            os.close(self._lifeline)
        self._child, self._requests, self._replies, self._lifeline = None, None, None, -1
        if child is not None:
            try:
                child.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()

    def _kill(self) -> None:
        """Kill the worker now (it may be stuck in a solve) and forget it."""
        if self._child is not None:
            self._child.kill()
        self.close()

    def _started(self) -> tuple[Connection, Connection] | None:
        """The pipes to a running worker, starting one (and waiting until it is ready) if none
        runs; ``None`` when it cannot start (every later solve then runs in this process)."""
        if self._requests is not None and self._replies is not None:
            return self._requests, self._replies
        theirs_in, ours_out = os.pipe()  # requests
        ours_in, theirs_out = os.pipe()  # replies
        life_in, life_out = os.pipe()  # never written: its end of file is the planner's end
        ends = (theirs_in, theirs_out, life_in)
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", _BOOT, *map(str, ends), *sys.path], pass_fds=ends,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            )
        except (OSError, ValueError):  # no interpreter to run (a frozen planner): nothing to wait for
            for end in (ours_out, ours_in, life_out):
                os.close(end)
            self._unavailable = True
            return None
        finally:
            for end in ends:
                os.close(end)
        self._requests = Connection(ours_out, readable=False)
        self._replies = Connection(ours_in, writable=False)
        self._lifeline = life_out
        try:
            ready = self._replies.poll(START_TIMEOUT_S) and self._replies.recv() == "ready"
        except (EOFError, OSError):  # it ended before it was ready (its error is on stderr)
            ready = False
        if not ready:
            self._kill()
            self._unavailable = True
            return None
        return self._requests, self._replies


def serve(requests_fd: int, replies_fd: int, lifeline_fd: int) -> None:
    """The worker's body: answer ``(backend, arrays, limit, warm)`` requests with
    ``("ok", solved)`` or ``("raised", exception)`` until the requests' pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the planner stops it: by its pipes, its lifeline or a kill
    threading.Thread(target=_exit_with, args=(lifeline_fd,), daemon=True).start()
    requests = Connection(requests_fd, writable=False)
    replies = Connection(replies_fd, readable=False)
    try:
        import highspy  # noqa: F401 - paid before "ready", not inside a solve's limit
    except ImportError:
        pass
    replies.send("ready")
    while True:
        try:
            backend, arrays, limit, warm = requests.recv()
        except Exception:  # noqa: BLE001 - closed (EOFError), or a request it cannot read: the planner sees EOF
            return
        try:
            reply: tuple[str, object] = ("ok", backend(arrays, limit, warm))
        except Exception as exc:  # noqa: BLE001 - raised again in the planner
            reply = ("raised", exc)
        try:
            replies.send(reply)
        except OSError:  # the planner closed the worker as the solve ended
            return


def _exit_with(lifeline_fd: int) -> None:
    """Exit this process once ``lifeline_fd`` reads end of file: the planner closed it or
    died, maybe while this process is stuck in a presolve that nothing else would stop."""
    while os.read(lifeline_fd, 1):
        pass
    os._exit(1)

"""MILP solves that cannot hang the planner: a big program is solved in a child process,
killed when it overruns its time limit.

HiGHS 1.16's MIP presolve rule 13 ("parallel rows and columns") ignores ``time_limit``: a
neighbourhood sub-MILP of ``cutwindow`` on RL1000 at 0.8 (214k nonzeros) stayed in presolve
for over 400 s under a 5 s limit, and ``Highs.cancelSolve`` from another thread does not stop
it (docs/benchmarks.md).  Only a process can be stopped there, so ``MilpWorker.solve`` sends a
program of ``IN_PROCESS_NONZEROS`` or more to a worker process and kills it when no answer
comes ``grace`` seconds past the limit: the solve is then ``TIMED_OUT`` (no values), which
every caller reads as "nothing better found".  The next big solve starts a new worker.

Why a persistent worker held by a context manager: the LNS loops solve dozens of 0.1-5 s
sub-MILPs a minute, and a process per solve costs 0.18 s to start (``spawn`` and the import
of highspy, 2-core EPYC) where a held worker costs a pickle round trip (about 10 ms for 214k
nonzeros).  The worker starts at the first big solve, so a caller that holds one and solves
only small programs starts none.  Small programs stay in the calling process: the hypothesis
tests solve thousands of them, and the hang needs a big presolve.  ``spawn``, not ``fork``:
the planner has threads (HiGHS's, ``programbuild``'s build thread, Ray's).

The worker writes nothing to the CLI's stdout (its file descriptor 1 goes to ``/dev/null``),
and does not outlive the planner: it is a daemon, stopped when its ``MilpWorker`` closes,
and a thread in it exits the process when the parent dies (even mid-presolve)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import TracebackType

from mpplan.passes.remat.backends import Backend, MilpArrays, Solved

__all__ = ["GRACE_S", "GRACE_SHARE", "IN_PROCESS_NONZEROS", "TIMED_OUT", "MilpWorker"]

#: Programs with fewer nonzeros are solved in the calling process (module docstring).
IN_PROCESS_NONZEROS = 20_000

#: A worker's solve is killed ``GRACE_S + GRACE_SHARE * limit`` seconds past its limit:
#: HiGHS stops checking its clock for a while (and the program's transfer and load count
#: here, not in HiGHS's limit); measured past a 0.2-3 s limit on a 214k-nonzero program:
#: 0.04-0.27 s.
GRACE_S = 1.0
GRACE_SHARE = 0.1

#: The answer of a solve killed past its limit: no values, no bound.
TIMED_OUT: Solved = ("time_limit", None, None, None)

#: How long a worker may take to start (spawn, imports) before it is given up.
START_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Arrays:
    """A picklable copy of a ``MilpArrays``' fields: the program objects carry their model too."""

    cost: list[float]
    col_lo: list[float]
    col_hi: list[float]
    integer: list[bool]
    row_lo: list[float]
    row_hi: list[float]
    starts: list[int]
    index_nz: list[int]
    values_nz: list[float]

    @classmethod
    def of(cls, f: MilpArrays) -> Arrays:
        return cls(list(f.cost), list(f.col_lo), list(f.col_hi), list(f.integer), list(f.row_lo), list(f.row_hi),
                   list(f.starts), list(f.index_nz), list(f.values_nz))


class MilpWorker:
    """Solves MILPs with a backend (``backends.solve_highspy`` or ``solve_scipy``): small ones
    in this process, big ones in a worker process killed past its limit (module docstring).

    Use it as a context manager around a loop of solves; its worker, when one started, is
    stopped on exit.  ``in_process_nonzeros=0`` sends every program to the worker."""

    def __init__(self, *, in_process_nonzeros: int = IN_PROCESS_NONZEROS, grace_s: float = GRACE_S,
                 grace_share: float = GRACE_SHARE) -> None:
        self._in_process_nonzeros = in_process_nonzeros
        self._grace_s = grace_s
        self._grace_share = grace_share
        self._child: BaseProcess | None = None
        self._conn: Connection | None = None

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
        its limit by ``grace``; ``("error", None, None, None)`` when the worker died.  An
        exception the backend raised is raised here."""
        if len(f.values_nz) < self._in_process_nonzeros or multiprocessing.current_process().daemon:
            return backend(f, time_limit_s, warm)  # a daemonic process may not start children
        conn = self._started()
        conn.send((backend, Arrays.of(f), time_limit_s, warm))
        if not conn.poll(time_limit_s + self.grace(time_limit_s)):
            self._kill()
            return TIMED_OUT
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):  # the worker died in the solve (a crash in the backend)
            self._kill()
            return "error", None, None, None
        if kind == "raised":
            raise value
        solved: Solved = value
        return solved

    def close(self) -> None:
        """Stop the worker, if one runs: an idle one exits when its pipe closes."""
        child, conn = self._child, self._conn
        self._child = self._conn = None
        if conn is not None:
            conn.close()
        if child is not None:
            child.join(timeout=5.0)
            if child.is_alive():
                child.kill()
                child.join()

    def _kill(self) -> None:
        """Kill the worker now (it may be stuck in a solve) and forget it."""
        if self._child is not None:
            self._child.kill()
        self.close()

    def _started(self) -> Connection:
        """The pipe to a running worker, starting one (and waiting until it is ready) if none runs."""
        if self._conn is not None:
            return self._conn
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        child = context.Process(target=_serve, args=(theirs,), name="mpplan-milp-worker", daemon=True)
        child.start()
        theirs.close()
        self._child, self._conn = child, ours
        try:
            ready = ours.poll(START_TIMEOUT_S) and ours.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._kill()
            raise RuntimeError(f"the MILP worker process did not start within {START_TIMEOUT_S:g} s")
        return ours


def _serve(conn: Connection) -> None:
    """The worker's body: answer ``(backend, arrays, limit, warm)`` requests with
    ``("ok", solved)`` or ``("raised", exception)`` until the pipe closes."""
    with open(os.devnull, "w") as devnull:  # HiGHS writes to fd 1, past sys.stdout: keep it off the CLI's output
        os.dup2(devnull.fileno(), 1)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()
    try:
        import highspy  # noqa: F401 - paid before "ready", not inside a solve's limit
    except ImportError:
        pass
    conn.send("ready")
    while True:
        try:
            backend, arrays, limit, warm = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[str, object] = ("ok", backend(arrays, limit, warm))
        except Exception as exc:  # noqa: BLE001 - raised again in the parent
            reply = ("raised", exc)
        conn.send(reply)


def _exit_with(sentinel: int) -> None:
    """Exit this process once ``sentinel`` (the parent's) is ready: the parent died, maybe
    while this process is stuck in a presolve that nothing else would stop."""
    wait([sentinel])
    os._exit(1)

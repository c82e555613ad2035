"""``mpplan.milp.worker``: a big program's solve runs in a worker process that is killed past its
time limit plus the grace (HiGHS 1.16's presolve rule 13 ignores ``time_limit``), answering
``time_limit`` with no values and leaving no process behind.  A hung HiGHS is stood in for
by a backend that sleeps, besides the real hanging program (``tests/data/highs_presolve_hang``);
these functions are module-level so the worker can unpickle them.  Each test runs under a
watchdog: a kill that regressed ends the run with tracebacks instead of hanging it."""

from __future__ import annotations

import faulthandler
import gzip
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.milp import worker as worker_module
from mpplan.milp.backends import PARALLEL_ROWS_AND_COLUMNS, MilpArrays, Solved, in_process, solve_highspy
from mpplan.milp.worker import TIMED_OUT, MilpWorker
from mpplan.passes.remat import build_model, ilp
from mpplan.passes.remat.cutlns import effective_choice
from mpplan.passes.remat.cutmilp import cut_options
from mpplan.passes.remat.cutwindow import lns_local
from mpplan.passes.remat.sparse import SparseMilp

pytest.importorskip("highspy")

#: A stand-in for the hung presolve: far past any limit used here.
HANG_S = 120.0


def hung(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    """A backend that ignores its time limit, as HiGHS's presolve rule 13 does."""
    time.sleep(HANG_S)
    return "optimal", [0.0] * len(f.cost), 0.0, 0.0


def failing(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    raise ValueError("the backend failed")


def crashing(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    """A backend whose process dies (as a segfault in HiGHS would end it)."""
    os._exit(3)


def loud(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    """A backend writing a banner to file descriptor 1, as HiGHS's constructor does."""
    os.write(1, b"Running HiGHS (a banner)\n")
    return solve_highspy(f, time_limit_s, warm)


def knapsack() -> SparseMilp:
    """Most value of three items (7, 5, 4) of weights (3, 2, 2) within weight 4: the last two, value 9."""
    milp = SparseMilp()
    for value in (7.0, 5.0, 4.0):
        milp.column(-value, 0.0, 1.0, True)
    milp.row({0: 3.0, 1: 2.0, 2: 2.0}, -math.inf, 4.0)
    return milp


def answer(solved: Solved) -> tuple[str, list[int] | None, float | None]:
    """Status, values rounded to integers, objective."""
    status, x, objective, _ = solved
    return status, None if x is None else [round(v) for v in x], objective


def three_candidates() -> Graph:
    """``tests/test_remat_cutwindow.py``'s three-candidate graph: at budget 90, recomputing
    every candidate fits (cost 4) and the optimum costs 2."""
    tensors = (Tensor("x", 4, Kind.INPUT), Tensor("t0", 1), Tensor("t1", 36), Tensor("t2", 37), Tensor("u2", 1),
               Tensor("t3", 49), Tensor("t4", 1), Tensor("t5", 1), Tensor("out", 1, Kind.OUTPUT))
    io = {"O0": ("x", "t0"), "O1": ("t0", "t1"), "O2": ("x t0", "t2 u2"), "O3": ("x", "t3"), "O4": ("t1 t2", "t4"),
          "O5": ("t4", "t5"), "OUT": ("t4 t5", "out")}
    ops = tuple(Op(name, "f", tuple(ins.split()), tuple(outs.split()), cost=2.0 if name == "O2" else 1.0)
                for name, (ins, outs) in io.items())
    return Graph("dag", tensors, ops, ("out",))


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie no one reaped counts as ended; its state is
    read from /proc where there is one)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return Path("/proc/self").exists()  # it ended in between; without /proc (macOS) os.kill found it
    return state in ("Z", "X")


@pytest.fixture(autouse=True)
def watchdog():
    """Ends the test run, with every thread's traceback, should a test hang past 300 s."""
    faulthandler.dump_traceback_later(300, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def test_a_solve_past_its_limit_is_killed_and_answers_no_values(monkeypatch) -> None:
    monkeypatch.setattr(ilp, "solve_highspy", hung)
    limit, grace = 0.5, 0.5
    with MilpWorker(in_process_nonzeros=0, grace_s=grace, grace_share=0.0) as worker:
        assert answer(worker.solve(solve_highspy, knapsack(), 10.0, None)) == ("optimal", [0, 1, 1], -9.0)
        pid = worker.pid
        assert pid is not None and not gone(pid)
        clock = time.perf_counter()
        assert ilp.solve_arrays(knapsack(), "highs", limit, [0.0, 1.0, 1.0], worker) == TIMED_OUT
        seconds = time.perf_counter() - clock
        assert limit + grace <= seconds < limit + grace + 3.0, seconds
        assert worker.pid is None and gone(pid)
        # the next big solve starts a new worker
        assert worker.solve(solve_highspy, knapsack(), 10.0, None)[0] == "optimal"
        assert worker.pid not in (None, pid)


def presolve_hang() -> SimpleNamespace:
    """``tests/data/highs_presolve_hang.json.gz``: rows of the RL1000 sub-MILP whose HiGHS 1.16
    presolve (rule 13) ignored its time limit, cut down while it still hangs (183 rows, 473
    columns, 1,726 nonzeros; an infinite row bound is ``null``)."""
    with gzip.open(Path(__file__).parent / "data" / "highs_presolve_hang.json.gz", "rt") as text:
        arrays = json.load(text)
    arrays["row_lo"] = [-math.inf if v is None else v for v in arrays["row_lo"]]
    arrays["row_hi"] = [math.inf if v is None else v for v in arrays["row_hi"]]
    return SimpleNamespace(**arrays)


def test_the_real_presolve_hang_answers_by_its_limit_and_grace() -> None:
    """The real thing, sent to a worker with presolve rule 13 on: without the worker this solve
    does not return (still in presolve after 60 s).  Should a later HiGHS solve it in time, any
    answer by the deadline passes."""
    program = presolve_hang()
    limit = 0.5
    worker = MilpWorker(in_process_nonzeros=0)
    clock = time.perf_counter()
    with worker:
        status, x, _, _ = ilp.solve_arrays(program, "highs", limit, None, worker)
        pid = worker.pid
    seconds = time.perf_counter() - clock
    assert seconds < limit + worker.grace(limit) + 4.0, seconds  # and a worker's start
    assert status in ("time_limit", "optimal") and (status == "optimal") == (x is not None)
    assert pid is None or gone(pid)


def test_the_real_presolve_hang_solved_in_process_runs_without_rule_13() -> None:
    """The same program under the in-process size is solved here, with rule 13 off (``in_process``): it
    answers in its limit (0.03 s here) instead of staying in presolve."""
    program = presolve_hang()
    assert len(program.values_nz) < worker_module.IN_PROCESS_NONZEROS
    clock = time.perf_counter()
    with MilpWorker() as worker:
        status, x, _, _ = ilp.solve_arrays(program, "highs", 0.5, None, worker)
        assert worker.pid is None
    assert time.perf_counter() - clock < 0.5 + 2.0
    assert status in ("time_limit", "optimal") and (status == "optimal") == (x is not None)


def test_in_process_switches_off_rule_13_for_highs_only() -> None:
    assert in_process(solve_highspy).keywords == {"rules_off": PARALLEL_ROWS_AND_COLUMNS}  # type: ignore[attr-defined]
    assert in_process(hung) is hung


def test_an_lns_whose_sub_milps_hang_keeps_its_start_and_ends_in_time(monkeypatch) -> None:
    """``cutwindow``'s LNS with every solve sent to a worker and hanging there: each sub-MILP
    is killed past its limit, finds nothing, and the search returns its start (here one
    window holds every candidate: one sub-MILP a pass, the first pass finds nothing)."""
    monkeypatch.setattr(ilp, "solve_highspy", hung)
    monkeypatch.setattr(worker_module, "IN_PROCESS_NONZEROS", 0)
    monkeypatch.setattr(worker_module, "GRACE_S", 0.5)
    graph = three_candidates()
    model = build_model(graph)
    options = cut_options(model)
    assert options is not None
    start = {0: 0, 1: 0, 2: 0}
    clock = time.perf_counter()
    found = lns_local(model, options, start, 90, clock + 60.0, window=3, sub_seconds=0.5)
    seconds = time.perf_counter() - clock
    assert found == effective_choice(model, options, start)
    assert seconds < 0.5 + 0.5 + 0.05 + 4.0, seconds  # limit, grace, 10% of the limit, a start and slack


def test_closing_the_worker_ends_its_process() -> None:
    with MilpWorker(in_process_nonzeros=0) as worker:
        worker.solve(solve_highspy, knapsack(), 10.0, None)
        pid = worker.pid
        assert pid is not None
    assert worker.pid is None and gone(pid)


def test_a_small_program_is_solved_in_process() -> None:
    with MilpWorker() as worker:
        assert answer(worker.solve(solve_highspy, knapsack(), 10.0, None)) == ("optimal", [0, 1, 1], -9.0)
        assert worker.pid is None


@pytest.mark.parametrize("backend", ["highs", "scipy-highs"])
def test_a_program_solved_in_the_worker_gets_the_in_process_answer(backend: str) -> None:
    """Both backends run in the worker (scipy's milp is HiGHS too, with the same presolve)."""
    if backend == "scipy-highs":
        pytest.importorskip("scipy")
    with MilpWorker(in_process_nonzeros=0) as worker:
        assert answer(ilp.solve_arrays(knapsack(), backend, 10.0, None, worker)) == ("optimal", [0, 1, 1], -9.0)
        assert worker.pid is not None


@pytest.mark.parametrize("when", ["idle", "in the solve"])
def test_a_worker_that_dies_answers_error_and_the_next_solve_starts_another(when: str) -> None:
    with MilpWorker(in_process_nonzeros=0) as worker:
        worker.solve(solve_highspy, knapsack(), 10.0, None)
        pid = worker.pid
        assert pid is not None
        if when == "idle":
            os.kill(pid, signal.SIGKILL)
            while not gone(pid):
                time.sleep(0.01)
        assert worker.solve(crashing if when != "idle" else solve_highspy, knapsack(), 10.0, None) == (
            "error", None, None, None)
        assert worker.pid is None and gone(pid)
        assert answer(worker.solve(solve_highspy, knapsack(), 10.0, None)) == ("optimal", [0, 1, 1], -9.0)


def test_the_backends_exception_is_raised_in_the_caller() -> None:
    with MilpWorker(in_process_nonzeros=0) as worker, pytest.raises(ValueError, match="the backend failed"):
        worker.solve(failing, knapsack(), 10.0, None)


def test_the_worker_writes_nothing_to_stdout(capfd) -> None:
    with MilpWorker(in_process_nonzeros=0) as worker:
        assert worker.solve(loud, knapsack(), 10.0, None)[0] == "optimal"
    assert "HiGHS" not in capfd.readouterr().out


def test_the_worker_ends_when_its_parent_dies_mid_solve() -> None:
    """The parent is killed (SIGKILL: no exit handlers run) while its worker hangs."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_milp_worker import hung, knapsack\n"
        "from mpplan.milp.backends import solve_highspy\n"
        "from mpplan.milp.worker import MilpWorker\n"
        "w = MilpWorker(in_process_nonzeros=0)\n"
        "w.solve(solve_highspy, knapsack(), 10.0, None)\n"
        "print(w.pid, flush=True)\n"
        "w.solve(hung, knapsack(), 600.0, None)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        time.sleep(0.5)  # the worker is in the hung solve
        assert not gone(pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    ended = time.perf_counter() + 10.0
    while not gone(pid) and time.perf_counter() < ended:
        time.sleep(0.05)
    try:
        assert gone(pid)
    finally:  # a worker the lifeline failed to end would otherwise sleep out its 120 s
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_the_workers_import_path_is_the_planners(tmp_path, monkeypatch) -> None:
    """The worker starts with ``-c``, which puts its working directory first on its ``sys.path``: an
    ``mpplan`` folder where the user runs from would shadow an installed planner there.  The planner's
    path replaces the worker's own, so both import the same modules."""
    monkeypatch.chdir(tmp_path)
    with MilpWorker(in_process_nonzeros=0) as worker:
        assert worker.solve(import_path, knapsack(), 10.0, None)[3] == sys.path


def import_path(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    """A backend answering with its process's ``sys.path`` in the bound's place."""
    return "optimal", None, None, list(sys.path)  # type: ignore[return-value]


def test_where_no_worker_can_run_the_solve_runs_in_process(monkeypatch) -> None:
    """Not POSIX (no ``pass_fds``), or a worker that cannot start: solved here, unguarded, no pipe left open."""
    monkeypatch.setattr(worker_module, "isolates", lambda: False)
    with MilpWorker(in_process_nonzeros=0) as worker:
        assert answer(worker.solve(solve_highspy, knapsack(), 10.0, None)) == ("optimal", [0, 1, 1], -9.0)
        assert worker.pid is None
    monkeypatch.undo()
    fds = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").exists() else None
    monkeypatch.setattr(sys, "executable", str(Path("/nonexistent") / "python"))
    with MilpWorker(in_process_nonzeros=0) as worker:
        for _ in range(3):  # one failed start, then straight to the in-process solve
            assert answer(worker.solve(solve_highspy, knapsack(), 10.0, None)) == ("optimal", [0, 1, 1], -9.0)
        assert worker.pid is None
    assert fds is None or len(os.listdir("/proc/self/fd")) == fds


def test_a_limit_past_the_pipes_longest_wait_is_waited_in_steps(monkeypatch) -> None:
    """``Connection.poll`` overflows past about 2e6 s, a limit the config allows."""
    with MilpWorker(in_process_nonzeros=0) as worker:
        assert answer(worker.solve(solve_highspy, knapsack(), 1e7, None)) == ("optimal", [0, 1, 1], -9.0)
    monkeypatch.setattr(worker_module, "MAX_WAIT_S", 0.05)  # the steps themselves: a hang still ends at its limit
    monkeypatch.setattr(ilp, "solve_highspy", hung)
    with MilpWorker(in_process_nonzeros=0, grace_s=0.5, grace_share=0.0) as worker:
        clock = time.perf_counter()
        assert ilp.solve_arrays(knapsack(), "highs", 0.5, None, worker) == TIMED_OUT
        assert time.perf_counter() - clock < 0.5 + 0.5 + 4.0


class Interrupted(Exception):
    pass


def test_a_solve_interrupted_in_the_caller_leaves_no_reply_for_the_next(monkeypatch) -> None:
    """An exception raised while a solve waits (here a signal handler's) kills the worker: its
    late reply must not answer the next solve."""
    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    monkeypatch.setattr(ilp, "solve_highspy", slow_knapsack_answer)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        with MilpWorker(in_process_nonzeros=0) as worker:
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(Interrupted):
                worker.solve(slow_knapsack_answer, knapsack(), 10.0, None)
            assert worker.pid is None
            two = SparseMilp()
            for value in (1.0, 2.0):
                two.column(-value, 0.0, 1.0, True)
            assert answer(worker.solve(solve_highspy, two, 10.0, None)) == ("optimal", [1, 1], -3.0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def slow_knapsack_answer(f: MilpArrays, time_limit_s: float, warm: list[float] | None) -> Solved:
    """The knapsack's answer, a second late."""
    time.sleep(1.0)
    return "optimal", [0.0, 1.0, 1.0], -9.0, -9.0

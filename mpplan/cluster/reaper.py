"""The embedded Ray cluster dies with its driver, even a driver killed with ``SIGKILL``.

``ray.init()`` starts GCS, a raylet, agents and workers as children of the driver.
When the driver exits normally ``ray.shutdown()`` stops them; when it is killed
outright nothing runs in it, and Ray's agents outlive it by a minute or more.
``Reaper`` closes that gap with a watchdog process, in a session of its own so a
signal to the driver's process group does not reach it:

* the driver holds the write end of the watchdog's stdin; the kernel closes it when
  the driver dies, however it dies, and the watchdog reads end-of-file;
* while waiting, the watchdog records every process descended from the driver that
  was not there before Ray started and is Ray's (GCS, raylet, ``ray::`` workers and
  agents, Python running Ray's modules, and their children), by pid and start time
  so a recycled pid is never mistaken for one of them, every ``POLL_S`` seconds;
* at end-of-file it kills what it recorded, and anything those started since, at
  once if the driver died, or after ``GRACE_S`` seconds if the driver said ``done``
  after ``ray.shutdown()``.

Linux only (it reads ``/proc``); elsewhere ``Reaper.start`` returns None.  Run as
``python -I .../mpplan/cluster/reaper.py DRIVER_PID [EXCLUDED_PID ...]``: by path, in isolated
mode, so the watchdog imports the standard library alone.  ``python -m mpplan.cluster.reaper``
would import the ``mpplan.cluster`` package first (Ray with it), which imports this module, and
runpy then warns on the driver's stderr that the module was imported before it ran.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

POLL_S = 0.5
GRACE_S = 2.0

_Proc = tuple[int, int]
"""(pid, start time in clock ticks since boot): a process, immune to pid reuse."""


@dataclass
class Reaper:
    """The driver's handle on its watchdog; ``close()`` after ``ray.shutdown()``."""

    process: subprocess.Popen[bytes]

    @classmethod
    def start(cls) -> Reaper | None:
        """Start the watchdog for this process, before Ray starts; None where ``/proc`` is missing."""
        if not os.path.isdir("/proc/self"):
            return None
        me = os.getpid()
        before = [str(pid) for pid, _ in _descendants(me, _table())]  # not Ray's: never reaped
        process = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), str(me), *before],  # module docstring: why
            stdin=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        return cls(process)

    def close(self) -> None:
        """Tell the watchdog the driver shut Ray down; it reaps what is left after the grace period."""
        stdin: IO[bytes] | None = self.process.stdin
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(b"done\n")
            stdin.close()
        except OSError:  # the watchdog is gone already
            pass


def watch(driver: int, excluded: set[int], stdin: IO[bytes]) -> None:
    """The watchdog's loop: record the driver's new descendants until end-of-file, then reap them."""
    seen: set[_Proc] = set()
    others: set[_Proc] = set()  # the driver's other children (a user's subprocess): never reaped
    received = b""
    fd = stdin.fileno()
    while True:
        table = _table()
        for proc in _descendants(driver, table, skip=excluded | {os.getpid()}):
            if proc in seen or proc in others:
                continue
            ours = _is_ray(proc[0]) or any(pid == table[proc] for pid, _ in seen)
            (seen if ours else others).add(proc)
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            chunk = os.read(fd, 64)
            if not chunk:
                break
            received += chunk
    if received.startswith(b"done"):
        time.sleep(GRACE_S)
    _reap(seen)


def _reap(seen: set[_Proc]) -> None:
    """SIGKILL every recorded process still alive, and their descendants, until none is left."""
    for _ in range(50):
        table = _table()
        alive = {p for p in seen if p in table}
        targets = set(alive)
        for pid, _ in alive:
            targets.update(_descendants(pid, table))
        if not targets:
            return
        for pid, _ in targets:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        seen |= targets
        time.sleep(0.1)


def _is_ray(pid: int) -> bool:
    """A process of Ray's own: GCS, raylet, a ``ray::`` worker or agent, or Python running Ray's modules."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return False
    return any(
        a.startswith("ray::") or os.path.basename(a) in ("gcs_server", "raylet") or f"{os.sep}ray{os.sep}" in a
        for a in args
    )


def _table() -> dict[_Proc, int]:
    """Every process on the machine: (pid, start time) -> parent pid."""
    table: dict[_Proc, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read().decode("ascii", "replace")
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
        table[(int(name), int(fields[19]))] = int(fields[1])
    return table


def _descendants(root: int, table: dict[_Proc, int], skip: frozenset[int] | set[int] = frozenset()) -> list[_Proc]:
    """The processes below ``root``, not entering those in ``skip`` (nor listing them)."""
    children: dict[int, list[_Proc]] = {}
    for proc, parent in table.items():
        children.setdefault(parent, []).append(proc)
    found: list[_Proc] = []
    stack = [root]
    while stack:
        for proc in children.get(stack.pop(), []):
            if proc[0] in skip:
                continue
            found.append(proc)
            stack.append(proc[0])
    return found


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the driver; the watchdog waits for it
    watch(int(sys.argv[1]), {int(a) for a in sys.argv[2:]}, sys.stdin.buffer)

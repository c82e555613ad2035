"""The benchmark suite: regenerate the whole of docs/benchmarks.md in one run.

Rerun: ``python scripts/bench.py`` (the full suite: hours on a 2-core CPU), ``--quick``
(smaller sizes), or ``--only NAME ...``.  Each section is also a script of its own
(``scripts/bench_<section>.py``) that rewrites only its section:

1. ``peak``: eager PyTorch, memonger-style sharing, greedy by size and mpplan auto;
2. ``placement``: accelerate's ``infer_auto_device_map`` against mpplan's placement;
3. ``planner``: schedules, assigners and planning time against graph size (1k..100k ops);
4. ``search``: speed-up of the measured phase with 1 and 2 Ray evaluator actors;
5. ``remat``: memory against overhead on the Checkmate graphs, and executed remat plans;
6. ``cli``: ``mpplan plan`` of a 100k-op graph file end to end, stage by stage;
7. ``verify``: seconds to verify a plan against graph size (1k..100k ops);
8. ``remat_peers``: ``mpplan.apply`` against HF gradient checkpointing and torch.compile
   (the compile rows only from ``bench_remat_peers.py --compile``: minutes of compilation);
9. ``remat_device``: remat against Moccasin's and Checkmate's tables, fixed order and mpplan's own
   (the scaling run to 15k ops with ``--quick``, 100k without);
10. ``gpu``: plans executed, predicted against measured and eager (a virtual device without CUDA).

A section that fails is written as its error and the suite goes on (exit status 1).
"""

from __future__ import annotations

import argparse
import datetime
import traceback
from typing import Callable

import bench_cli
import bench_gpu
import bench_peak
import bench_placement
import bench_planner
import bench_remat
import bench_remat_device
import bench_remat_peers
import bench_search
import bench_verify
import torch
from benchlib import BENCHMARKS, REPO, commit, load_average, log, machine, timer, versions, write_layout, write_section

SECTIONS: dict[str, Callable[[bool], str]] = {
    "peak": bench_peak.section,
    "placement": bench_placement.section,
    "planner": bench_planner.section,
    "search": bench_search.section,
    "remat": bench_remat.section,
    "cli": bench_cli.section,
    "verify": bench_verify.section,
    "remat_peers": lambda quick: bench_remat_peers.build(quick, None, torch.device("cpu"), (2, 256)),
    "remat_device": lambda quick: bench_remat_device.section(quick, 15_000 if quick else 100_000),
    "gpu": bench_gpu.build,
}


def header(quick: bool, seconds: dict[str, float], loads: tuple[float, float]) -> str:
    """The machine, the software and how this run went, for the top of the document."""
    kind = "quick run (`python scripts/bench.py --quick`)" if quick else "full run (`python scripts/bench.py`)"
    timings = ", ".join(f"{name} {s / 60:.1f}" for name, s in seconds.items())
    return "\n".join(
        [
            f"- Machine: {machine()}.",
            f"- Software: {versions()}.",
            f"- Run: {datetime.date.today().isoformat()}, commit {commit()}, {kind}: "
            f"{sum(seconds.values()) / 60:.1f} minutes ({timings}).",
            f"- 1-minute load average {loads[0]:.1f} at the start and {loads[1]:.1f} at the end: timings are "
            "only as quiet as the machine was.  Torch runs one intra-op thread where steps are timed or "
            "eager is measured (on this 2-core VM two threads made step times swing by 5x between runs).",
        ]
    )


def run_section(name: str, quick: bool) -> tuple[float, bool]:
    """Run one section and write it (or its error); (seconds, succeeded)."""
    log(f"== {name}")
    ok = True
    with timer() as t:
        try:
            body = SECTIONS[name](quick)
        except Exception:  # noqa: BLE001 - one broken section must not cost the others' numbers
            ok = False
            body = f"## {name}: failed\n\n```\n{traceback.format_exc()}```"
            log(traceback.format_exc())
    write_section(name, body)
    log(f"== {name}: {t[0]:.0f}s")
    return t[0], ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    args = parser.parse_args()
    write_layout(["machine", *SECTIONS])
    start_load = load_average()
    seconds, failed = {}, []
    for name in args.only or SECTIONS:
        seconds[name], ok = run_section(name, args.quick)
        if not ok:
            failed.append(name)
    write_section("machine", header(args.quick, seconds, (start_load, load_average())))
    log(f"wrote {BENCHMARKS.relative_to(REPO)} in {sum(seconds.values()) / 60:.1f} min"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Moccasin's protocol on its random layered graphs, fixed given order: the remat pass alone.

Budget = 0.9 and 0.8 of ``static + LOAD`` of the graph's given order; overhead = recomputed
op cost / the graph's total op cost (Moccasin, ICML 2023: 0.9, 4.9% on RL250; 0.7, 3.4% on
RL1000).  Prints one line per graph and budget: overhead, peak / no-remat peak, what decided
(``+cuts``: late regions start at cut points the solver chose, ``+rounds``: a second round),
seconds, recomputes, and how many records state a cut (``from_op``).

Rerun: ``python scripts/bench_remat_moccasin.py [--sizes 250,1000] [--time-limit 60]``.
"""

from __future__ import annotations

import argparse
import time

from benchlib import SHARED_DATA

from mpplan.capture.graph_file import load_graph
from mpplan.errors import InfeasibleError
from mpplan.passes.remat import remat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1000", help="comma-separated graph sizes (random_layered_n<size>)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per budget (soft)")
    args = parser.parse_args()
    for size in args.sizes.split(","):
        (path,) = SHARED_DATA.glob(f"random_layered_n{size}_*.json")
        graph = load_graph(path)
        for fraction in (0.9, 0.8):
            clock = time.perf_counter()
            try:
                r = remat(graph, "budget", budget=fraction, solver="auto", time_limit_s=args.time_limit)
            except InfeasibleError as exc:
                print(f"RL{size} {fraction}: refused after {time.perf_counter() - clock:.1f}s: {exc}", flush=True)
                continue
            print(f"RL{size} {fraction}: {100 * r.compute_overhead:.2f}% peak "
                  f"{r.peak_bytes / r.baseline_peak_bytes:.3f} {r.solver} {time.perf_counter() - clock:.1f}s "
                  f"recomputes {len(r.recompute_ops)} cuts {len(r.from_ops)}", flush=True)


if __name__ == "__main__":
    main()

"""Issue 16's monotone budget on a real graph: budgets swept near the least peak, each planned
alone with ``solver: auto``; no budget may be refused above one that fits.

The test suite checks the property on many small graphs (``tests/test_remat_budget.py``,
hypothesis), where every MILP closes; here the MILPs stop at their time limits, which is
where a refusal used to name the greedy's least peak while a smaller budget planned.
Prints one line per budget (bytes, overhead or the refusal's smallest budget) and whether
the sweep is monotone; exits 1 when it is not.

Rerun: ``python scripts/bench_remat_monotone.py [--graph random_layered_n250]
[--fractions 0.770,0.7721,0.773,0.775,0.78,0.785,0.79,0.8] [--time-limit 60]``.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchlib import SHARED_DATA

from mpplan.capture.graph_file import load_graph
from mpplan.passes.remat import RematInfeasibleError, remat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="random_layered_n250", help="a graph of ../shared/data/checkmate_graphs")
    parser.add_argument("--fractions", default="0.770,0.7721,0.773,0.775,0.78,0.785,0.79,0.8",
                        help="comma-separated budgets (fractions of the no-remat peak of the given order)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per budget")
    args = parser.parse_args()
    (path,) = SHARED_DATA.glob(f"{args.graph}_*.json")
    graph = load_graph(path)
    outcomes: list[tuple[float, bool]] = []
    for fraction in sorted(map(float, args.fractions.split(","))):
        clock = time.perf_counter()
        try:
            r = remat(graph, "budget", budget=fraction, solver="auto", time_limit_s=args.time_limit)
        except RematInfeasibleError as exc:
            print(f"{fraction}: refused ({time.perf_counter() - clock:.0f}s): {exc}", flush=True)
            outcomes.append((fraction, False))
            continue
        print(f"{fraction}: {r.budget_bytes} bytes fit, {100 * r.compute_overhead:.3f}% peak {r.peak_bytes} "
              f"{r.solver} ({time.perf_counter() - clock:.0f}s)", flush=True)
        outcomes.append((fraction, True))
    least_fit = min((fraction for fraction, fits in outcomes if fits), default=None)
    broken = [f for f, fits in outcomes if not fits and least_fit is not None and f > least_fit]
    print("monotone" if not broken else f"NOT monotone: refused {broken} above {least_fit}, which fits")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()

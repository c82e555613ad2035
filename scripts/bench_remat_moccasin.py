"""Moccasin's protocol on its random layered graphs, fixed given order: the remat pass alone.

Budget = 0.9 and 0.8 of ``static + LOAD`` of the graph's given order; overhead = recomputed
op cost / the graph's total op cost (Moccasin, ICML 2023: 0.9, 4.9% on RL250; 0.7, 3.4% on
RL1000).  Prints one line per graph and budget: overhead, peak / no-remat peak, what decided
(``+cuts``: late regions start at cut points the solver chose, ``+rounds``: a second round,
``+search``: the local search on cut points, ``mpplan.passes.remat.cutsearch``),
seconds, recomputes, and how many records state a cut (``from_op``).

``--milp SECONDS`` then solves the cut-choosing MILP (``mpplan.passes.remat.cutexact``: one
recompute per tensor, each cut at any gap), started from that answer when it is one round, and
prints its best overhead and the overhead it proves no choice of that model goes under.

Rerun: ``python scripts/bench_remat_moccasin.py [--sizes 250,1000] [--time-limit 60] [--milp 60]``.
"""

from __future__ import annotations

import argparse
import time

from benchlib import SHARED_DATA

from mpplan.capture.graph_file import load_graph
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat import build_model, remat
from mpplan.passes.remat.api import RematResult
from mpplan.passes.remat.cutexact import option_of, solve_cuts
from mpplan.passes.remat.model import SUFFIX
from mpplan.passes.remat.rewriting import repeated_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1000", help="comma-separated graph sizes (random_layered_n<size>)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per budget (soft)")
    parser.add_argument("--milp", type=float, default=0.0, help="seconds for the cut MILP after each cell (0: none)")
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
            if args.milp > 0:
                print(f"  cut MILP: {milp_line(graph, r, args.milp)}", flush=True)


def milp_line(graph: Graph, r: RematResult, seconds: float) -> str:
    """The cut MILP's best overhead and proved lower bound for ``r``'s budget, warm-started
    from ``r`` when it is one round."""
    clock = time.perf_counter()
    if r.budget_bytes is None:
        return "no budget"
    model = build_model(graph)
    names = [repeated_op(op) for op in r.recompute_ops]
    warm = None if any(SUFFIX in n for n in names) else option_of(model, names, r.from_ops)
    found = solve_cuts(model, r.budget_bytes - model.static_bytes, seconds, warm=warm)
    if found is None:
        return f"no answer (outside the model, too large, or none in time) {time.perf_counter() - clock:.1f}s"
    total = sum(op.cost for op in graph.ops)
    best = sum(model.cand_cost[i] for i in found.chosen)
    bound = "-" if found.bound is None else f"{100 * found.bound / total:.2f}%"
    return (f"{100 * best / total:.2f}% {found.status}, proved >= {bound}, warm {warm is not None}, "
            f"{time.perf_counter() - clock:.1f}s")


if __name__ == "__main__":
    main()

"""The arena after recomputes, cheaply: each offset assigner on one rewrite, without rerunning the remat search.

Rerun: ``PYTHONPATH=. python scripts/probe_remat_arena.py random_layered_n1000 0.776 --save /tmp/rl1000.json``
(the recomputes decided at a LOAD aim of 0.776 of the no-remat peak, in the graph's auto
order, ``--time-limit`` seconds, saved as live-range records), then
``PYTHONPATH=. python scripts/probe_remat_arena.py --records /tmp/rl1000.json`` to measure the assigners
again in seconds.  Each line: an order of the rewrite (``decided``: the order the
recomputes were decided in; ``auto``: the planner's schedule of the rewrite, the one
``fit_planned`` plans), its LOAD at the alignment, and per assigner the arena over that
LOAD and the seconds.  ``fits`` compares the ``auto`` arena with the budget ``--budget``
(a fraction of the no-remat peak), what the planned peak needs (no static bytes on the
random layered graphs).  ``--band B ...`` then asks, per order and per ``B`` bytes, whether
the records of ``auto``'s packing that end above ``budget - B`` can be re-packed under the
budget with every other record held (``mpplan.passes.assign.window``, an exact MILP:
``packed``, ``infeasible`` (proved) or ``time_limit`` after ``--band-limit`` seconds).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchlib import SHARED_DATA, log

from mpplan import sim
from mpplan.capture.graph_file import load_graph
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.liveness import live_ranges
from mpplan.passes.assign import OffsetAlgorithm, assign_offsets
from mpplan.passes.assign.records import normalise
from mpplan.passes.assign.window import repack_under
from mpplan.passes.remat import remat
from mpplan.passes.remat.fit import in_order
from mpplan.passes.schedule import schedule

ALIGNMENT = 64
#: ``search`` is ``auto`` that never stops early: the same arena here, twice the time.
ALGORITHMS: tuple[OffsetAlgorithm, ...] = ("auto", "greedy_by_size", "best_fit")


def records(graph: Graph, order: range | list[int]) -> list[list[int]]:
    return [[r.nbytes, r.first, r.last] for r in live_ranges(graph, order).ranges]


def rewrite(name: str, aim: float, time_limit: float) -> dict[str, object]:
    """The recomputes decided at ``aim`` in the graph's auto order, as records in two orders."""
    graph = load_graph(sorted(SHARED_DATA.glob(f"{name}_*.json"))[0])
    peak = sim.given_peak(graph)
    ordered = in_order(graph, [graph.ops[i].name for i in schedule(graph, "auto")])
    clock = time.perf_counter()
    try:
        decided = remat(ordered, "budget", budget=int(aim * peak), time_limit_s=time_limit)
    except InfeasibleError as exc:
        decided = exc.best  # type: ignore[attr-defined]
    log(f"remat: LOAD {decided.peak_bytes / peak:.4f} of the peak in {time.perf_counter() - clock:.1f} s")
    rewritten = decided.graph
    return {"peak": peak, "decided": records(rewritten, range(len(rewritten.ops))),
            "auto": records(rewritten, list(schedule(rewritten, "auto")))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("graph", nargs="?", help="a Checkmate graph by prefix, e.g. random_layered_n1000")
    parser.add_argument("aim", nargs="?", type=float, help="LOAD aim, a fraction of the no-remat peak")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds of the remat search")
    parser.add_argument("--save", type=Path, help="write the records here")
    parser.add_argument("--records", type=Path, help="measure saved records instead of running remat")
    parser.add_argument("--budget", type=float, default=0.8, help="the budget, a fraction of the no-remat peak")
    parser.add_argument("--band", type=int, nargs="*", default=[], help="bytes under the budget to re-pack exactly")
    parser.add_argument("--band-limit", type=float, default=60.0, help="seconds per exact re-pack")
    args = parser.parse_args()
    if args.records:
        found = json.loads(args.records.read_text())
    elif args.graph and args.aim:
        found = rewrite(args.graph, args.aim, args.time_limit)
        if args.save:
            args.save.write_text(json.dumps(found))
    else:
        parser.error("expected a graph and an aim, or --records")
    for order in ("decided", "auto"):
        cells = []
        for algorithm in ALGORITHMS:
            clock = time.perf_counter()
            result = assign_offsets([tuple(r) for r in found[order]], alignment=ALIGNMENT, algorithm=algorithm)
            cells.append(f"{algorithm} {result.arena / result.load:.4f} ({time.perf_counter() - clock:.1f} s)")
            if algorithm == "auto":
                fits = result.arena <= args.budget * found["peak"]
                cells.append(f"arena {result.arena}, fits {args.budget}: {fits}")
        print(f"{order}: LOAD {result.load}; " + "; ".join(cells), flush=True)
        for band in args.band:
            line = band_line(found[order], int(args.budget * found["peak"]), band, args.band_limit)
            print(f"  {order}: {line}", flush=True)


def band_line(rows: list[list[int]], budget: int, band: int, seconds: float) -> str:
    """Re-pack the records of ``auto``'s packing ending above ``budget - band`` under the budget."""
    records = [(r[0], r[1], r[2]) for r in rows]
    offsets = assign_offsets(records, alignment=ALIGNMENT).offsets
    sizes, first, last = normalise(records, ALIGNMENT)
    cap = budget // ALIGNMENT * ALIGNMENT
    free = [j for j, (o, s) in enumerate(zip(offsets, sizes)) if s and o + s > cap - band]
    clock = time.perf_counter()
    found = repack_under(sizes, first, last, offsets, free, cap, seconds)
    return f"band {band}: {len(free)} records free, {found.status} ({time.perf_counter() - clock:.1f} s)"


if __name__ == "__main__":
    main()

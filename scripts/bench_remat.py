"""Remat benchmark: budgets on the Checkmate graphs, the rules (mirror, sqrt), and sqrt(n) on chains.

Rerun: ``python scripts/bench_remat.py`` (``--time-limit S`` caps each exact solve,
default 60 s; ``--quick`` skips the 500- and 1000-op random graphs).  Writes the
``remat`` section of docs/benchmarks.md.

Budgets are fractions of the no-remat peak (``static + LOAD`` of the graph's
node-id order); every peak is that of the rewritten graph's own as-given order
(recomputes right before their first late reader), by ``mpplan.sim``.
"""

from __future__ import annotations

import argparse
import math
import time

from benchlib import SHARED_DATA, log, machine, table, write_section

from mpplan import sim
from mpplan.capture.graph_file import load_graph
from mpplan.capture.synthetic import chain
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes import remat_ilp
from mpplan.passes.remat import RematResult, build_model, remat

BUDGETS = (0.9, 0.8)
GRAPH_SECONDS = 180.0


def graphs(quick: bool) -> list[tuple[str, Graph]]:
    found = []
    for path in sorted(SHARED_DATA.glob("*_train_nx.json")):
        found.append((path.stem.removesuffix("_nx"), load_graph(path)))
    for path in sorted(SHARED_DATA.glob("random_layered_*.json"), key=lambda p: len(load_graph(p).ops)):
        graph = load_graph(path)
        if quick and len(graph.ops) > 250:
            continue
        found.append((path.stem.split("_w")[0], graph))
    return found


def budget_cell(graph: Graph, fraction: float, solver: str, time_limit: float) -> tuple[list[str], float]:
    """Peak / baseline, overhead, seconds (and gap for exact) of one budget run."""
    clock = time.perf_counter()
    try:
        r = remat(graph, "budget", budget=fraction, solver=solver, time_limit_s=time_limit)
    except InfeasibleError as exc:
        seconds = time.perf_counter() - clock
        baseline = sim.static_bytes(graph) + sim.order_load(graph, range(len(graph.ops)))
        smallest = int(fraction * baseline) + exc.missing_bytes
        proved = "smallest feasible budget is" in str(exc)
        cells = [f"infeasible: min {'=' if proved else '<='} {smallest / baseline:.3f}", "-", f"{seconds:.1f}"]
        return cells + (["-"] if solver == "exact" else []), seconds
    seconds = time.perf_counter() - clock
    assert r.budget_bytes is not None and r.peak_bytes <= r.budget_bytes
    cells = [f"{r.peak_bytes / r.baseline_peak_bytes:.3f}", f"{100 * r.compute_overhead:.2f}%", f"{seconds:.1f}"]
    if solver == "exact":
        cells.append(_gap(r))
    return cells, seconds


def _gap(r: RematResult) -> str:
    if r.solver == "heuristic":
        return "MILP too large: heuristic"
    if r.optimal:
        return "0 (optimal)"
    return "-" if r.gap is None else f"{100 * r.gap:.2f}%"


def rule_cells(graph: Graph) -> list[str]:
    cells = []
    for policy in ("mirror", "sqrt"):
        clock = time.perf_counter()
        r = remat(graph, policy)
        cells += [f"{r.peak_bytes / r.baseline_peak_bytes:.3f}", f"{100 * r.compute_overhead:.1f}%"]
        if policy == "mirror":
            cells.append(f"{(r.threshold or 0) / 2**20:,.0f} MiB")
        cells.append(f"{time.perf_counter() - clock:.2f}")
    return cells


def sqrt_fit() -> tuple[list[list[object]], float, str]:
    rows, points = [], []
    for n in (16, 36, 64, 100, 144, 225, 400):
        graph = chain(n, train=True, batch=256, width=4)
        r = remat(graph, "sqrt")
        activation = graph.tensor("layers.0").nbytes
        static = build_model(graph).static_bytes
        load, base = r.peak_bytes - static, r.baseline_peak_bytes - static
        points.append((n, load))
        rows.append([n, f"{base / activation:.0f}", f"{load / activation:.0f}", f"{2 * math.sqrt(n) - 1:.1f}",
                     f"{100 * r.compute_overhead:.1f}%"])
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(v) for _, v in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    exponent = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    hundred = next(row for row in rows if row[0] == 100)
    note = f"100 layers: LOAD {hundred[2]} activations against {hundred[1]} without remat (2*sqrt(100) - 1 = 19)"
    return rows, exponent, note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args()
    backend = remat_ilp.available_backend() or "none (exact = heuristic)"
    budget_rows, rule_rows, slowest = [], [], 0.0
    for name, graph in graphs(args.quick):
        model = build_model(graph)
        log(f"{name}: {len(graph.ops)} ops, {model.num_candidates} recomputable")
        graph_seconds = 0.0
        for fraction in BUDGETS:
            heuristic, s1 = budget_cell(graph, fraction, "heuristic", args.time_limit)
            exact, s2 = budget_cell(graph, fraction, "exact", args.time_limit)
            graph_seconds += s1 + s2
            budget_rows.append([name, len(graph.ops), model.num_candidates, fraction, *heuristic, *exact])
            log(f"  {fraction}: heuristic {heuristic}, exact {exact}")
        if "train" in name:
            rule_rows.append([name, *rule_cells(graph)])
        slowest = max(slowest, graph_seconds)
        assert graph_seconds < GRAPH_SECONDS, f"{name} took {graph_seconds:.0f}s"
    chain_rows, exponent, note = sqrt_fit()
    body = "\n\n".join(
        [
            "## Remat: recomputation under a memory budget",
            f"Machine: {machine()}. MILP backend: {backend}. Rerun: `python scripts/bench_remat.py`.",
            "### Budgets (fraction of the no-remat peak of the node-id order)",
            (
                "Peak / baseline of the rewritten graph's as-given order (fits: <= the budget), compute "
                "overhead (added op cost / total op cost), seconds; for the exact solver (MILP, "
                f"{args.time_limit:.0f}s limit, warm-started by the heuristic) also the optimality gap.  "
                "Training graphs recompute forward activations for the backward pass; the random layered "
                "graphs have no backward, so a tensor is recomputed for the uses after its longest idle gap.  "
                "`infeasible: min = x` is the smallest feasible budget (proved by the MILP), "
                "`min <= x` the smallest found."
            ),
            table(
                ["graph", "ops", "recomputable", "budget",
                 "heuristic peak", "overhead", "s", "exact peak", "overhead", "s", "gap"],
                budget_rows,
            ),
            f"Slowest graph (all four runs): {slowest:.0f}s.",
            "### Rules on the training graphs: mirror (MXNet's threshold search) and sqrt(n) checkpoints",
            table(["graph", "mirror peak", "overhead", "threshold", "s", "sqrt peak", "overhead", "s"], rule_rows),
            "### sqrt(n) on training chains (`synthetic.chain(n, train=True, batch=256, width=4)`)",
            "LOAD in activations (one layer's output), without and with sqrt checkpoints.",
            table(["layers n", "no remat", "sqrt", "2 sqrt(n) - 1", "overhead"], chain_rows),
            f"{note}; LOAD grows as n^{exponent:.2f} (least squares over n = 16..400).",
        ]
    )
    write_section("remat", body)
    log("wrote docs/benchmarks.md")


if __name__ == "__main__":
    main()

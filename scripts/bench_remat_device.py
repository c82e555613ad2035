"""Remat against the published numbers: the budget on the device, fixed order and mpplan's own.

Rerun: ``python scripts/bench_remat_device.py`` (``--scale-max N``: the largest graph of
the scaling run, 100k ops by default; ``--scale-only``: print the scaling table alone,
docs untouched; ``--no-scale``: print the section without it, docs untouched; ``--quick``
is accepted and changes nothing since the six training graphs, 45 to 353 ops, run at
0.9/0.8/0.7 in every run).
Writes the ``remat_device`` section of docs/benchmarks.md.

Protocol (Moccasin's and Checkmate's): budget = 0.9, 0.8 (and 0.7) of ``static + LOAD``
of the graph's given order; overhead = recomputed op cost / the graph's total op cost.
Three columns per budget:

* ``fixed, LOAD``: ``remat(graph, "budget")``, the given order, the budget bounding
  ``static + LOAD`` (what Moccasin and Checkmate bound): apples to apples.
* ``fixed, arena``: ``plan`` with ``schedule: as_given``, the budget bounding the
  planned peak (arena at alignment 64, static included).
* ``own order``: ``plan`` with ``schedule: auto``: the planner's order first, then
  recomputes on it, the same bound on the planned peak.
"""

from __future__ import annotations

import argparse
import math
import os
import time

from benchlib import SHARED_DATA, log, stamp, table, write_section

from mpplan import sim
from mpplan.capture import synthetic
from mpplan.capture.graph_file import load_graph
from mpplan.config import Device
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat import build_model, min_feasible_budget, remat
from mpplan.passes.remat.choice import Choice
from mpplan.passes.remat.greedy import greedy
from mpplan.planner import PlannerSettings, plan

TIME_LIMIT = 60.0
DEVICE = [Device("cuda:0", 1 << 50)]

#: Moccasin (ICML 2023), its results table: overhead at 90% and 80% of the peak.
MOCCASIN = {("random_layered_n250", 0.9): 0.9, ("random_layered_n250", 0.8): 4.9,
            ("random_layered_n1000", 0.9): 0.7, ("random_layered_n1000", 0.8): 3.4}

TRAIN = ("ResNet50_256_224x224_train", "fcn_8_vgg_32_416x608_train", "VGG16_256_224x224_train",
         "MobileNet_512_224x224_train", "segnet_32_416x608_train", "vgg_unet_32_416x608_train")
RANDOM = ("random_layered_n250", "random_layered_n1000")


def load(name: str) -> Graph:
    paths = sorted(SHARED_DATA.glob(f"{name}*.json"))
    return load_graph(paths[0])


def fixed_load(graph: Graph, fraction: float) -> tuple[str, float]:
    clock = time.perf_counter()
    try:
        r = remat(graph, "budget", budget=fraction, time_limit_s=TIME_LIMIT)
    except InfeasibleError:
        return "refused", time.perf_counter() - clock
    assert r.budget_bytes is not None and r.peak_bytes <= r.budget_bytes
    return f"{100 * r.compute_overhead:.2f}% ({r.solver})", time.perf_counter() - clock


def planned(graph: Graph, fraction: float, schedule: str) -> tuple[str, float]:
    """Overhead, planned peak / budget, and the order that decided, of one planned budget."""
    clock = time.perf_counter()
    settings = PlannerSettings(schedule=schedule, remat="budget", remat_budget=fraction, remat_time_limit_s=TIME_LIMIT)
    try:
        made = plan(graph, DEVICE, settings)
    except InfeasibleError as exc:
        best = getattr(exc, "plan", None)
        over = "" if best is None else f", least peak {best.max_peak_bytes / budget_of(graph, fraction):.3f}"
        return f"refused{over}", time.perf_counter() - clock
    chosen = made.settings["remat_chosen"]
    ratio = made.max_peak_bytes / chosen["budget_bytes"]
    assert ratio <= 1.0
    cell = f"{100 * made.compute_overhead:.2f}% (peak {ratio:.3f}, {chosen['order']})"
    return cell, time.perf_counter() - clock


def budget_of(graph: Graph, fraction: float) -> int:
    return int(fraction * (sim.given_peak(graph)))


def comparison(names: tuple[str, ...], fractions: tuple[float, ...]) -> list[list[object]]:
    rows = []
    for name in names:
        graph = load(name)
        for fraction in fractions:
            load_cell, s1 = fixed_load(graph, fraction)
            arena_cell, s2 = planned(graph, fraction, "as_given")
            own_cell, s3 = planned(graph, fraction, "auto")
            published = MOCCASIN.get((name, fraction))
            rows.append([name, len(graph.ops), fraction, load_cell, f"{s1:.1f}", arena_cell, f"{s2:.1f}", own_cell,
                         f"{s3:.1f}", "-" if published is None else f"{published}%"])
            log(f"remat_device: {rows[-1]}")
    return rows


def least_loads(names: tuple[str, ...]) -> list[list[object]]:
    """The least ``static + LOAD`` any one-recompute-per-tensor choice reaches in the given
    order (``min_feasible_budget``: the MILP minimising the peak, proved when it finishes),
    over the no-remat peak: no budget under it fits in that model, whatever the arena."""
    rows: list[list[object]] = []
    for name in names:
        graph = load(name)
        clock = time.perf_counter()
        least, proved = min_feasible_budget(graph, time_limit_s=TIME_LIMIT)
        how = "proved least" if proved else "best found, not proved"
        rows.append([name, f"{least / budget_of(graph, 1.0):.3f}", how, f"{time.perf_counter() - clock:.1f}"])
        log(f"remat_device: least {rows[-1]}")
    return rows


def scaling(max_ops: int) -> tuple[list[list[object]], float, float]:
    """The heuristic on synthetic transformer training graphs of growing depth: seconds
    and the fitted exponent, of the whole heuristic and of its first greedy start alone.

    The whole heuristic runs its extra starts and local search only within ``TIME_LIMIT``;
    past it just the first start finishes, so its seconds flatten where that limit cuts.
    The first start (``greedy`` from nothing, over chains) always runs to the end: its
    exponent is the algorithm's own."""
    rows, points, starts = [], [], []
    layers = 64
    while True:
        graph = synthetic.transformer(layers, batch=1, seq=64, hidden=64, heads=4, vocab=512, train=True)
        if len(graph.ops) > max_ops:
            break
        clock = time.perf_counter()
        try:
            r = remat(graph, "budget", budget=0.9, solver="heuristic", time_limit_s=TIME_LIMIT, rounds=False)
            cell = f"{100 * r.compute_overhead:.2f}%"
        except InfeasibleError:
            cell = "refused"
        seconds = time.perf_counter() - clock
        model = build_model(graph)
        clock = time.perf_counter()
        greedy(Choice.build(model), int(0.9 * budget_of(graph, 1.0)) - model.static_bytes)
        first = time.perf_counter() - clock
        rows.append([layers, len(graph.ops), cell, f"{seconds:.2f}", f"{first:.2f}"])
        points.append((len(graph.ops), seconds))
        starts.append((len(graph.ops), first))
        log(f"remat_device: scale {rows[-1]}")
        layers *= 2
    return rows, growth(points), growth(starts)


def growth(points: list[tuple[int, float]]) -> float:
    """The exponent ``e`` of seconds ~ ops^e, least squares over log-log ``points``."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-12, sum((x - mx) ** 2 for x in xs))


SCALE_HEADERS = ["layers", "ops", "overhead", "s", "first start s"]


def growth_line(exponent: float, first_exponent: float) -> str:
    return (f"Seconds grow as ops^{exponent:.2f}, those of the first greedy start alone as ops^{first_exponent:.2f} "
            f"(least squares over the sizes above; past the {TIME_LIMIT:.0f} s limit only the first start runs).")


def section(quick: bool, scale_max: int, scale: bool = True) -> str:
    """The section's text; without ``scale``, the comparison alone (no scaling subsection)."""
    command = "python scripts/bench_remat_device.py" + (" --quick" if quick else "") + (
        f" --scale-max {scale_max}" if scale else " --no-scale")
    load_before = os.getloadavg()[0]
    random_rows = comparison(RANDOM, (0.9, 0.8))
    least_rows = least_loads(RANDOM)
    train_rows = comparison(TRAIN, (0.9, 0.8, 0.7))
    load_after = os.getloadavg()[0]
    headers = ["graph", "ops", "budget", "fixed, LOAD", "s", "fixed, arena", "s", "own order", "s", "Moccasin"]
    parts = [
        "## Remat on the device: fixed order against Moccasin and Checkmate, and mpplan's own order",
        stamp(command),
        f"Load average (1 min) at the start {load_before:.1f}, at the end {load_after:.1f}, on the machine's "
        f"{os.cpu_count()} cores: every time limit buys less search when it is high.",
        __doc__.split("\n\n", 2)[2].strip(),
        "`(peak x, order)`: planned peak / budget and what decided: `none` = the order alone fits, nothing "
        "recomputed; `planner`/`as_given` = the order the recomputes were decided in.  `refused, least peak x`: "
        "no fit; the best infeasible plan's peak / budget (written next to the refusal by `mpplan plan`).",
        "### Moccasin's random layered graphs",
        table(headers, random_rows),
        "The least peak of the one-recompute-per-tensor model in the given order (no budget under it fits "
        "fixed, whatever the arena):",
        table(["graph", "least static + LOAD / no-remat peak", "", "s"], least_rows),
        "### Checkmate's training graphs (Checkmate's optimum = the `exact` column of the remat section)",
        table(headers, train_rows),
    ]
    if scale:
        scale_rows, exponent, first_exponent = scaling(scale_max)
        parts += [
            "### Heuristic scaling (`synthetic.transformer(layers, batch=1, seq=64, hidden=64, heads=4, vocab=512, "
            "train=True)`, budget 0.9, one round, 60 s limit on the extra starts)",
            table(SCALE_HEADERS, scale_rows),
            growth_line(exponent, first_exponent),
        ]
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="kept for old command lines: as the full run")
    parser.add_argument("--scale-max", type=int, default=100_000, help="largest graph of the scaling run (ops)")
    parser.add_argument("--scale-only", action="store_true", help="print the scaling table only (docs untouched)")
    parser.add_argument("--no-scale", action="store_true", help="print the section without scaling (docs untouched)")
    args = parser.parse_args()
    if args.scale_only:
        rows, exponent, first_exponent = scaling(args.scale_max)
        print(table(SCALE_HEADERS, rows))
        print(growth_line(exponent, first_exponent))
        return
    if args.no_scale:  # the scaling subsection has its own run: print the rest, docs untouched
        print(section(args.quick, args.scale_max, scale=False))
        return
    write_section("remat_device", section(args.quick, args.scale_max))
    log("wrote the remat_device section of docs/benchmarks.md")


if __name__ == "__main__":
    main()

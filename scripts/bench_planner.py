"""Planner benchmark: schedule heuristics, assigners against LOAD, and planning time vs size.

Rerun: ``python scripts/bench_planner.py`` (add ``--quick`` to skip GPT-2 and the 100k-op
graph). Writes the ``planner`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
from typing import Iterator

from benchlib import SHARED_DATA, human, log, machine, table, timer, write_section

from mpplan import sim
from mpplan.graph import Graph
from mpplan.passes.assign import assign_offsets, records_load
from mpplan.passes.liveness import live_ranges
from mpplan.passes.schedule import schedule

HEURISTICS = ("as_given", "longest_path", "greedy_free", "least_peak", "dfs", "bfs", "auto")
ASSIGNERS = ("greedy_by_size", "best_fit", "auto")


def graphs(quick: bool) -> Iterator[tuple[str, Graph]]:
    from mpplan.capture.graph_file import load_graph

    for path in sorted(SHARED_DATA.glob("*.json")):
        yield path.stem, load_graph(path)
    from mpplan.capture.torch_capture import capture
    from mpplan.zoo import build, example_inputs

    for name, kwargs in (("mlp", {}), ("resnet", {}), ("gpt", {"seq_len": 128})):
        model = build(name, device="meta")
        inputs = example_inputs(name, batch=8, device="meta", **kwargs)
        yield f"zoo {name} (train, adam, batch 8)", capture(model, inputs, mode="train", optimizer="adam")
    if not quick:
        try:
            from mpplan.zoo.gpt2 import example_inputs as gpt2_inputs
            from mpplan.zoo.gpt2 import gpt2
        except ImportError:
            log("transformers missing: GPT-2 skipped")
        else:
            model = gpt2("gpt2", device="meta")
            inputs = gpt2_inputs(batch=4, seq_len=512, device="meta")
            with timer() as t:
                graph = capture(model, inputs, mode="train", optimizer="adam")
            log(f"GPT-2 small capture {t[0]:.1f}s, {len(graph.ops)} ops")
            yield "GPT-2 small (train, adam, 4x512)", graph
    for layers in synthetic_sizes(quick):
        yield f"synthetic transformer, {layers} layers (train)", synthetic(layers)


def synthetic_sizes(quick: bool) -> tuple[int, ...]:
    return (36, 360) if quick else (36, 360, 3600)


def synthetic(layers: int) -> Graph:
    from mpplan.capture.synthetic import synthetic_graph

    return synthetic_graph("transformer", layers=layers, train=True)


def arena(graph: Graph, order, algorithm: str) -> tuple[int, int, float]:
    ranges = live_ranges(graph, order).ranges
    records = [(r.nbytes, r.first, r.last) for r in ranges]
    with timer() as t:
        result = assign_offsets(records, alignment=1, algorithm=algorithm)
    return result.arena, records_load(records), t[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sched_rows, assign_rows, time_rows, scaling = [], [], [], []
    for name, graph in graphs(args.quick):
        log(f"{name}: {len(graph.ops)} ops")
        graph.validate()
        loads, seconds, orders = {}, {}, {}
        for method in HEURISTICS:
            with timer() as t:
                orders[method] = schedule(graph, method)
            seconds[method] = t[0]
            loads[method] = sim.order_load(graph, orders[method])
        best_single = min(v for k, v in loads.items() if k != "auto")
        static = sim.static_bytes(graph)
        sched_rows.append(
            [name, len(graph.ops), human(static)]
            + [human(loads[m]) for m in HEURISTICS]
            + ["yes" if loads["auto"] <= best_single else "**no**"]
        )
        row = [name]
        for order_name in ("as_given", "auto"):
            results = {a: arena(graph, orders[order_name], a) for a in ASSIGNERS}
            load = results["auto"][1]
            row += [human(load)] + [human(results[a][0]) for a in ASSIGNERS] + [
                "yes" if results["auto"][0] == load else f"**+{results['auto'][0] - load}**"
            ]
        assign_rows.append(row)
        with timer() as t_live:
            ranges = live_ranges(graph, orders["auto"]).ranges
        _, _, t_assign = arena(graph, orders["auto"], "auto")
        time_rows.append([name, len(graph.ops), f"{seconds['auto']:.3f}", f"{t_live[0]:.3f}", f"{t_assign:.3f}",
                          f"{seconds['auto'] + t_live[0] + t_assign:.3f}", f"{seconds['greedy_free']:.3f}"])
        if name.startswith("synthetic"):
            scaling.append((len(graph.ops), seconds["auto"] + t_live[0] + t_assign))
        del ranges
    exponent = fit_exponent(scaling)
    body = "\n\n".join(
        [
            "## Planner: schedules, assignment, planning time",
            f"Machine: {machine()}. Rerun: `python scripts/bench_planner.py`.",
            "### LOAD of each schedule (live dynamic memory; static is order-independent)",
            table(["graph", "ops", "static"] + list(HEURISTICS) + ["auto <= best heuristic"], sched_rows),
            "### Arena of each assigner against LOAD (alignment 1), in the as-given and the auto order; excess in bytes",
            table(
                ["graph"]
                + [f"{o}: {c}" for o in ("as_given", "auto") for c in ("LOAD", *ASSIGNERS, "auto = LOAD")],
                assign_rows,
            ),
            "### Planning seconds per stage (auto schedule, liveness, auto assignment; one device)",
            table(["graph", "ops", "schedule", "liveness", "assign", "total", "greedy_free alone"], time_rows),
            f"Planning time grows as ops^{exponent:.2f} over the synthetic graphs "
            f"({', '.join(f'{n} ops: {s:.2f}s' for n, s in scaling)}).",
        ]
    )
    write_section("planner", body)
    log("wrote docs/benchmarks.md")


def fit_exponent(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of log(seconds) against log(ops)."""
    if len(points) < 2:
        return float("nan")
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(max(s, 1e-6)) for _, s in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


if __name__ == "__main__":
    main()

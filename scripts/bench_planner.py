"""Planner benchmark: schedule heuristics, assigners against LOAD, and planning time vs graph size.

Rerun: ``python scripts/bench_planner.py`` (add ``--quick`` to skip GPT-2 and the
synthetic graphs over 10k ops).  Writes the ``planner`` section of docs/benchmarks.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

from benchlib import SHARED_DATA, fit_exponent, human, log, rerun, section_main, stamp, table, timer

from mpplan import sim
from mpplan.config import Device
from mpplan.graph import Graph
from mpplan.liveness import live_ranges
from mpplan.passes.assign import assign_offsets, records_load
from mpplan.passes.schedule import schedule
from mpplan.planner import plan

HEURISTICS = ("as_given", "longest_path", "greedy_free", "least_peak", "dfs", "bfs", "auto")
ASSIGNERS = ("greedy_by_size", "best_fit", "auto")
# greedy_by_size walks every pair of overlapping lifetimes: quadratic on long training graphs
# (16 s at 10k ops, out of memory at 100k), so larger graphs leave it out.
GREEDY_BY_SIZE_MAX_OPS = 15_000
SYNTHETIC_PREFIX = "synthetic transformer"


def graphs(quick: bool) -> Iterator[tuple[str, Graph]]:
    """The Checkmate graphs, the zoo models, GPT-2 small (full run) and the synthetic transformers."""
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
        yield f"{SYNTHETIC_PREFIX}, {layers} layers (train)", synthetic(layers)


def synthetic_sizes(quick: bool) -> tuple[int, ...]:
    """Layers of the synthetic transformers: about 1k, 3.4k and 10k ops, then 34k and 100k in a full run."""
    return (36, 120, 360) if quick else (36, 120, 360, 1200, 3600)


def synthetic(layers: int) -> Graph:
    from mpplan.capture.synthetic import synthetic_graph

    return synthetic_graph("transformer", layers=layers, train=True)


@dataclass(frozen=True)
class Schedules:
    """Every heuristic's order of one graph, with its LOAD and the seconds it took."""

    orders: dict[str, tuple[int, ...]]
    loads: dict[str, int]
    seconds: dict[str, float]


def run_schedules(graph: Graph) -> Schedules:
    orders, loads, seconds = {}, {}, {}
    for method in HEURISTICS:
        with timer() as t:
            orders[method] = tuple(schedule(graph, method))
        seconds[method] = t[0]
        loads[method] = sim.order_load(graph, orders[method])
    return Schedules(orders, loads, seconds)


def arena(graph: Graph, order: Sequence[int], algorithm: str) -> tuple[int, int, float] | None:
    """(arena, LOAD, seconds) of one assigner at alignment 1; None where it is left out for size."""
    if algorithm == "greedy_by_size" and len(graph.ops) > GREEDY_BY_SIZE_MAX_OPS:
        return None
    records = [(r.nbytes, r.first, r.last) for r in live_ranges(graph, order).ranges]
    with timer() as t:
        result = assign_offsets(records, alignment=1, algorithm=algorithm)
    return result.arena, records_load(records), t[0]


def schedule_row(name: str, graph: Graph, found: Schedules) -> list[object]:
    best_single = min(v for k, v in found.loads.items() if k != "auto")
    return (
        [name, len(graph.ops), human(sim.static_bytes(graph))]
        + [human(found.loads[m]) for m in HEURISTICS]
        + ["yes" if found.loads["auto"] <= best_single else "**no**"]
    )


def assign_row(name: str, graph: Graph, found: Schedules) -> tuple[list[object], float]:
    """The assigners in the as-given and the auto order, and the auto assigner's seconds in the auto order."""
    row: list[object] = [name]
    auto_seconds = 0.0
    for order_name in ("as_given", "auto"):
        results = {a: arena(graph, found.orders[order_name], a) for a in ASSIGNERS}
        auto_arena, load, auto_seconds = results["auto"]  # type: ignore[misc]
        row += [human(load)] + [human(r[0]) if r else "-" for r in results.values()]
        row.append("yes" if auto_arena == load else f"**+{auto_arena - load}**")
    return row, auto_seconds


def plan_seconds(graph: Graph) -> float:
    """Seconds of the whole planner (``mpplan.planner.plan``, defaults) for one device."""
    with timer() as t:
        plan(graph, [Device("gpu0", 1 << 50)])
    return t[0]


def section(quick: bool) -> str:
    sched_rows, assign_rows, time_rows, scaling_rows = [], [], [], []
    stage_points, plan_points = [], []
    for name, graph in graphs(quick):
        log(f"planner: {name}: {len(graph.ops)} ops")
        graph.validate()
        found = run_schedules(graph)
        sched_rows.append(schedule_row(name, graph, found))
        row, t_assign = assign_row(name, graph, found)
        assign_rows.append(row)
        with timer() as t_live:
            live_ranges(graph, found.orders["auto"])
        total = found.seconds["auto"] + t_live[0] + t_assign
        time_rows.append([name, len(graph.ops), f"{found.seconds['auto']:.3f}", f"{t_live[0]:.3f}", f"{t_assign:.3f}",
                          f"{total:.3f}", f"{found.seconds['greedy_free']:.3f}"])
        if name.startswith(SYNTHETIC_PREFIX):
            whole = plan_seconds(graph)
            stage_points.append((len(graph.ops), total))
            plan_points.append((len(graph.ops), whole))
            scaling_rows.append([f"{len(graph.ops):,}", f"{total:.2f}", f"{whole:.2f}"])
    sizes = ", ".join(f"{n:,}" for n, _ in plan_points)
    return "\n\n".join(
        [
            "## Planner: schedules, assignment, planning time",
            stamp(rerun("bench_planner.py", quick)),
            "### LOAD of each schedule (live dynamic memory; static is order-independent)",
            table(["graph", "ops", "static"] + list(HEURISTICS) + ["auto <= best heuristic"], sched_rows),
            "### Arena of each assigner against LOAD (alignment 1), in the as-given and the auto order; "
            "excess in bytes",
            f"greedy_by_size is left out (`-`) over {GREEDY_BY_SIZE_MAX_OPS:,} ops: it enumerates every pair of "
            "overlapping lifetimes, which is quadratic on long training graphs (out of memory at 100k ops).",
            table(
                ["graph"]
                + [f"{o}: {c}" for o in ("as_given", "auto") for c in ("LOAD", *ASSIGNERS, "auto = LOAD")],
                assign_rows,
            ),
            "### Planning seconds per stage (auto schedule, liveness, auto assignment; one device)",
            table(["graph", "ops", "schedule", "liveness", "assign", "total", "greedy_free alone"], time_rows),
            "### Planning time vs graph size (synthetic transformer training graphs)",
            "`stages`: auto schedule + liveness + auto assignment, as above; `plan()`: the whole planner "
            "(`mpplan.planner.plan` with default settings on one device: remat none, schedule, placement, "
            "copies, liveness, assignment).",
            table(["ops", "stages s", "plan() s"], scaling_rows),
            f"Over {sizes} ops, the stages grow as ops^{fit_exponent(stage_points):.2f} and `plan()` as "
            f"ops^{fit_exponent(plan_points):.2f} (least-squares fit of log seconds against log ops).",
        ]
    )


def main() -> None:
    section_main("planner", section, __doc__)


if __name__ == "__main__":
    main()

"""Peak memory: plain eager PyTorch against memonger-style sharing, greedy-by-size offsets and mpplan auto.

Rerun: ``python scripts/bench_peak.py`` (``--quick`` runs GPT-2 small at 1x128 instead
of its config's 4x512).  Writes the ``peak`` section of docs/benchmarks.md.

Every model is planned for one device three ways (the ``planner.assign`` setting:
``shared_greedy``, memonger's greedy blob sharing laid end to end; ``greedy_by_size``,
TFLite's offsets; ``auto``, mpplan's best), all after the same auto schedule.  Torch
models are also executed: the eager baseline (the module run the ordinary way) and
the auto plan in arena mode, both on a virtual device whose every storage is
accounted, by ``mpplan.runtime.evaluate_program``; and the auto plan again with
``planner.grads: dynamic`` (gradients held as eager holds ``.grad``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from benchlib import SHARED_DATA, TorchCase, human, log, rerun, section_main, stamp, table, torch_case, torch_threads

from mpplan.capture.graph_file import load_graph
from mpplan.config import Device
from mpplan.graph import Graph, Kind
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.runtime import evaluate_program

ASSIGNERS = ("shared_greedy", "greedy_by_size", "auto")
TORCH_CONFIGS = ("zoo_mlp", "zoo_resnet", "zoo_gpt", "gpt2_small")
QUICK_OVERRIDES = {"gpt2_small": ("workload.batch=1", "workload.seq=128")}


def plans(graph: Graph, device: Device, base: PlannerSettings = PlannerSettings()) -> dict[str, Plan]:
    """One single-device plan per assigner."""
    return {a: plan(graph, [device], dataclasses.replace(base, assign=a, placement="single")) for a in ASSIGNERS}


def planned_cells(found: dict[str, Plan]) -> list[str]:
    """The lower bound (static + LOAD) and each assigner's planned peak."""
    return [human(found["auto"].devices[0].lower_bound_bytes)] + [human(found[a].max_peak_bytes) for a in ASSIGNERS]


def grad_bytes(graph: Graph) -> int:
    """Bytes of the parameters' gradients, which the plan holds for the whole step (static)."""
    params = {t.name for t in graph.tensors if t.kind is Kind.PARAM}
    return sum(t.nbytes for t in graph.tensors if t.kind is Kind.GRAD and t.grad_of in params and t.alias_of is None)


@dataclass(frozen=True)
class TorchResult:
    """A torch model's table row and the numbers the closing note compares."""

    row: list[object]
    found: dict[str, Plan]
    excess: int  # measured plan peak - eager peak
    grads: int
    dynamic_excess: int  # the same with planner.grads: dynamic


def verdict(planned: int, eager: int) -> str:
    """How the measured plan compares with eager, in percent of eager."""
    change = 100 * (planned - eager) / eager
    if abs(change) < 0.05:
        return "same"
    return f"{-change:.1f}% less" if change < 0 else f"**{change:.1f}% more**"


def torch_row(case: TorchCase) -> TorchResult:
    """Plan a captured model three ways, then measure eager and the auto plan on a virtual device."""
    graph = case.program.graph
    settings = PlannerSettings.from_config(case.config.planner)
    found = plans(graph, case.device, settings)
    measured = evaluate_program(
        case.program, found["auto"], case.model, case.inputs, steps=1, warmup=1, devices="virtual", eager=True
    )
    dynamic_plan = plan(graph, [case.device], dataclasses.replace(settings, placement="single", grads="dynamic"))
    dynamic = evaluate_program(
        case.program, dynamic_plan, case.model, case.inputs, steps=1, warmup=1, devices="virtual", eager=False
    ).devices[0].measured_peak_bytes
    assert measured.eager is not None and measured.numerics is not None
    eager = measured.eager.devices[0].measured_peak_bytes
    planned = measured.devices[0].measured_peak_bytes
    grads = grad_bytes(graph)
    log(f"  eager {human(eager)}, auto plan measured {human(planned)}, with dynamic grads {human(dynamic)}")
    row = [
        case.label, len(graph.ops), human(measured.devices[0].static_bytes), human(grads), human(eager),
        *planned_cells(found), human(planned), verdict(planned, eager), human(dynamic), verdict(dynamic, eager),
        "yes" if measured.numerics.ok else "**no**",
    ]
    return TorchResult(row, found, planned - eager, grads, dynamic - eager)


def excess_note(results: list[TorchResult]) -> str:
    """Where the plan needs more than eager, whether the gradients' bytes account for it."""
    worse = [r for r in results if r.excess > 0]
    dynamic_worse = [r for r in results if r.dynamic_excess > 0]
    dynamic = (
        "With `planner.grads: dynamic` (each gradient made by backward and held to the end of the step, as "
        "eager holds `.grad`) the measured plan needs no more than eager on every torch model."
        if not dynamic_worse
        else f"With `planner.grads: dynamic` the plan still needs more than eager on {len(dynamic_worse)} of "
        f"{len(results)} torch models, by at most {max(r.dynamic_excess for r in dynamic_worse)} bytes "
        "(64-byte alignment padding, where the difference is that small)."
    )
    if not worse:
        return "The measured plan needs no more than eager on every torch model.  " + dynamic
    covered = all(r.excess <= r.grads for r in worse)
    return (
        f"With the default static gradients the plan needs more than eager on {len(worse)} of {len(results)} "
        "torch models" + (", each time by less than the gradients' bytes: " if covered else ". ")
        + "that memory model (memonger's) keeps every parameter gradient allocated for the whole step, while "
        "eager PyTorch creates each gradient during backward (`set_to_none`).  " + dynamic
    )


def graph_row(path: Path) -> tuple[list[object], dict[str, Plan]]:
    """Plan a Checkmate graph three ways (no tensors to execute: no eager, nothing measured)."""
    graph = load_graph(path)
    log(f"peak: {path.stem}: {len(graph.ops)} ops")
    found = plans(graph, Device("gpu0", 1 << 50))
    static = found["auto"].devices[0].static_bytes
    row = [path.stem, len(graph.ops), human(static), human(grad_bytes(graph)), "-", *planned_cells(found), *["-"] * 5]
    return row, found


def assigner_note(found: list[dict[str, Plan]]) -> str:
    """auto against the other assigners over every row: geometric-mean peak ratio and rows at the bound."""
    def geomean_saving(other: str) -> float:
        logs = [math.log(f["auto"].max_peak_bytes / f[other].max_peak_bytes) for f in found]
        return 100 * (1 - math.exp(sum(logs) / len(logs)))

    at_bound = sum(f["auto"].max_peak_bytes <= 1.001 * f["auto"].devices[0].lower_bound_bytes for f in found)
    return (
        f"Over all {len(found)} rows, auto's planned peak is {geomean_saving('shared_greedy'):.1f}% below "
        f"shared_greedy's and {geomean_saving('greedy_by_size'):.1f}% below greedy_by_size's (geometric means), "
        f"and within 0.1% of the lower bound on {at_bound}."
    )


def section(quick: bool) -> str:
    with torch_threads(1):
        results = [torch_row(torch_case(c, QUICK_OVERRIDES.get(c, ()) if quick else ())) for c in TORCH_CONFIGS]
    graphs = [graph_row(path) for path in sorted(SHARED_DATA.glob("*.json"))]
    rows = [r.row for r in results] + [row for row, _ in graphs]
    found = [r.found for r in results] + [f for _, f in graphs]
    return "\n\n".join(
        [
            "## Peak memory: eager PyTorch, memonger-style sharing, greedy by size, mpplan auto",
            stamp(rerun("bench_peak.py", quick)),
            (
                "One device.  `eager`: the module run the ordinary way (forward, loss, backward with "
                "`zero_grad(set_to_none=True)`, optimizer step), its peak over the timed step after one "
                "warm-up; `shared_greedy`: memonger's greedy blob sharing (objects laid end to end); "
                "`greedy_by_size`: TFLite's offsets; `auto`: mpplan's assignment (all three after the same "
                "auto schedule, 64-byte alignment); `lower bound`: static + LOAD, which no assignment of "
                "that schedule beats; `auto measured`: the auto plan executed in arena mode; `dynamic grads`: "
                "the same with `planner.grads: dynamic`, parameter gradients held as eager holds `.grad`.  "
                "Eager and the plans run on a virtual device (CPU memory, every live storage accounted; exact in "
                "arena mode); `numerics ok`: the plan's loss, gradients and updated weights match eager's.  "
                "Torch rows name the config (`configs/<name>.yaml`) and the overrides (`--set`) they ran "
                "with; the Checkmate graphs have no tensors to execute, so eager does not apply (`-`)."
            ),
            table(
                ["model", "ops", "static", "of which grads", "eager", "lower bound", *ASSIGNERS, "auto measured",
                 "auto measured vs eager", "dynamic grads measured", "dynamic grads vs eager", "numerics ok"],
                rows,
            ),
            assigner_note(found),
            excess_note(results),
        ]
    )


def main() -> None:
    section_main("peak", section, __doc__)


if __name__ == "__main__":
    main()

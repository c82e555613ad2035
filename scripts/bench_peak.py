"""Peak memory: plain eager PyTorch against mpplan's plans, on one and two devices, in both grads modes.

Rerun: ``PYTHONPATH=. python scripts/bench_peak.py`` (``--quick`` runs GPT-2 small at 1x128
instead of its config's 4x512).  Writes the ``peak`` section of docs/benchmarks.md.

Torch models (every zoo model, GPT-2 small and the held-out style conv + attention + skip
network, all trained with their config's optimizer) are captured once, then:

* eager: the module run the ordinary way (``zero_grad(set_to_none=True)``, forward,
  loss, backward, optimizer step) on a virtual device, every live storage counted;
* for ``planner.grads`` dynamic (the default) and static: the plan for one device and
  the pipeline plan for two, each counting what arena mode holds outside the arena
  (``plan_with_scratch``) and executed in arena mode on virtual devices
  (``mpplan.runtime.evaluate_program``), so every planned number is a measured one, and
  each must equal the plan's own peak;
* for two devices, where the sum of the device peaks goes beyond one device's peak:
  the bytes both devices hold at one step (the sum's own peak) and the copies.

Every graph (torch models and the Checkmate graphs) is also planned for one device with
three assigners (``shared_greedy``, memonger's greedy blob sharing laid end to end;
``greedy_by_size``, TFLite's offsets; ``auto``, mpplan's best), all after the same auto
schedule, against the lower bound static + LOAD.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchlib import SHARED_DATA, TorchCase, human, log, rerun, section_main, stamp, table, torch_case, torch_threads

from mpplan import sim
from mpplan.capture.graph_file import load_graph
from mpplan.config import Device
from mpplan.graph import Graph, Kind
from mpplan.liveness import live_ranges
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, placed_graph, plan
from mpplan.runtime import evaluate_program
from mpplan.runtime.scratch import plan_with_scratch

ASSIGNERS = ("shared_greedy", "greedy_by_size", "auto")
GRADS = ("dynamic", "static")
TORCH_CONFIGS = ("zoo_mlp", "zoo_resnet", "zoo_gpt", "zoo_convattn", "gpt2_small")
QUICK_OVERRIDES = {"gpt2_small": ("workload.batch=1", "workload.seq=128")}


def plans(graph: Graph, device: Device, base: PlannerSettings = PlannerSettings()) -> dict[str, Plan]:
    """One single-device plan per assigner."""
    return {a: plan(graph, [device], dataclasses.replace(base, assign=a, placement="single")) for a in ASSIGNERS}


def planned_cells(found: dict[str, Plan]) -> list[str]:
    """The lower bound (static + LOAD) and each assigner's planned peak."""
    return [human(found["auto"].devices[0].lower_bound_bytes)] + [human(found[a].max_peak_bytes) for a in ASSIGNERS]


def grad_bytes(graph: Graph) -> int:
    """Bytes of the parameters' gradients (static all step under ``grads: static``)."""
    params = {t.name for t in graph.tensors if t.kind is Kind.PARAM}
    return sum(t.nbytes for t in graph.tensors if t.kind is Kind.GRAD and t.grad_of in params and t.alias_of is None)


def together_peak(graph: Graph, found: Plan) -> tuple[int, tuple[str, ...]]:
    """The most bytes all devices of ``found`` hold at one step (static included): the peak of
    the summed memory, which the sum of the device peaks exceeds when the devices peak at
    different steps; and, per device, the op at its own peak (forward or backward)."""
    placed = placed_graph(graph, found)
    total: list[int] = []
    static = 0
    peak_ops = []
    for device in found.devices:
        storages = frozenset(s for s, d in enumerate(placed.storage_device) if d == device.name)
        liveness = live_ranges(placed.graph, range(len(placed.graph.ops)), storages)
        profile = sim.live_profile(liveness.ranges, liveness.num_steps)
        total = profile if not total else [a + b for a, b in zip(total, profile)]
        static += liveness.static_bytes
        op = placed.graph.ops[max(range(len(profile)), key=profile.__getitem__)]
        peak_ops.append(f"`{op.name}` ({'backward' if op.backward_of else 'forward'})")
    return static + max(total, default=0), tuple(peak_ops)


@dataclass(frozen=True)
class Mode:
    """One grads mode of one model: measured peaks on one device and on two."""

    grads: str
    one: int
    scratch: int  # of ``one``: the most one op holds outside the arena (results copied in)
    lower_bound: int  # the one-device plan without an arena: static + LOAD, every tensor its own allocation
    single: int  # the same plan with the one-block arena held all step (``blocks=False``), predicted
    blocks: tuple[int, int]  # the one-device plan's arena blocks, and how many of them are adopted results
    two: tuple[int, ...]
    together: int
    copies: int
    peak_ops: tuple[str, ...]  # per device of the two: the op at its peak, and whether it is forward or backward
    numerics_ok: bool


@dataclass(frozen=True)
class TorchResult:
    """A torch model's rows and the numbers the notes compare."""

    label: str
    ops: int
    eager: int
    grads: int
    modes: tuple[Mode, ...]
    assigners: list[object]
    found: dict[str, Plan]


def verdict(planned: int, eager: int) -> str:
    """``planned / eager`` and how it compares, in percent of eager."""
    change = 100 * (planned - eager) / eager
    if abs(change) < 0.05:
        return f"{planned / eager:.3f} (same)"
    if change < 0:
        return f"{planned / eager:.3f} ({-change:.1f}% less)"
    return f"**{planned / eager:.3f} ({change:.1f}% more)**"


def measure(case: TorchCase, found: Plan, *, eager: bool):
    """``found`` executed in arena mode on virtual devices, one timed step after one warm-up."""
    return evaluate_program(case.program, found, case.model, case.inputs, steps=1, warmup=1, devices="virtual",
                            eager=eager)


def with_scratch(case: TorchCase, found: Plan, *, blocks: bool = True) -> Plan:
    """``found`` as arena mode runs it on the virtual devices: its blocks and what it holds outside them."""
    return plan_with_scratch(case.program, found, "virtual", blocks=blocks)


def torch_result(case: TorchCase) -> TorchResult:
    """Eager, then each grads mode planned and measured on one device and on two."""
    graph = case.program.graph
    base = PlannerSettings.from_config(case.config.planner)
    found = plans(graph, case.device, base)
    one_device, two_devices = [case.device], [dataclasses.replace(case.device, name=f"cuda:{i}") for i in range(2)]
    eager = 0
    modes = []
    for grads in GRADS:
        settings = dataclasses.replace(base, grads=grads)
        bare = plan(graph, one_device, dataclasses.replace(settings, placement="single"))
        single = with_scratch(case, bare)
        first = measure(case, single, eager=True)  # eager again: the numerics check of this mode's plan
        assert first.eager is not None
        eager = eager or first.eager.devices[0].measured_peak_bytes
        one_block = with_scratch(case, bare, blocks=False).max_peak_bytes
        pipeline = with_scratch(case, plan(graph, two_devices, dataclasses.replace(settings, placement="pipeline")))
        second = measure(case, pipeline, eager=False)
        two = tuple(d.measured_peak_bytes for d in second.devices)
        for m, p in ((first, single), (second, pipeline)):  # the prediction is the plan's own peak
            assert [d.measured_peak_bytes for d in m.devices] == [d.peak_bytes for d in p.devices], (m, p)
        together, peak_ops = together_peak(graph, pipeline)
        d = single.devices[0]
        adopted = sum(b.adopts is not None for b in single.blocks)
        modes.append(Mode(grads, first.devices[0].measured_peak_bytes, d.scratch_bytes, d.lower_bound_bytes,
                          one_block, (len(single.blocks), adopted), two, together, pipeline.cross_device_bytes,
                          peak_ops,
                          first.numerics is not None and first.numerics.ok))
        log(f"  {grads}: one device {human(modes[-1].one)}, two {[human(b) for b in two]} (eager {human(eager)})")
    assigners = [case.label, len(graph.ops), human(found["auto"].devices[0].static_bytes), human(grad_bytes(graph)),
                 *planned_cells(found)]
    return TorchResult(case.label, len(graph.ops), eager, grad_bytes(graph), tuple(modes), assigners, found)


def eager_rows(results: Sequence[TorchResult]) -> list[list[object]]:
    """Planned (measured) against eager: one row per model and grads mode."""
    rows: list[list[object]] = []
    for r in results:
        for m in r.modes:
            total = sum(m.two)
            rows.append([
                r.label, human(r.eager), f"`{m.grads}`" + (" (default)" if m.grads == "dynamic" else ""),
                human(m.one), human(m.scratch), f"{m.blocks[0]} ({m.blocks[1]})", verdict(m.one, r.eager),
                human(m.single), verdict(m.single, r.eager), human(m.lower_bound),
                verdict(m.lower_bound, r.eager), " / ".join(human(b) for b in m.two),
                verdict(max(m.two), r.eager), f"{total / r.eager:.3f}", f"{total / m.one:.3f}",
                f"{m.together / m.one:.3f}", human(m.copies), "yes" if m.numerics_ok else "**no**",
            ])
    return rows


def eager_note(results: Sequence[TorchResult]) -> str:
    """How the default plan compares with eager, what the blocks bought over one block, and the static model."""
    dynamic = [(r, r.modes[0]) for r in results]
    savings = [100 * (r.eager - m.one) / r.eager for r, m in dynamic]
    worse = [f"{r.label} by {human(m.one - r.eager)}" for r, m in dynamic if m.one > r.eager]
    single_worse = [f"{r.label} {verdict(m.single, r.eager)}" for r, m in dynamic if m.single > r.eager]
    at_bound = [r.label for r, m in dynamic if m.one == m.lower_bound]
    static_worse = [r for r in results if r.modes[1].one > r.eager]
    covered = all(r.modes[1].one - r.eager <= r.grads for r in static_worse)
    least = f"{-min(savings):.2f}% more" if min(savings) < 0 else f"{min(savings):.2f}% less"
    head = (
        f"With the default `planner.grads: dynamic` the measured plan in arena mode needs from "
        f"{max(savings):.1f}% less to {least} than eager on one device"
        + (f"; more on {'; '.join(worse)}." if worse else ", never more.")
        + "  Every planned number is the plan's own peak, measured exactly: static + the most the arena's "
        "blocks (each allocated at its first buffer's step, freed after its last's) and the running op's "
        "scratch hold at one step.  A result an op with no `out=` overload (attention, convolution, layer, "
        "group and batch norm on CPU) computes is kept as a block of its own (adopted) instead of copied into "
        "the arena, so it holds no scratch; the plan keeps whichever of three layouts the simulator gives the "
        "least peak (adopt only results alone in their block of the cut arena, adopt all, one block per "
        "buffer), fewest blocks on ties"
        + (f"; it reaches static + LOAD (no-arena mode's memory) on {', '.join(at_bound)}." if at_bound else ".")
        + "  The one-block arena (`planner` plan with `plan_with_scratch(..., blocks=False)`, held all step, "
        "results copied in) predicts "
        + (f"more than eager on {', '.join(single_worse)}." if single_worse else "no more than eager.")
        + "  Eager's meter counts each storage's own bytes, as the CUDA allocator does not (it rounds every "
        "block up to 512 bytes); on a GPU many small blocks pay that rounding too, which a virtual device "
        "does not show."
    )
    static = (
        f"  With `static` gradients (memonger's model: every parameter gradient resident all step) the plan "
        f"needs more than eager on {len(static_worse)} of {len(results)} models"
        + (", each time by less than the gradients' bytes." if covered and static_worse else ".")
    )
    return head + static


def two_device_note(results: Sequence[TorchResult]) -> str:
    """How close the sum of two device peaks is to one device's peak, and why it is not closer."""
    ratios = [(r, m, sum(m.two) / m.one, m.together / m.one) for r in results for m in r.modes[:1]]
    r, m, total, together = max(ratios, key=lambda x: x[2])
    return (
        "Two devices, pipeline placement, default grads: the sum of the two device peaks is "
        + ", ".join(f"{x.label} {s:.2f}x" for x, _, s, _ in ratios)
        + " one device's planned peak.  Two things make up the excess, and the table separates them.  "
        "First, what crossing the cut duplicates: a copy and its source are both live until the copy has "
        "run, a gradient comes back the same way, and a weight read on both sides (a tied one, or one a "
        "stage's backward needs) is held twice; `both at one step` is the most the two devices hold together "
        f"at any one step, {together:.2f}x one device's peak on {r.label} (copies: {human(m.copies)} per step, "
        "not all live at once).  Second, the devices peak at different steps, and the sum adds the two "
        f"peaks anyway: on {r.label} the first device peaks at {m.peak_ops[0]}, the second at {m.peak_ops[1]}, "
        f"so the other {total - together:.2f}x is peaks that never coincide.  A pipeline minimises the larger "
        "device's peak (what has to fit; `2 devices, max / eager`), not the sum, and the sum is no memory any "
        "one device needs."
    )


def graph_row(path: Path) -> tuple[list[object], dict[str, Plan]]:
    """Plan a Checkmate graph three ways (no tensors to execute: no eager, nothing measured)."""
    graph = load_graph(path)
    log(f"peak: {path.stem}: {len(graph.ops)} ops")
    found = plans(graph, Device("gpu0", 1 << 50))
    static = found["auto"].devices[0].static_bytes
    return [path.stem, len(graph.ops), human(static), human(grad_bytes(graph)), *planned_cells(found)], found


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
        results = [torch_result(torch_case(c, QUICK_OVERRIDES.get(c, ()) if quick else ())) for c in TORCH_CONFIGS]
    graphs = [graph_row(path) for path in sorted(SHARED_DATA.glob("*.json"))]
    found = [r.found for r in results] + [f for _, f in graphs]
    return "\n\n".join(
        [
            "## Peak memory: eager PyTorch against mpplan's plans; memonger-style sharing, greedy by size, auto",
            stamp(rerun("bench_peak.py", quick)),
            "### Planned against eager, at the same batch",
            (
                "`eager`: the module run the ordinary way (forward, loss, backward with "
                "`zero_grad(set_to_none=True)`, the config's optimizer step), its peak over the timed step after one "
                "warm-up.  `planned`: the plan executed in arena mode, measured the same way (equal to the plan's own "
                "peak, scratch included, on a virtual device), for one device and for two (pipeline placement, each "
                "device with the config's first device's capacity), in each `planner.grads` mode; `of which "
                "scratch`: what one op holds outside the arena; `blocks (adopted)`: the arena's blocks, and how many "
                "are results kept where their kernel made them; `one-block arena`: the same plan with one arena "
                "block held all step and results copied in (predicted, what the planned peak was before blocks); "
                "`no arena`: the same plan's static + LOAD, what it needs with every tensor its own allocation.  "
                "`2 devices, max`: the larger "
                "device peak against eager; `sum / eager` and `sum / 1 device`: the two peaks added; `both at one "
                "step / 1 device`: the most the two devices hold together at any one step; `copies`: bytes copied "
                "between the devices per step.  Everything runs on virtual devices (CPU memory, every live storage "
                "counted, one intra-op thread); `numerics ok`: the one-device plan's loss, gradients and updated "
                "weights match eager's.  Rows name the config (`configs/<name>.yaml`) and any `--set` overrides."
            ),
            table(
                ["model", "eager", "grads", "1 device: planned", "of which scratch", "blocks (adopted)",
                 "planned / eager", "one-block arena", "one-block / eager",
                 "no arena: static + LOAD", "no arena / eager", "2 devices: peaks",
                 "2 devices, max / eager", "sum / eager", "sum / 1 device", "both at one step / 1 device", "copies",
                 "numerics ok"],
                eager_rows(results),
            ),
            eager_note(results),
            two_device_note(results),
            "### Assigners against the lower bound, one device",
            (
                "Default settings (`planner.grads: dynamic`).  `static`: bytes resident all step (parameters, "
                "optimizer state, inputs); `grads`: the parameters' gradients; `shared_greedy`: memonger's greedy "
                "blob sharing (objects laid end to end); `greedy_by_size`: TFLite's offsets; `auto`: mpplan's "
                "assignment (all three after the same auto schedule, 64-byte alignment); `lower bound`: static + "
                "LOAD, which no assignment of that schedule beats.  The Checkmate graphs have no tensors to execute, "
                "so they have no eager row."
            ),
            table(["model", "ops", "static", "grads", "lower bound", *ASSIGNERS],
                  [r.assigners for r in results] + [row for row, _ in graphs]),
            assigner_note(found),
        ]
    )


def main() -> None:
    section_main("peak", section, __doc__)


if __name__ == "__main__":
    main()

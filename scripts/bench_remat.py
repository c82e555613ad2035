"""Remat benchmark: budgets on the Checkmate graphs, the rules (mirror, sqrt), sqrt(n) on chains,
and remat plans of captured models executed for measured memory and step time.

Rerun: ``python scripts/bench_remat.py`` (``--time-limit S`` caps each exact solve,
default 60 s; ``--quick`` skips the 500- and 1000-op random graphs and GPT-2 small;
``--layered`` prints the budget rows of the random layered graphs alone, docs untouched).
Writes the ``remat`` section of docs/benchmarks.md.

Budgets are fractions of the no-remat peak (``static + LOAD`` of the graph's
node-id order); every peak is that of the rewritten graph's own as-given order
(recomputes right before their first late reader), by ``mpplan.sim``.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Any

from benchlib import SHARED_DATA, TorchCase, human, log, rerun, stamp, table, torch_case, torch_threads, write_section

from mpplan import sim
from mpplan.capture.graph_file import load_graph
from mpplan.capture.synthetic import chain
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph
from mpplan.passes.remat import ilp as remat_ilp
from mpplan.passes.remat import RematResult, build_model, remat
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.runtime import Measurement, evaluate_program
from mpplan.runtime.scratch import plan_with_scratch

BUDGETS = (0.9, 0.8)
GRAPH_SECONDS = 180.0
EXECUTOR_STEPS = 3
ACTIVATION_TARGET = 2.0  # activation memory at least this many times lower than without remat ...
TIME_TARGET = 1.25  # ... for at most this step time relative to it
SCRATCH_ROUNDS = 4  # budget_plan: replans that lower the planner's budget by the scratch over it


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
        baseline = sim.given_peak(graph)
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


def executor_cases(quick: bool) -> list[tuple[str, tuple[str, ...]]]:
    """(config, overrides) of the models executed with remat: the zoo GPT, and GPT-2 small in a full run.

    GPT-2 small runs at its config's 4x512: at 1x256 its dropout masks and logits gradient,
    which no recompute removes, cap the saving at about 1.5x of the activation memory.
    """
    cases: list[tuple[str, tuple[str, ...]]] = [("zoo_gpt", ("workload.batch=32",))]
    if not quick:
        cases.append(("gpt2_small", ()))
    return cases


@dataclass(frozen=True)
class RematRun:
    """One remat policy planned for one device and executed in arena mode on a virtual device."""

    label: str
    plan: Plan
    measurement: Measurement

    @property
    def peak(self) -> int:
        return self.measurement.devices[0].measured_peak_bytes

    @property
    def activation(self) -> int:
        """Measured dynamic memory: the peak less the static bytes (params, grads, optimizer state, inputs)."""
        return self.peak - self.measurement.devices[0].static_bytes

    @property
    def step_s(self) -> float:
        """The fastest timed step: the least disturbed by whatever else the machine runs."""
        return min(self.measurement.step_times_s)


def halved_budget(base: Plan) -> int:
    """The per-device budget that halves the dynamic part of ``base``'s peak."""
    device = base.devices[0]
    return device.static_bytes + (device.peak_bytes - device.static_bytes) // 2


def budget_plan(case: TorchCase, budget: int) -> tuple[str, Plan]:
    """(label, plan) for a ``budget`` of bytes, or for the smallest feasible budget when it is infeasible.

    The budget bounds what the device holds when the plan runs in arena mode: the plan's
    peak plus the scratch some ops hold outside the arena (``plan_with_scratch``), which the
    planner does not see; so while the two exceed the budget, the planner's budget is
    lowered by the excess, and at least to the budget less that scratch (at most
    ``SCRATCH_ROUNDS`` times).
    """
    aim = budget
    for _ in range(SCRATCH_ROUNDS):
        try:
            planned = plan(case.program.graph, [case.device], PlannerSettings(remat="budget", remat_budget=aim))
        except InfeasibleError as exc:
            smallest = aim + exc.missing_bytes
            log(f"  budget {human(aim)} infeasible: {exc}")
            planned = plan(case.program.graph, [case.device], PlannerSettings(remat="budget", remat_budget=smallest))
            return f"budget {human(smallest)} (half, {human(budget)}, is infeasible: the smallest found)", planned
        device = plan_with_scratch(case.program, planned, "virtual").devices[0]
        log(f"  budget {human(budget)}: planner budget {aim:,} B, planned with scratch {device.peak_bytes:,} B")
        if device.peak_bytes <= budget:
            break
        aim = min(aim - (device.peak_bytes - budget), budget - device.scratch_bytes)
    return f"budget {human(budget)} (half the activation memory)", planned


def run_policies(case: TorchCase) -> list[RematRun]:
    """No remat, sqrt(n) and the halving budget, each planned then executed."""
    graph, devices = case.program.graph, [case.device]
    none = plan(graph, devices, PlannerSettings())
    sqrt = plan(graph, devices, PlannerSettings(remat="sqrt"))
    plans = [("none", none), ("sqrt", sqrt), budget_plan(case, halved_budget(none))]
    runs = []
    for label, planned in plans:
        measurement = evaluate_program(
            case.program, planned, case.model, case.inputs, steps=EXECUTOR_STEPS, warmup=1, devices="virtual",
            eager=False,
        )
        measured = human(measurement.devices[0].measured_peak_bytes)
        log(f"  {label}: measured {measured}, steps {measurement.step_times_s}")
        runs.append(RematRun(label, planned, measurement))
    return runs


def executor_rows(case: TorchCase) -> list[list[object]]:
    runs = run_policies(case)
    base = runs[0]
    rows = []
    for run in runs:
        device = run.measurement.devices[0]
        lower = base.activation / run.activation if run.activation else float("inf")
        slower = run.step_s / base.step_s
        met = "-" if run is base else ("yes" if lower >= ACTIVATION_TARGET and slower <= TIME_TARGET else "**no**")
        rows.append([
            case.label, run.label, human(device.predicted_peak_bytes), human(run.peak), human(device.static_bytes),
            human(run.activation), "-" if run is base else f"{lower:.2f}x lower", f"{run.step_s:.3f}",
            "-" if run is base else f"{100 * (slower - 1):+.0f}%", f"{100 * run.plan.compute_overhead:.1f}%", met,
        ])
    return rows


#: (label, PlannerSettings fields) of the settings the halving budget is planned with (``settings_rows``).
SETTINGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("default (schedule auto, solver auto)", {}),
    ("schedule as_given", {"schedule": "as_given"}),
    ("solver heuristic", {"remat_solver": "heuristic"}),
    ("solver exact (HiGHS, 60 s)", {"remat_solver": "exact", "remat_time_limit_s": 60.0}),
)


def settings_rows(case: TorchCase) -> list[list[object]]:
    """The halving budget planned (not executed) under each of ``SETTINGS``: the planned
    peak, the dynamic memory against the no-remat plan's, the predicted compute overhead,
    which order decided the recomputes and which solver, and the planning seconds."""
    graph, devices = case.program.graph, [case.device]
    none = plan(graph, devices, PlannerSettings())
    budget = halved_budget(none)
    dynamic = none.devices[0].peak_bytes - none.devices[0].static_bytes
    rows: list[list[object]] = []
    for label, fields in SETTINGS:
        clock = time.perf_counter()
        planned = plan(graph, devices, PlannerSettings(remat="budget", remat_budget=budget, **fields))
        seconds = time.perf_counter() - clock
        device = planned.devices[0]
        assert device.peak_bytes <= budget, f"{label}: planned {device.peak_bytes} over the budget {budget}"
        chosen = planned.settings.get("remat_chosen", {})
        lower = dynamic / max(1, device.peak_bytes - device.static_bytes)
        rows.append([case.label, label, human(budget), human(device.peak_bytes), f"{lower:.3f}x lower",
                     f"{100 * planned.compute_overhead:.3f}%", chosen.get("order", "-"), chosen.get("solver", "-"),
                     chosen.get("note", "") or "-", f"{seconds:.1f}"])
        log(f"  {label}: {rows[-1]}")
    return rows


def settings_table(cases: list[TorchCase]) -> list[str]:
    """The halving budget of each case under each of ``SETTINGS``, planned only."""
    rows = [row for case in cases for row in settings_rows(case)]
    return [
        "### Planned only: the halving budget under each planner setting",
        (
            "The budget of the table above (half the no-remat plan's dynamic memory), planned with each setting "
            "and not executed: planned peak (<= the budget on every row), dynamic memory against the no-remat "
            "plan's, the predicted compute overhead, which order decided the recomputes, the solver and the "
            "planning seconds.  The remat pass's second round of recomputes (`rounds`) applies only to graphs "
            "without a backward pass, so it does not change a training step."
        ),
        table(["model", "setting", "budget", "planned peak", "dynamic vs none", "compute overhead", "decided in",
               "solver", "note", "s"], rows),
    ]


def executor_tables(quick: bool) -> list[str]:
    rows, cases = [], []
    with torch_threads(1):
        for config, overrides in executor_cases(quick):
            cases.append(torch_case(config, overrides))
            rows += executor_rows(cases[-1])
    return [
        "### Executed: activation memory against step time (one device, arena mode, virtual devices)",
        (
            "Each training step (Adam) is captured, planned with remat none, sqrt(n) and a budget that halves "
            "the no-remat plan's dynamic memory, then executed op by op by `mpplan.runtime.evaluate_program` "
            "in arena mode on a virtual device (CPU memory, every storage accounted): the measured peak is "
            "exact there.  Activation = measured peak - static (params, grads, Adam state, inputs).  Step time: "
            f"the fastest of {EXECUTOR_STEPS} timed steps after one warm-up, one torch thread (on a CPU, "
            "so recomputation costs what it would on a GPU only roughly).  Compute overhead: the planner's "
            "predicted added op "
            f"cost.  Target: activation memory >= {ACTIVATION_TARGET:g}x lower with <= "
            f"{100 * (TIME_TARGET - 1):.0f}% more step time."
        ),
        table(
            ["model", "policy", "planned peak", "measured peak", "static", "activation", "vs none",
             "step s", "vs none", "compute overhead", "target met"],
            rows,
        ),
        *settings_table(cases),
    ]


BUDGET_HEADERS = ["graph", "ops", "recomputable", "budget",
                  "heuristic peak", "overhead", "s", "exact peak", "overhead", "s", "gap"]


def graph_budget_rows(name: str, graph: Graph, candidates: int,
                      time_limit: float) -> tuple[list[list[object]], float]:
    """The budget table's rows of one graph (heuristic and exact at each of ``BUDGETS``) and their seconds."""
    rows: list[list[object]] = []
    seconds = 0.0
    for fraction in BUDGETS:
        heuristic, s1 = budget_cell(graph, fraction, "heuristic", time_limit)
        exact, s2 = budget_cell(graph, fraction, "exact", time_limit)
        seconds += s1 + s2
        rows.append([name, len(graph.ops), candidates, fraction, *heuristic, *exact])
        log(f"  {fraction}: heuristic {heuristic}, exact {exact}")
    return rows, seconds


def checkmate_tables(quick: bool, time_limit: float) -> list[str]:
    """The budget, rule and chain tables (the planner's remat pass alone, by the simulator)."""
    backend = remat_ilp.available_backend() or "none (exact = heuristic)"
    budget_rows, rule_rows, slowest = [], [], 0.0
    for name, graph in graphs(quick):
        model = build_model(graph)
        log(f"remat: {name}: {len(graph.ops)} ops, {model.num_candidates} recomputable")
        rows, graph_seconds = graph_budget_rows(name, graph, model.num_candidates, time_limit)
        budget_rows += rows
        if "train" in name:
            rule_rows.append([name, *rule_cells(graph)])
        slowest = max(slowest, graph_seconds)
        assert graph_seconds < GRAPH_SECONDS, f"{name} took {graph_seconds:.0f}s"
    chain_rows, exponent, note = sqrt_fit()
    return [
        "### Budgets on the Checkmate graphs (fraction of the no-remat peak of the node-id order); "
        f"MILP backend: {backend}",
        (
            "Peak / baseline of the rewritten graph's as-given order (fits: <= the budget), compute "
            "overhead (added op cost / total op cost), seconds; for the exact solver (MILP, "
            f"{time_limit:.0f}s limit, warm-started by the heuristic) also the optimality gap.  "
            "Training graphs recompute forward activations for the backward pass; the random layered "
            "graphs have no backward, so a tensor is recomputed for the uses after its longest idle gap.  "
            "`infeasible: min = x` is the smallest feasible budget (proved by the MILP), "
            "`min <= x` the smallest found."
        ),
        table(BUDGET_HEADERS, budget_rows),
        f"Slowest graph (all four runs): {slowest:.0f}s.",
        "### Rules on the training graphs: mirror (MXNet's threshold search) and sqrt(n) checkpoints",
        table(["graph", "mirror peak", "overhead", "threshold", "s", "sqrt peak", "overhead", "s"], rule_rows),
        "### sqrt(n) on training chains (`synthetic.chain(n, train=True, batch=256, width=4)`)",
        "LOAD in activations (one layer's output), without and with sqrt checkpoints.",
        table(["layers n", "no remat", "sqrt", "2 sqrt(n) - 1", "overhead"], chain_rows),
        f"{note}; LOAD grows as n^{exponent:.2f} (least squares over n = 16..400).",
    ]


def section(quick: bool, time_limit: float = 60.0) -> str:
    command = rerun("bench_remat.py", quick) + (f" --time-limit {time_limit:g}" if time_limit != 60.0 else "")
    return "\n\n".join(
        ["## Remat: recomputation under a memory budget", stamp(command),
         *checkmate_tables(quick, time_limit), *executor_tables(quick)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the 500- and 1000-op graphs and GPT-2 small")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact solve")
    parser.add_argument("--layered", action="store_true",
                        help="print the budget rows of the random layered graphs only (docs untouched)")
    args = parser.parse_args()
    if args.layered:
        rows = [row for name, graph in graphs(args.quick) if "train" not in name
                for row in graph_budget_rows(name, graph, build_model(graph).num_candidates, args.time_limit)[0]]
        print(table(BUDGET_HEADERS, rows))
        return
    write_section("remat", section(args.quick, args.time_limit))
    log("wrote the remat section of docs/benchmarks.md")


if __name__ == "__main__":
    main()

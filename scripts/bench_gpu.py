"""Plans executed for real: predicted against measured peak, against eager, step times and numerics.

Rerun: ``python scripts/bench_gpu.py`` (``--quick``: GPT-2 small at reduced shapes).
Writes the ``gpu`` section of docs/benchmarks.md.

On a machine with a CUDA GPU every model is traced for it and runs there: measured
is ``torch.cuda.max_memory_allocated`` over the timed steps (less what the GPU held
before), eager likewise.  Without one it runs on a virtual device (CPU memory,
every storage counted by the runtime's meter, results computed outside the arena
included), and the section says so.  For every zoo model and GPT-2 small, with
``planner.grads`` static and dynamic, and with the arena on and off:

* predicted: in arena mode the plan's own peak (``plan_with_scratch``): static + the
  most its arena blocks (each held while its buffers live; results an op without an
  ``out=`` overload computes kept as blocks of their own) and the running op's
  scratch hold at one step; no arena: static + LOAD, every tensor its own allocation;
* measured, the error, and eager PyTorch's measured peak at the same batch;
* the median step time, planned and eager, and whether the numerics match eager.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

import torch
from benchlib import human, load_average, log, rerun, section_main, stamp, table, torch_case, write_section

from mpplan.planner import PlannerSettings, plan
from mpplan.runtime import cuda_available, evaluate_program
from mpplan.runtime.measure import Measurement
from mpplan.runtime.scratch import plan_with_scratch
from mpplan.runtime.trace import capture_for

#: (label, config, overrides); GPT-2 small at its config's 4x512 and at 8x512.
CASES = (
    ("zoo_mlp", "zoo_mlp", ()),
    ("zoo_resnet", "zoo_resnet", ()),
    ("zoo_gpt", "zoo_gpt", ()),
    ("zoo_convattn", "zoo_convattn", ()),
    ("GPT-2 small 4x512", "gpt2_small", ("workload.batch=4", "workload.seq=512")),
    ("GPT-2 small 8x512", "gpt2_small", ("workload.batch=8", "workload.seq=512")),
)
#: On CPU, two busy cores take minutes per GPT-2 step at 4x512: the quick run shrinks the sequence.
QUICK = {
    "GPT-2 small 4x512": ("GPT-2 small 1x128", ("workload.batch=1", "workload.seq=128")),
    "GPT-2 small 8x512": ("GPT-2 small 2x128", ("workload.batch=2", "workload.seq=128")),
}
HEADERS = ("model", "grads", "arena", "predicted", "measured", "error", "scratch", "eager", "planned / eager",
           "step planned", "step eager", "numerics")


@dataclass(frozen=True)
class Row:
    """One (model, grads, arena) run."""

    cells: list[object]
    error_pct: float
    planned: int
    eager: int


def run_case(label: str, config: str, overrides: tuple[str, ...], device: torch.device, steps: int) -> list[Row]:
    """Every grads mode and arena mode of one model on ``device``."""
    case = torch_case(config, overrides)
    spec = case.config.model.torch
    assert spec is not None
    program = case.program if device.type == "cpu" else capture_for(
        case.model, case.inputs, device, mode=spec.mode, optimizer=None if spec.optimizer == "none" else spec.optimizer,
        loss_fn=None,
    )
    devices = "virtual" if device.type == "cpu" else [str(device)]
    base = PlannerSettings.from_config(case.config.planner)
    rows = []
    for grads in ("static", "dynamic"):
        planned = plan(program.graph, [case.device], dataclasses.replace(base, placement="single", grads=grads))
        planned = plan_with_scratch(program, planned, devices)
        for arena in (True, False):
            m = evaluate_program(program, planned, case.model, case.inputs, steps=steps, warmup=1, arena=arena,
                                 devices=devices, eager=True)
            rows.append(row(label, grads, arena, m))
            log(f"  {label} grads={grads} arena={arena}: {rows[-1].cells}")
    return rows


def row(label: str, grads: str, arena: bool, m: Measurement) -> Row:
    """The table row of one measurement."""
    (d,) = m.devices
    assert m.eager is not None and m.numerics is not None
    eager = m.eager.devices[0].measured_peak_bytes
    numerics = "ok" + (" (bitwise)" if m.numerics.bitwise else "") if m.numerics.ok else \
        f"**MISMATCH** at {m.numerics.first_bad_op} ({m.numerics.max_abs_diff:.2g})"
    cells: list[object] = [
        label, grads, "on" if arena else "off", human(d.predicted_peak_bytes), human(d.measured_peak_bytes),
        f"{d.error_pct:+.2f}%", human(d.scratch_bytes) if arena else "-", human(eager),
        f"{d.measured_peak_bytes / eager:.3f}", f"{m.step_time_s * 1e3:.1f} ms", f"{m.eager.step_time_s * 1e3:.1f} ms",
        numerics,
    ]
    return Row(cells, d.error_pct, d.measured_peak_bytes, eager)


def build(quick: bool) -> str:
    device = torch.device("cuda:0") if cuda_available() else torch.device("cpu")
    steps = 3 if device.type == "cuda" else 1
    rows: list[Row] = []
    for done, (label, config, overrides) in enumerate(CASES):
        if quick and device.type == "cpu" and label in QUICK:
            label, overrides = QUICK[label]
        log(f"gpu: {label} on {device}")
        rows += run_case(label, config, overrides, device, steps)
        if done + 1 < len(CASES):  # a long run cut short still leaves the models it measured
            write_section("gpu", section(rows, device, steps, quick, f"{done + 1} of {len(CASES)} models so far"))
    return section(rows, device, steps, quick, None)


def scratch_note(rows: list[Row]) -> str:
    """Where the arena-mode plan (default dynamic grads) needs more than eager, and the same plan without an arena."""
    on = {r.cells[0]: r for r in rows if r.cells[1] == "dynamic" and r.cells[2] == "on"}
    off = {r.cells[0]: r for r in rows if r.cells[1] == "dynamic" and r.cells[2] == "off"}
    above = [m for m, r in on.items() if r.planned > r.eager]
    if not above:
        return "With dynamic gradients (the default) the arena-mode plan needs no more than eager on every model."
    bare = [m for m in above if m in off and off[m].planned <= off[m].eager]
    return (
        "With dynamic gradients (the default) the arena-mode plan needs more than eager on "
        + ", ".join(f"{m} (scratch {on[m].cells[6]})" for m in above)
        + ": the blocks held at the peak and the scratch of results copied in exceed eager's live memory; "
        + (f"without an arena the same plan needs no more than eager on {', '.join(bare)}." if bare else
           "without an arena it needs more too.")
    )


def section(rows: list[Row], device: torch.device, steps: int, quick: bool, partial: str | None) -> str:
    """The section's markdown for ``rows``; ``partial`` says how far an unfinished run got."""
    where = (f"one GPU, {torch.cuda.get_device_name(0)}" if device.type == "cuda" else
             "a virtual device (no GPU here: CPU memory, every storage counted, transients included)")
    arena_errors = [abs(r.error_pct) for r in rows if r.cells[2] == "on"]
    below = sum(r.planned <= r.eager for r in rows)
    shapes = ("GPT-2 small at reduced shapes (1x128 and 2x128 instead of 4x512 and 8x512: a CPU step at "
              "4x512 takes minutes on this shared machine)" if quick and device.type == "cpu" else
              "GPT-2 small at 4x512 and 8x512")
    return "\n\n".join([
        "## Plans executed: predicted, measured and eager",
        stamp(rerun("bench_gpu.py", quick)) + (f" **Unfinished: {partial}.**" if partial else ""),
        f"Device: {where}; torch {torch.__version__}; {steps} timed step(s) after 1 warm-up; {shapes}.  "
        "Predicted in arena mode is the plan's own peak (`plan.json`): static + the most the arena's blocks "
        "(`blocks`, each allocated at its first buffer's step and freed after its last's; a result an op with no "
        "`out=` overload computes, as attention, layer and batch norm and convolution do, kept as a block of its "
        "own) and the running op's `scratch` (a result still copied in) hold at one step; without the arena it is "
        "static + LOAD.  "
        + ("Measured is the CUDA allocator's `max_memory_allocated` over the timed steps, above what the GPU held "
           "before (cuBLAS's workspaces included there).  With the arena and without, the prediction also holds, "
           "at each op's step, the workspace its kernels took in the warm-up step (cuDNN's convolutions, the "
           "efficient-attention backward, multi-block reductions: memory no traced value shows; "
           "`runtime/workspace.py`), and counts each allocation (a static storage, a block, the arena, without "
           "the arena each storage) rounded up to 512 bytes, as the allocator does (`runtime/allocation.py`)."
           if device.type == "cuda" else
           "Measured on a virtual device counts every storage alive at once, transients included, as the CUDA "
           "allocator does."),
        table(HEADERS, [r.cells for r in rows]),
        f"Arena mode: measured within {max(arena_errors):.2f}% of predicted on every row "
        f"(median {statistics.median(arena_errors):.2f}%).  The measured plan needs no more than eager on "
        f"{below} of {len(rows)} rows.  "
        + scratch_note(rows)
        + f"  Step times come from {steps} timed step(s) on a machine shared with other jobs (load average "
        f"{load_average():.1f} when this was written): on a CPU they vary several-fold from run to run and compare "
        "nothing."
        + ("  No GPU here: the CUDA rows (allocator-measured, GPT-2 small at 4x512 and 8x512) wait for a "
           "GPU machine, where `python scripts/bench_gpu.py` replaces this section." if device.type == "cpu" else ""),
    ])


if __name__ == "__main__":
    section_main("gpu", build, __doc__)

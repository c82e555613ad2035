"""``mpplan run`` as a function: plan a config, execute the plan for real, measure it against eager PyTorch.

``run_into_folder`` writes ``plan.json``, ``measurement.json``, the timeline, the baselines
and the report; ``measurement_text`` is what the command prints of the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpplan.config import Config
from mpplan.outputs import output_folder
from mpplan.plan import Plan, save_plan, write_json_atomic
from mpplan.units import format_size
from mpplan.workflows.plan import write_plan_report


@dataclass(frozen=True)
class RunOutcome:
    """What ``run_into_folder`` measured (``measurement``: ``measurement.json``'s mapping) and wrote."""

    plan: Plan
    measurement: dict[str, Any]
    out: Path
    report: Path

    @property
    def exit_code(self) -> int:
        """0 unless the planned run's numerics differ from eager PyTorch's (1)."""
        return 0 if (self.measurement.get("numerics") or {}).get("ok", True) else 1


def run_into_folder(config: Config, out: str | None = None, *, arena: bool = True, steps: int = 3,
                    warmup: int = 1) -> RunOutcome:
    """Plan and execute ``config``'s torch model; write the results into ``out`` (default: ``<output.dir>/run``)."""
    from mpplan.runtime import run_config

    folder = output_folder("run", out, config.output.dir)
    result = run_config(config, arena=arena, steps=steps, warmup=warmup)
    save_plan(result.plan, folder / "plan.json")
    data = result.measurement.to_dict()
    write_json_atomic(data, folder / "measurement.json")
    baselines = {"planned peak (max over devices)": result.plan.max_peak_bytes}
    eager_peaks = [d["measured_peak_bytes"] for d in (data.get("eager") or {}).get("devices", [])]
    if eager_peaks:
        baselines["eager PyTorch, measured (max over devices)"] = max(eager_peaks)
    # the graph traced for the device it ran on: a CPU capture has other ops on a GPU
    report = write_plan_report(result.graph, result.plan, folder, baselines, measurement=data)
    return RunOutcome(result.plan, data, folder, report)


def measurement_text(data: dict[str, Any]) -> str:
    """The lines ``mpplan run`` prints of a measurement: peaks per device, eager's, step time, numerics."""
    from mpplan.report import format_table

    rows = [
        (d["name"], format_size(d["predicted_peak_bytes"]), format_size(d["measured_peak_bytes"]),
         f"{d['error_pct']:+.2f}%")
        for d in data["devices"]
    ]
    lines = [format_table(("device", "predicted peak", "measured peak", "error"), rows)]
    lines += [allocator_line(d) for d in data["devices"] if d.get("allocator_peak_bytes") is not None]
    eager = data.get("eager") or {}
    for d in eager.get("devices", []):
        lines.append(f"eager PyTorch on {d['name']}: measured peak {format_size(d['measured_peak_bytes'])}")
        if d.get("allocator_peak_bytes") is not None:
            lines.append(allocator_line(d))
    lines.append(f"step time {data['step_time_s']:.4f} s (eager {eager.get('step_time_s', float('nan')):.4f} s)")
    numerics = data.get("numerics") or {}
    lines.append(f"numerics: {'ok' if numerics.get('ok') else 'MISMATCH at ' + str(numerics.get('first_bad_op'))}"
                 f" (max abs diff {numerics.get('max_abs_diff')})")
    return "\n".join(lines)


def allocator_line(d: dict[str, Any]) -> str:
    """How a GPU's measured peak came about: which number it is, the raw allocator peaks, the base.

    ``d`` is one device of ``measurement.json`` (or of its ``eager`` part).
    """
    shared = d.get("shared_with") or ()
    how = (f"tracked live bytes, the GPU is shared with {', '.join(shared)}" if shared
           else "max_memory_allocated - base")
    line = (f"  {d['name']} on {d.get('torch_device', d['name'])}: measured = {how}; raw allocator peak "
            f"{format_size(d['allocator_peak_bytes'])}, base {format_size(d.get('allocator_base_bytes') or 0)}, "
            f"requested above base {format_size(d.get('requested_peak_bytes') or 0)}, raw reserved peak "
            f"{format_size(d.get('reserved_peak_bytes') or 0)}")
    if d.get("transient_peak_bytes"):
        line += f", computed outside the arena {format_size(d['transient_peak_bytes'])}"
    return line

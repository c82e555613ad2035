"""Tables users read: plain-text rendering of plans and graph summaries."""

from __future__ import annotations

from typing import Sequence

from mpplan.plan import Plan
from mpplan.summary import GraphSummary
from mpplan.units import format_size


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned first column, right-aligned numbers, one space of padding."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def summary_text(summary: GraphSummary) -> str:
    rows = [
        ("ops", summary.ops),
        ("tensors", summary.tensors),
        ("static bytes", _bytes(summary.static_bytes)),
        ("dynamic bytes (sum)", _bytes(summary.dynamic_bytes)),
        ("largest op working set", _bytes(summary.max_op_working_set_bytes)),
        ("as-given peak (free at last use)", _bytes(summary.as_given_peak_bytes)),
    ]
    rows += [(f"  {kind}", _bytes(n)) for kind, n in summary.bytes_by_kind.items()]
    return f"graph {summary.name} ({summary.hash})\n" + format_table(("", "value"), rows)


def plan_text(plan: Plan, baselines: dict[str, int]) -> str:
    """Per-device table, cross-device traffic, and the one-device baselines that show
    what reordering and sharing bought."""
    copies_in = {d.name: 0 for d in plan.devices}
    for c in plan.copies:
        copies_in[c.dst] += c.bytes
    rows = [
        (
            d.name,
            _bytes(d.static_bytes),
            _bytes(d.arena_bytes),
            _bytes(copies_in[d.name]),
            _bytes(d.peak_bytes),
            _bytes(d.lower_bound_bytes),
            _bytes(d.capacity_bytes),
            f"{100 * d.peak_bytes / d.capacity_bytes:.1f}%" if d.capacity_bytes else "-",
        )
        for d in plan.devices
    ]
    headers = ("device", "static", "activations (arena)", "copies in", "peak", "lower bound", "capacity", "used")
    table = format_table(headers, rows)
    placement = plan.settings.get("placement_chosen", "single")
    traffic = f"placement: {placement}; cross-device bytes per step: {_bytes(plan.cross_device_bytes)}"
    base = format_table(("baseline (one device)", "peak"), [(k, _bytes(v)) for k, v in baselines.items()])
    return f"{table}\n{traffic}\n\n{base}"


def _bytes(n: int) -> str:
    return f"{format_size(n)} ({n})"

"""What users read: terminal tables, and Markdown/HTML reports with PNG figures."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any, Sequence

from mpplan.plan import DevicePlan, Plan
from mpplan.search_status import Status
from mpplan.summary import GraphSummary
from mpplan.timeline import Timeline
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
    # The totals by kind are sums over every tensor of the step, not a breakdown of the peak:
    # their own table, so they do not read as one.
    kinds = [(kind, _bytes(n)) for kind, n in summary.bytes_by_kind.items()]
    return (
        f"graph {summary.name} ({summary.hash})\n"
        + format_table(("", "value"), rows)
        + "\n\n"
        + format_table(("tensor kind", "bytes, all tensors of the step"), kinds)
    )


def plan_text(plan: Plan, baselines: dict[str, int]) -> str:
    """Per-device table, placement, traffic and recomputation, and the baselines that show
    what reordering, sharing and recomputing bought."""
    table = format_table(DEVICE_HEADERS, _device_rows(plan))
    base = format_table(("baseline", "peak"), [(k, _bytes(v)) for k, v in baselines.items()])
    return f"{table}\n" + "\n".join(_plan_facts(plan)) + f"\n\n{base}"


DEVICE_HEADERS = ("device", "static", "activations (arena)", "copies in", "peak", "lower bound", "capacity", "used")


def _device_rows(plan: Plan) -> list[tuple[str, ...]]:
    copies_in = {d.name: 0 for d in plan.devices}
    for c in plan.copies:
        copies_in[c.dst] += c.bytes
    return [
        (d.name, _bytes(d.static_bytes), _bytes(d.arena_bytes), _bytes(copies_in[d.name]), _bytes(d.peak_bytes),
         _bytes(d.lower_bound_bytes), _bytes(d.capacity_bytes),
         f"{100 * d.peak_bytes / d.capacity_bytes:.1f}%" if d.capacity_bytes else "-")
        for d in plan.devices
    ]


def _plan_facts(plan: Plan) -> list[str]:
    """One line each: placement and traffic; recomputation, when the plan recomputes."""
    placement = plan.settings.get("placement_chosen", "single")
    facts = [f"placement: {placement}; cross-device bytes per step: {_bytes(plan.cross_device_bytes)}"]
    used = sorted(set(plan.placement.values()))
    if placement == "shift" and len(used) == 1 and len(plan.devices) > 1:
        facts.append(
            f"shift moved no activation: everything stays on {used[0]}, since no single move lowered the "
            "worst device's peak (docs/concepts.md, Placements); pipeline uses every device"
        )
    if plan.remat:
        recomputed = sum(int(r.get("bytes", 0)) for r in plan.remat)
        facts.append(
            f"recomputation ({plan.settings.get('remat', {}).get('policy', '?')}): {len(plan.remat)} tensors, "
            f"{_bytes(recomputed)} made again in the backward pass; "
            f"compute overhead +{100 * plan.compute_overhead:.1f}%"
        )
    return facts


def _bytes(n: int) -> str:
    return f"{format_size(n)} ({n})"


def misfit_text(plan: Plan, budget: int | None = None) -> str:
    """Every device whose peak exceeds its capacity (or the remat ``budget``, when given), with by
    how much, in human sizes (``""`` when none does): the line a user reads to size the devices,
    the batch or the budget."""
    what = "its capacity" if budget is None else "the remat budget"
    return "; ".join(
        f"{d.name} needs {format_size(over)} ({over} bytes) more than {what} of {format_size(bound)} "
        f"(peak {format_size(d.peak_bytes)})"
        for d, bound, over in _over(plan, budget)
    )


def _over(plan: Plan, budget: int | None) -> list[tuple[DevicePlan, int, int]]:
    """(device, its bound, bytes over it) of each device whose peak exceeds its capacity or ``budget``."""
    bounds = [(d, d.capacity_bytes if budget is None else budget) for d in plan.devices]
    return [(d, bound, d.peak_bytes - bound) for d, bound in bounds if d.peak_bytes > bound]


def plan_outcome(plan: Plan, path: Path, report: Path, budget: int | None = None) -> str:
    """The summary line of ``mpplan plan``: whether it fits comes first, then where the plan went.
    ``budget``: the remat budget that no plan found fits (``plan`` is then the least peak found)."""
    misfits = misfit_text(plan, budget)
    if not misfits:
        return f"plan written to {path} (verified); report: {report}"
    what = "" if budget is None else " the remat budget"
    return (
        f"does not fit{what} on {len(_over(plan, budget))} of {len(plan.devices)} device(s): {misfits}\n"
        f"the best plan found (verified, capacities aside) is written to {path}; report: {report}"
    )


# --- written reports -------------------------------------------------------------------------


def write_report(
    out: Path,
    plan: Plan,
    *,
    timeline: Timeline | None = None,
    measurement: dict[str, Any] | None = None,
    results: Sequence[dict[str, Any]] | None = None,
    baselines: dict[str, int] | None = None,
    html: bool = False,
    figures: bool = True,
) -> Path:
    """Write ``report.md`` (and ``report.html``) with PNG figures into ``out``; return the Markdown path.

    ``figures=False`` writes the tables only, and says how to draw the figures (``mpplan plan``:
    drawing a 100k-step timeline costs more than planning it, for a picture nobody asked for yet).
    """
    from mpplan import figures as draw
    from mpplan.durable import write_text

    out.mkdir(parents=True, exist_ok=True)
    measured = {d["name"]: d["measured_peak_bytes"] for d in (measurement or {}).get("devices", [])}
    sections = [f"# mpplan report: {plan.graph_name}", _plan_markdown(plan)]
    images: list[tuple[str, str]] = []
    if figures:
        if timeline is not None:
            draw.memory_timeline(timeline, out / "memory_timeline.png", measured or None)
            images.append(("Memory over the schedule", "memory_timeline.png"))
        draw.device_bars(plan, out / "devices.png", measured or None)
        images.append(("Memory per device", "devices.png"))
    else:
        sections.append(
            f"Figures (memory over the schedule, memory per device): `mpplan report {out}` draws them here; "
            "`--html` adds a web page."
        )
    if baselines:
        peaks = [(k, _bytes(v)) for k, v in baselines.items()]
        sections.append("## Baselines\n\n" + _md_table(("baseline", "peak"), peaks))
    if measurement:
        sections.append(_measurement_markdown(measurement))
    if results:
        rows = candidate_rows(results)
        if figures:
            draw.candidates(rows, out / "candidates.png")
            images.append(("Search candidates: memory against step time", "candidates.png"))
        sections.append(_results_markdown(rows))
    sections += [f"## {title}\n\n![{title}]({name})" for title, name in images]
    text = "\n\n".join(sections) + "\n"
    path = write_text(out / "report.md", text)
    if html:
        write_text(out / "report.html", _html(text))
    return path


def _plan_markdown(plan: Plan) -> str:
    table = _md_table(DEVICE_HEADERS, _device_rows(plan))
    lines = [f"Graph hash `{plan.graph_hash}`, {len(plan.schedule)} steps, "
             f"predicted peak {_bytes(plan.max_peak_bytes)}."]
    lines += [fact[0].upper() + fact[1:] + "." for fact in _plan_facts(plan)]
    return "## Plan\n\n" + "\n\n".join(lines) + "\n\n" + table


def _measurement_markdown(m: dict[str, Any]) -> str:
    rows = [
        (d["name"], _bytes(d["predicted_peak_bytes"]), _bytes(d["measured_peak_bytes"]),
         f"{d.get('error_pct', 0.0):+.2f}%")
        for d in m.get("devices", [])
    ]
    eager = m.get("eager") or {}
    eager_rows = [(d["name"], _bytes(d["measured_peak_bytes"])) for d in eager.get("devices", [])]
    numerics = m.get("numerics") or {}
    text = "## Measured\n\n" + _md_table(("device", "predicted peak", "measured peak", "error"), rows)
    text += f"\n\nStep time {m.get('step_time_s', float('nan')):.4f} s"
    text += f" (eager {eager['step_time_s']:.4f} s)." if eager.get("step_time_s") is not None else "."
    if eager_rows:
        text += "\n\nEager PyTorch:\n\n" + _md_table(("device", "measured peak"), eager_rows)
    if not numerics:
        text += "\n\nNumerics: not checked (no eager run)."
        return text
    text += f"\n\nNumerics: {'ok' if numerics.get('ok') else 'MISMATCH'}, max abs diff {numerics.get('max_abs_diff')}"
    if numerics.get("first_bad_op"):
        text += f", first bad op `{numerics['first_bad_op']}`"
    return text


def candidate_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results.jsonl`` lines as report rows: key, status, peak (measured when measured, else predicted),
    whether it was measured, step time, and the settings the candidate overrode."""
    rows = []
    for r in results:
        measurement = r.get("measurement") or {}
        measured = [d["measured_peak_bytes"] for d in measurement.get("devices", [])
                    if d.get("measured_peak_bytes") is not None]
        predicted = (r.get("predicted") or {}).get("max_peak_bytes")
        rows.append(
            {
                "key": r.get("key", ""),
                "status": r.get("status", "?"),
                "peak_bytes": max(measured) if measured else predicted,
                "measured": bool(measured),
                "step_time_s": measurement.get("step_time_s"),
                "label": " ".join(f"{k}={v}" for k, v in sorted((r.get("overrides") or {}).items())),
            }
        )
    return rows


def _results_markdown(results: Sequence[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    rows = [
        (r["key"][:10], r["status"], _bytes(r["peak_bytes"]) if r["peak_bytes"] is not None else "-",
         "measured" if r["measured"] else "predicted",
         f"{r['step_time_s']:.4f}" if r["step_time_s"] is not None else "-", r["label"])
        for r in results
    ]
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
    headers = ("key", "status", "peak", "peak is", "step time (s)", "settings")
    meanings = {status.value: status.meaning for status in Status}
    legend = "; ".join(f"`{k}`: {meanings[k]}" for k in sorted(counts) if k in meanings)
    return f"## Search candidates ({summary})\n\n" + _md_table(headers, rows) + f"\n\n{legend} (docs/cluster.md)."


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _html(markdown: str) -> str:
    """A self-contained HTML rendering of the report's Markdown subset (headings, tables, images, text)."""
    body: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if table:
            head, *rest = [[c.strip() for c in row.strip("|").split("|")] for row in table if not set(row) <= set("|-")]
            cells = "".join(f"<th>{escape(c)}</th>" for c in head)
            rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rest)
            body.append(f"<table><tr>{cells}</tr>{rows}</table>")
            table.clear()

    for line in markdown.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{escape(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](", 1)
            body.append(f'<img alt="{escape(alt)}" src="{escape(src.rstrip(")"))}">')
        elif line.strip():
            body.append(f"<p>{escape(line)}</p>")
    flush()
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}img{max-width:100%}")
    head = f"<head><meta charset='utf-8'><title>mpplan report</title><style>{style}</style></head>"
    return f"<!doctype html><html>{head}<body>{''.join(body)}</body></html>\n"

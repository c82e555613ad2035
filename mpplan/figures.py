"""PNG figures for reports (matplotlib, headless Agg backend, imported on first use)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from mpplan.plan import Plan
from mpplan.timeline import Timeline

_GIB = 2**30


def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the headless Agg backend (reports render without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    """Render to memory, then write the PNG atomically: a killed report leaves no torn image."""
    import io

    from mpplan.durable import write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    write_bytes(path, buffer.getvalue())


def _unit(max_bytes: float) -> tuple[float, str]:
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if max_bytes >= scale:
            return scale, name
    return 1, "B"


def memory_timeline(timeline: Timeline, path: Path, measured: dict[str, int] | None = None) -> Path:
    """Per device: static, live activations and copies stacked over the schedule, with the
    planned peak (static + arena) and the capacity as lines, and the measured peak when known."""
    plt = _pyplot()
    count = len(timeline.devices)
    fig, axes = plt.subplots(count, 1, figsize=(10, 2.8 * count), squeeze=False, sharex=True)
    top = max(max(d.capacity_bytes, d.static_bytes + d.arena_bytes) for d in timeline.devices)
    scale, unit = _unit(top)
    for ax, dev in zip(axes[:, 0], timeline.devices):
        steps = busiest_steps(dev.activations, dev.copies)
        static = [dev.static_bytes / scale] * len(steps)
        acts = [dev.activations[k] / scale for k in steps]
        copies = [dev.copies[k] / scale for k in steps]
        ax.stackplot(steps, static, acts, copies, labels=("static", "activations", "copies in"),
                     colors=("#9aa5b1", "#3b82f6", "#f59e0b"), step="post")
        ax.axhline((dev.static_bytes + dev.arena_bytes) / scale, color="#111827", lw=1.2, ls="--",
                   label="planned peak (static + arena)")
        ax.axhline(dev.capacity_bytes / scale, color="#dc2626", lw=1.2, label="capacity")
        if measured and dev.name in measured:
            ax.axhline(measured[dev.name] / scale, color="#16a34a", lw=1.2, ls=":", label="measured peak")
        ax.set_title(f"{dev.name}")
        ax.set_ylabel(unit)
        ax.set_ylim(0, top / scale * 1.08)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel("schedule step")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


#: At most this many steps of a timeline are drawn: a figure is about 1000 pixels wide.
MAX_DRAWN_STEPS = 2000


def busiest_steps(activations: Sequence[int], copies: Sequence[int], limit: int = MAX_DRAWN_STEPS) -> list[int]:
    """The steps to draw: all of them, or, on longer schedules, the busiest step (most live
    bytes) of each of ``limit`` equal spans, so every peak is drawn at its true height.

    >>> busiest_steps([1, 5, 2, 2, 9, 1], [0, 0, 4, 0, 0, 0], limit=3)
    [1, 2, 4]
    """
    n = len(activations)
    if n <= limit:
        return list(range(n))
    bounds = [n * i // limit for i in range(limit + 1)]
    return [max(range(lo, hi), key=lambda k: activations[k] + copies[k]) for lo, hi in zip(bounds, bounds[1:])]


def device_bars(plan: Plan, path: Path, measured: dict[str, int] | None = None) -> Path:
    """Device-by-device bars: static, arena, capacity (and measured peak)."""
    plt = _pyplot()
    names = [d.name for d in plan.devices]
    top = max(max(d.capacity_bytes, d.peak_bytes) for d in plan.devices)
    scale, unit = _unit(top)
    fig, ax = plt.subplots(figsize=(max(4, 1.4 * len(names) + 2), 3.6))
    xs = range(len(names))
    static = [d.static_bytes / scale for d in plan.devices]
    arena = [d.arena_bytes / scale for d in plan.devices]
    ax.bar(xs, static, color="#9aa5b1", label="static")
    ax.bar(xs, arena, bottom=static, color="#3b82f6", label="arena")
    ax.scatter(xs, [d.capacity_bytes / scale for d in plan.devices], marker="_", s=900, color="#dc2626",
               label="capacity", zorder=3)
    if measured:
        ax.scatter(xs, [measured.get(n, 0) / scale for n in names], marker="o", color="#16a34a",
                   label="measured peak", zorder=4)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel(unit)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def candidates(results: Sequence[dict[str, Any]], path: Path) -> Path:
    """Search candidates (``report.candidate_rows``): measured ones as peak memory against step time,
    the Pareto front drawn; those never measured have no step time, so they get a panel of their own
    on the right, at their *predicted* peak, labelled as predictions."""
    plt = _pyplot()
    fig = _candidates_figure(plt, results)
    _save(fig, path)
    plt.close(fig)
    return path


def _candidates_figure(plt: Any, results: Sequence[dict[str, Any]]) -> Any:
    measured = [(r["peak_bytes"], r["step_time_s"]) for r in results if r["status"] == "ok" and r.get("measured", True)
                and r["peak_bytes"] is not None and r["step_time_s"] is not None]
    predicted = {
        "predicted to fit": [r["peak_bytes"] for r in results
                             if r["status"] == "predicted_fit" and r["peak_bytes"] is not None],
        "predicted misfit or failed": [r["peak_bytes"] for r in results if r["status"] not in ("ok", "predicted_fit")
                                       and r["peak_bytes"] is not None],
    }
    predicted = {label: peaks for label, peaks in predicted.items() if peaks}
    top = max([p for p, _ in measured] + [p for peaks in predicted.values() for p in peaks] + [1])
    scale, unit = _unit(top)
    if predicted:
        fig, (ax, side) = plt.subplots(1, 2, figsize=(8, 4.2), sharey=True, gridspec_kw={"width_ratios": [3, 1]})
    else:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
    if measured:
        ax.scatter([t for _, t in measured], [p / scale for p, _ in measured], color="#3b82f6", label="measured")
        front = pareto_front(measured)
        # ringed as well as joined: a front of one point (one candidate beats the rest on both) has no line
        ax.plot([t for _, t in front], [p / scale for p, _ in front], color="#111827", lw=1.2,
                drawstyle="steps-post", marker="o", markersize=10, markerfacecolor="none", label="Pareto front")
        ax.legend(fontsize=8)
    ax.set_title("measured", fontsize=9)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.grid(alpha=0.3)
    if predicted:
        styles = {"predicted to fit": {"marker": "o", "facecolors": "none", "edgecolors": "#6b7280"},
                  "predicted misfit or failed": {"marker": "x", "color": "#dc2626"}}
        for x, (label, peaks) in enumerate(predicted.items()):
            side.scatter([x] * len(peaks), [p / scale for p in peaks], label=label, **styles[label])
        side.set_xticks(range(len(predicted)), [label.replace(" ", "\n", 1) for label in predicted], fontsize=8)
        side.set_xlim(-0.6, len(predicted) - 0.4)
        side.set_title("not measured: predicted peak", fontsize=9)
        side.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def pareto_front(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """The (peak, time) points no other point beats in both, by increasing time."""
    front: list[tuple[int, float]] = []
    for peak, time in sorted(points, key=lambda p: (p[1], p[0])):
        if not front or peak < front[-1][0]:
            front.append((peak, time))
    return front

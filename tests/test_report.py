"""Reports: figures are real pictures (opened and checked not blank), tables carry the plan's numbers."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import chain
from mpplan.cli import main
from mpplan.config import Device
from mpplan.figures import busiest_steps, pareto_front
from mpplan.planner import PlannerSettings, plan
from mpplan.report import plan_text, write_report
from mpplan.search_status import Status
from mpplan.timeline import DeviceTimeline, Timeline, timeline

matplotlib = pytest.importorskip("matplotlib")


def assert_picture(path, min_size=(300, 200)):
    import matplotlib.image as mpimg

    assert path.is_file() and path.stat().st_size > 5_000
    pixels = mpimg.imread(path)
    height, width = pixels.shape[:2]
    assert width >= min_size[0] and height >= min_size[1]
    assert float(pixels[..., :3].std()) > 0.01, f"{path.name} is blank"


def test_timeline_matches_the_plan():
    graph = chain(20, nbytes=100)
    p = plan(graph, [Device("g0", 1 << 20), Device("g1", 1 << 20)], PlannerSettings(placement="pipeline", alignment=1))
    line = timeline(graph, p)
    assert len(line.steps) == len(p.schedule)
    for dev, dp in zip(line.devices, p.devices):
        live = max(a + c for a, c in zip(dev.activations, dev.copies))
        assert dp.static_bytes + live == dp.lower_bound_bytes
        assert sum(dev.copies) > 0 or not any(c.dst == dev.name for c in p.copies)
    assert Timeline.from_dict(json.loads(json.dumps(line.to_dict()))) == line
    assert set(line.to_dict()["devices"][0]) == {f.name for f in dataclasses.fields(DeviceTimeline)}


@pytest.mark.parametrize("knobs", [PlannerSettings(), PlannerSettings(remat="sqrt", grads="dynamic")])
def test_one_device_timeline_is_the_placed_graphs(knobs):
    from mpplan.capture.synthetic import synthetic_graph
    from mpplan.timeline import _placed_timeline

    graph = synthetic_graph("transformer", layers=2, train=True, batch=2, seq=16, hidden=16, heads=2, vocab=32)
    p = plan(graph, [Device("g0", 1 << 30)], knobs)
    assert p.remat or knobs.remat == "none"
    assert timeline(graph, p) == _placed_timeline(graph, p)
    assert max(timeline(graph, p).devices[0].activations) + p.devices[0].static_bytes == p.devices[0].lower_bound_bytes


def test_report_with_measurement_and_search_results(tmp_path):
    graph = chain(12, nbytes=1 << 20)
    p = plan(graph, [Device("g0", 64 << 20), Device("g1", 64 << 20)], PlannerSettings(placement="pipeline"))
    measurement = {
        "devices": [
            {"name": d.name, "predicted_peak_bytes": d.peak_bytes, "measured_peak_bytes": d.peak_bytes,
             "error_pct": 0.0}
            for d in p.devices
        ],
        "eager": {"devices": [{"name": "g0", "measured_peak_bytes": 20 << 20}], "step_time_s": 0.02},
        "step_time_s": 0.03,
        "numerics": {"ok": True, "max_abs_diff": 0.0, "first_bad_op": None},
    }
    def result(key: str, status: str, peak: int, seconds: float | None) -> dict:
        measured = {"devices": [{"name": "g0", "measured_peak_bytes": peak}], "step_time_s": seconds}
        return {"key": key, "status": status, "overrides": {"planner.schedule": key},
                "predicted": {"max_peak_bytes": peak}, "measurement": measured if seconds else None}

    results = [result("a", "ok", 10 << 20, 0.3), result("b", "ok", 8 << 20, 0.5), result("c", "ok", 12 << 20, 0.6),
               result("d", "predicted_misfit", 90 << 20, None), result("e", "predicted_fit", 11 << 20, None)]
    path = write_report(tmp_path, p, timeline=timeline(graph, p), measurement=measurement, results=results, html=True)
    text = path.read_text()
    assert "| g0 |" in text and "Measured" in text and "predicted_misfit: 1" in text
    assert "| a | ok | 10.00 MiB (10485760) | measured | 0.3000 | planner.schedule=a |" in text
    assert "| e | predicted_fit | 11.00 MiB (11534336) | predicted | - | planner.schedule=e |" in text
    # regression: the report named predicted_fit and predicted_misfit and said nowhere what they mean
    assert "`predicted_fit`: planned and predicted to fit, not measured (ranked below `top_k`" in text
    assert f"`predicted_misfit`: {Status.PREDICTED_MISFIT.meaning}" in text and "`oom`" not in text
    for name in ("memory_timeline.png", "devices.png", "candidates.png"):
        assert f"]({name})" in text
        assert_picture(tmp_path / name)
    html = (tmp_path / "report.html").read_text()
    assert "<table>" in html and 'src="memory_timeline.png"' in html


def test_candidates_figure_draws_no_prediction_at_a_step_time():
    # regression: unmeasured candidates sat at 1.05 x the slowest measured step time, a time nobody measured
    from mpplan.figures import _candidates_figure, _pyplot
    from mpplan.report import candidate_rows

    def result(key: str, status: str, peak: int, seconds: float | None) -> dict:
        measured = {"devices": [{"name": "g0", "measured_peak_bytes": peak}], "step_time_s": seconds}
        return {"key": key, "status": status, "predicted": {"max_peak_bytes": peak},
                "measurement": measured if seconds else None}

    rows = candidate_rows([result("a", "ok", 10 << 20, 0.3), result("b", "ok", 8 << 20, 0.5),
                           result("d", "predicted_misfit", 90 << 20, None),
                           result("e", "predicted_fit", 11 << 20, None),
                           result("f", "predicted_fit", 12 << 20, None)])
    plt = _pyplot()
    fig = _candidates_figure(plt, rows)
    timed, side = fig.axes
    (points,) = [c.get_offsets().tolist() for c in timed.collections]
    assert sorted(points) == [[0.3, 10.0], [0.5, 8.0]]  # measured only, at their measured time (MiB)
    assert side.get_title() == "not measured: predicted peak" and "step time" not in side.get_xlabel()
    drawn = {c.get_label(): sorted(y for _, y in c.get_offsets().tolist()) for c in side.collections}
    assert drawn == {"predicted to fit": [11.0, 12.0], "predicted misfit or failed": [90.0]}
    plt.close(fig)
    measured_only = _candidates_figure(plt, rows[:2])
    assert len(measured_only.axes) == 1
    plt.close(measured_only)
    # regression: when one candidate beats the others on both axes the front is one point, and the legend's
    # "Pareto front" named a line nobody could see (the quickstart's search)
    one = _candidates_figure(plt, candidate_rows([result("a", "ok", 8 << 20, 0.3), result("b", "ok", 10 << 20, 0.5)]))
    (front,) = [line for line in one.axes[0].get_lines() if line.get_label() == "Pareto front"]
    assert front.get_xydata().tolist() == [[0.3, 8.0]] and front.get_marker() not in ("", "None", None)
    plt.close(one)


def test_a_shift_that_moved_nothing_says_why_it_uses_one_device():
    graph = chain(6, nbytes=1 << 20)
    devices = [Device("g0", 64 << 20), Device("g1", 64 << 20)]
    kept = plan(graph, devices, PlannerSettings(placement="shift", shift_activations=()))
    assert set(kept.placement.values()) == {"g0"}
    text = plan_text(kept, {})
    assert "shift moved no activation: everything stays on g0" in text and "docs/concepts.md" in text
    moved = plan(graph, devices, PlannerSettings(placement="shift", shift_activations=("t2",)))
    assert set(moved.placement.values()) == {"g0", "g1"} and "shift moved no" not in plan_text(moved, {})
    assert "shift moved no" not in plan_text(plan(graph, devices, PlannerSettings(placement="pipeline")), {})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=300), st.integers(1, 50))
def test_a_long_timeline_is_drawn_at_its_peaks(acts, limit):
    copies = [a % 7 for a in acts]
    drawn = busiest_steps(acts, copies, limit=limit)
    total = [a + c for a, c in zip(acts, copies)]
    assert drawn == sorted(set(drawn)) and len(drawn) == min(len(acts), limit)
    assert max(total[k] for k in drawn) == max(total)


def test_pareto_front():
    points = [(10, 0.3), (8, 0.5), (12, 0.6), (5, 0.9), (9, 0.95)]
    assert pareto_front(points) == [(10, 0.3), (8, 0.5), (5, 0.9)]


def test_plan_writes_report_and_report_verb_rebuilds_it(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        textwrap.dedent(
            """
            model: {synthetic: {kind: chain, n: 30}}
            devices: [{count: 2, capacity: 1GiB}]
            planner: {placement: pipeline}
            """
        )
    )
    out = tmp_path / "out"
    assert main(["plan", str(config), "--out", str(out)]) == 0
    # plan writes the tables and the timeline's data; the figures are drawn when asked for
    assert not list(out.glob("*.png")) and (out / "timeline.json").is_file()
    assert f"`mpplan report {out}` draws them" in (out / "report.md").read_text()
    assert main(["report", str(out / "plan.json"), "--html"]) == 0
    assert_picture(out / "memory_timeline.png")
    assert_picture(out / "devices.png")
    markdown = (out / "report.md").read_text()
    assert "](memory_timeline.png)" in markdown and "draws them" not in markdown
    assert (out / "report.html").is_file()
    assert "report written to" in capsys.readouterr().out

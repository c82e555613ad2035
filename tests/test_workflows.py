"""The verbs as library functions (mpplan.workflows): what the CLI prints, returned as records."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, tiny
from mpplan.capture.graph_file import save_graph
from mpplan.config import load_config
from mpplan.errors import ConfigError, PlanError, VerificationError
from mpplan.plan import load_plan, save_plan
from mpplan.verify import verify
from mpplan.workflows import (
    allocator_line,
    graph_from_source,
    measurement_text,
    plan_into_folder,
    report_best,
    run_into_folder,
    verify_file,
    write_best_timeline,
)


def config_file(tmp_path, body: str, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def tiny_config(tmp_path):
    save_graph(tiny(), tmp_path / "tiny.yaml")
    return config_file(tmp_path, "model: {graph: {path: tiny.yaml}}\ndevices: [{name: gpu0, capacity: 1MiB}]\n")


def test_plan_into_folder_writes_a_verified_plan_its_timeline_baselines_and_report(tmp_path, tiny_config):
    outcome = plan_into_folder(load_config(tiny_config), str(tmp_path / "out"))
    assert outcome.exit_code == 0 and outcome.refused is None and outcome.oversized_op is None
    assert outcome.path == tmp_path / "out" / "plan.json" and outcome.report == tmp_path / "out" / "report.md"
    plan = load_plan(outcome.path)
    assert plan == outcome.plan
    verify(graph_from_source(tiny_config), plan)
    assert outcome.baselines["this plan"] == plan.max_peak_bytes
    assert json.loads((tmp_path / "out" / "baselines.json").read_text()) == outcome.baselines
    assert json.loads((tmp_path / "out" / "timeline.json").read_text())
    # the timeline a search writes beside its best plan is the same one, from the config
    (tmp_path / "out" / "timeline.json").unlink()
    write_best_timeline(load_config(tiny_config), {}, outcome.path)
    assert (tmp_path / "out" / "timeline.json").is_file()


def test_a_misfit_returns_exit_3_and_names_an_op_too_large_for_any_device(tmp_path, tiny_config):
    small = load_config(tiny_config, ["devices.0.capacity=40"])
    outcome = plan_into_folder(small, str(tmp_path / "out"))
    assert outcome.plan.misfits and outcome.exit_code == 3
    assert outcome.oversized_op == ("fc", 64)
    roomy = plan_into_folder(load_config(tiny_config, ["devices.0.capacity=64"]), str(tmp_path / "o2"))
    assert roomy.oversized_op is None


def test_an_infeasible_budget_is_returned_as_a_refusal_with_the_best_plan_written(tmp_path, tiny_config):
    config = load_config(tiny_config, ["planner.remat.policy=budget", "planner.remat.budget=1"])
    outcome = plan_into_folder(config, str(tmp_path / "out"))
    assert outcome.refused is not None and outcome.exit_code == 3
    assert load_plan(outcome.path) == outcome.plan
    # reported like any plan: the budget it misses, its report, timeline and baselines beside it
    assert outcome.budget == 1 and outcome.plan.max_peak_bytes > 1
    assert outcome.report is not None and outcome.report.is_file() and (tmp_path / "out" / "timeline.json").is_file()
    assert outcome.baselines["this plan"] == outcome.plan.max_peak_bytes


def test_a_plan_without_recomputation_never_imports_the_remat_package(tmp_path, tiny_config):
    """The remat package (0.08 CPU s to import) loads only for a plan that recomputes, or refuses
    a budget.  A fresh interpreter, so other tests' imports do not count."""
    import subprocess
    import sys

    probe = textwrap.dedent(
        f"""
        import sys
        from mpplan.config import load_config
        from mpplan.workflows import plan_into_folder
        for policy in ("none", "sqrt"):
            config = load_config({str(tiny_config)!r}, ["planner.remat.policy=" + policy])
            assert plan_into_folder(config, {str(tmp_path)!r} + "/" + policy).exit_code == 0
            print(policy, "mpplan.passes.remat" in sys.modules)
        """
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=root, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["none False", "sqrt True"]


def test_plan_into_folder_needs_a_device(tmp_path, tiny_config):
    with pytest.raises(ConfigError, match="devices: needs at least one device"):
        plan_into_folder(load_config(tiny_config, ["devices=[]"]), str(tmp_path / "out"))


def test_verify_file_checks_settings_only_against_a_config(tmp_path, tiny_config):
    outcome = plan_into_folder(load_config(tiny_config), str(tmp_path / "out"))
    path = str(outcome.path)
    by_graph = verify_file(path, graph=tmp_path / "tiny.yaml")
    assert by_graph.report.trusted and "taken on trust from the plan" in by_graph.text()
    by_config = verify_file(path, config=tiny_config)
    assert not by_config.report.trusted
    assert by_config.text() == f"{path}: ok ({by_config.report.ops} ops, {by_config.report.buffers} buffers, 1 devices)"
    # a config passed as the graph builds the graph only: its settings are not checked
    assert verify_file(path, graph=tiny_config).report.trusted
    with pytest.raises(VerificationError, match="capacity"):
        verify_file(path, config=tiny_config, overrides=["devices.0.capacity=8"])
    with pytest.raises(ValueError, match="exactly one"):
        verify_file(path)
    other = save_graph(tiny(), tmp_path / "other.yaml")
    save_plan(dataclasses.replace(outcome.plan, graph_hash="0" * 64), tmp_path / "wrong.json")
    with pytest.raises(PlanError, match="graph.hash"):
        verify_file(tmp_path / "wrong.json", graph=other)


def test_graph_from_source_reads_a_config_or_a_graph_file(tmp_path, tiny_config):
    assert graph_from_source(tiny_config).content_hash == graph_from_source(tmp_path / "tiny.yaml").content_hash
    assert graph_from_source(tiny_config).content_hash == tiny().content_hash


class _NoBest:
    best = None
    best_plan = None


def test_report_best_is_none_without_a_best_plan(tiny_config):
    assert report_best(load_config(tiny_config), _NoBest()) is None  # type: ignore[arg-type]


DEVICE = {"name": "cuda:0", "predicted_peak_bytes": 2048, "measured_peak_bytes": 3072, "error_pct": 50.0,
          "allocator_peak_bytes": 4096, "allocator_base_bytes": 1024, "requested_peak_bytes": 3072,
          "reserved_peak_bytes": 2**20, "torch_device": "cuda:1"}


def test_allocator_line_says_which_number_the_measured_peak_is():
    assert allocator_line(DEVICE) == (
        "  cuda:0 on cuda:1: measured = max_memory_allocated - base; raw allocator peak 4.00 KiB, base 1.00 KiB, "
        "requested above base 3.00 KiB, raw reserved peak 1.00 MiB"
    )
    shared = allocator_line({**DEVICE, "shared_with": ["cuda:2"], "transient_peak_bytes": 512})
    assert "measured = tracked live bytes, the GPU is shared with cuda:2;" in shared
    assert shared.endswith(", computed outside the arena 512 B")


def test_measurement_text_lists_devices_eager_step_time_and_numerics():
    data = {"devices": [DEVICE], "step_time_s": 0.5,
            "eager": {"devices": [{"name": "cuda:0", "measured_peak_bytes": 8192}], "step_time_s": 0.25},
            "numerics": {"ok": False, "first_bad_op": "mm", "max_abs_diff": 1.0}}
    lines = measurement_text(data).splitlines()
    assert lines[0].split() == ["device", "predicted", "peak", "measured", "peak", "error"]
    assert lines[2].split() == ["cuda:0", "2.00", "KiB", "3.00", "KiB", "+50.00%"]
    assert lines[3] == allocator_line(DEVICE)
    assert lines[4:] == ["eager PyTorch on cuda:0: measured peak 8.00 KiB", "step time 0.5000 s (eager 0.2500 s)",
                         "numerics: MISMATCH at mm (max abs diff 1.0)"]


def test_run_into_folder_measures_on_virtual_devices_and_writes_everything(tmp_path):
    pytest.importorskip("torch")
    config = config_file(tmp_path, """
        model:
          torch:
            factory: "mpplan.zoo.transformer:gpt"
            kwargs: {vocab_size: 64, max_seq_len: 16, d_model: 32, n_heads: 2, n_layers: 1}
            inputs: [{shape: [batch, seq], dtype: int64, high: 64}]
            mode: train
        workload: {batch: 2, seq: 16}
        devices: [{count: 2, capacity: 1GiB}]
        """)
    outcome = run_into_folder(load_config(config), str(tmp_path / "out"), steps=1, warmup=0)
    assert outcome.exit_code == 0 and outcome.report == tmp_path / "out" / "report.md"
    assert load_plan(tmp_path / "out" / "plan.json") == outcome.plan
    written = json.loads((tmp_path / "out" / "measurement.json").read_text())
    assert written == json.loads(json.dumps(outcome.measurement))  # tuples read back as lists
    assert [d["name"] for d in outcome.measurement["devices"]] == ["cuda:0", "cuda:1"]
    assert measurement_text(outcome.measurement).splitlines()[-1].startswith("numerics: ok")


def test_the_remat_budget_is_judged_on_what_the_device_holds(tmp_path):
    """The recompute search counts no arena blocks; a torch model's plan is written as arena mode runs it,
    which may hold less.  A budget between the two is met: exit 0, no refusal printed (it was exit 3 with an
    empty misfit line).  Found on the quickstart model on one device (21.54 MiB held, 21.56 MiB searched)."""
    sets = ["devices.0.count=1", "planner.placement=single", "planner.remat.policy=budget",
            "planner.remat.solver=heuristic"]
    config = REPO / "configs" / "quickstart.yaml"
    least = plan_into_folder(load_config(config, [*sets, "planner.remat.budget=1"]), str(tmp_path / "least"))
    assert least.refused is not None and least.budget == 1 and least.exit_code == 3
    held, searched = least.plan.max_peak_bytes, least.refused.best.peak_bytes
    assert held < searched  # the model whose blocks hold less than the search counts
    between = plan_into_folder(load_config(config, [*sets, f"planner.remat.budget={(held + searched) // 2}"]),
                               str(tmp_path / "between"))
    assert between.budget is None and between.exit_code == 0
    assert between.plan.max_peak_bytes <= (held + searched) // 2


def test_missed_budget_names_the_budget_only_when_a_device_holds_more() -> None:
    """The exit code follows the budget on every device's peak, not the search's own verdict."""
    from mpplan.plan import DevicePlan, Plan
    from mpplan.plan_records import PlanSettings
    from mpplan.workflows.plan import missed_budget

    def planned(peaks: tuple[int, ...], budget: int | None) -> Plan:
        devices = tuple(DevicePlan(f"gpu{i}", 1000, 0, peak, peak, peak) for i, peak in enumerate(peaks))  # 0 static
        settings = PlanSettings(remat_chosen=None if budget is None else {"budget_bytes": budget})
        return Plan("g", "h", devices, (), {}, {}, max_peak_bytes=max(peaks), settings=settings)

    assert missed_budget(planned((90, 100), 100)) is None
    assert missed_budget(planned((90, 101), 100)) == 100
    assert missed_budget(planned((500,), None)) is None

"""The search on a local Ray (2 CPUs): best by objective, faults as statuses, kill and resume, max_batch.

One Ray session serves the whole module.  The fake evaluator below is shipped to
the actors by value (its module is not importable there); it appends every key
it starts evaluating to a log file, so tests can count evaluations across runs.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray import cloudpickle

from mpplan.capture import graph_from_config
from mpplan.cluster import DeviceOutOfMemory, Result, Status, run_search
from mpplan.cluster.records import Candidate
from mpplan.cluster.space import base_raw, candidate_config
from mpplan.config import Device, load_config, parse_config, resolve_devices
from mpplan.errors import InfeasibleError
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CHAIN = {"synthetic": {"kind": "chain", "n": 20}}


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@dataclass(frozen=True)
class FakeEvaluator:
    """Measures what the plan predicts; misbehaves on chosen schedules; fits iff batch <= ``fit_batch``."""

    log: str
    sleep_s: float = 0.0
    die: tuple[str, ...] = ()
    hang: tuple[str, ...] = ()
    oom: tuple[str, ...] = ()
    error: tuple[str, ...] = ()
    fit_batch: int | None = None
    batch_key: str = "batch"

    def __call__(self, candidate: Candidate) -> dict:
        with open(self.log, "a") as handle:
            handle.write(candidate.key + "\n")
        schedule = candidate.config.planner.schedule
        if schedule in self.die:
            os._exit(1)
        if schedule in self.hang:
            time.sleep(3600)
        if schedule in self.oom:
            raise DeviceOutOfMemory("cuda:0: tried to allocate 2 GiB")
        if schedule in self.error:
            raise ValueError("the executor disagrees")
        if self.fit_batch is not None and batch_of(candidate, self.batch_key) > self.fit_batch:
            raise DeviceOutOfMemory(f"batch {batch_of(candidate, self.batch_key)} does not fit")
        time.sleep(self.sleep_s)
        devices = [{"name": d.name, "measured_peak_bytes": d.peak_bytes} for d in candidate.plan.devices]
        return {"devices": devices, "step_time_s": 0.001 * len(devices) + candidate.plan.cross_device_bytes * 1e-12}


def batch_of(candidate: Candidate, key: str) -> int:
    if "." in key:
        return int(dict(candidate.overrides)[key])
    return candidate.config.workload[key]


def config(space: dict, tmp_path: Path, **search) -> object:
    raw = {
        "model": CHAIN,
        "devices": [{"count": 2, "capacity": "64MiB"}],
        "output": {"dir": str(tmp_path / "out")},
        "search": {"space": space, **search},
    }
    return parse_config(raw, str(tmp_path / "search.yaml"))


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def evaluated(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


SPACE = {
    "devices.0.count": [1, 2, 4],
    "planner.placement": ["single", "pipeline"],
    "planner.schedule": ["as_given", "dfs"],
}


def test_grid_search_measures_the_top_k_and_picks_the_best(tmp_path):
    cfg = config(SPACE, tmp_path, objective="min_peak", top_k=3, actors=2, timeout_s=60)
    log = tmp_path / "evals.log"
    summary = run_search(cfg, out=tmp_path / "a", progress=False, evaluate_candidate=FakeEvaluator(str(log)))
    results = [Result.from_dict(d, "line") for d in lines(tmp_path / "a" / "results.jsonl")]
    assert len(results) == 12 == summary.candidates  # every point has exactly one line
    by_status = {s: [r for r in results if r.status is s] for s in Status}
    # one device (84 MB) or a single-device placement never fits 64 MiB: skipped, never measured
    assert len(by_status[Status.PREDICTED_MISFIT]) == 8
    assert len(by_status[Status.OK]) == 3 and len(by_status[Status.PREDICTED_FIT]) == 1
    assert sorted(evaluated(log)) == sorted(r.key for r in by_status[Status.OK])
    # the best is the lowest measured peak, and it is the lowest predicted of all that fit (brute force)
    # (equal peaks are ranked by measured step time, which the machine's load decides: any of them may win)
    fitting = by_status[Status.OK] + by_status[Status.PREDICTED_FIT]
    least = min(r.predicted_peak_bytes for r in fitting)
    assert summary.best.measured_peak_bytes == least
    assert summary.best.key in {r.key for r in fitting if r.predicted_peak_bytes == least}
    assert summary.best.overrides["devices.0.count"] == 4 and summary.best.overrides["planner.placement"] == "pipeline"
    best_plan = json.loads((tmp_path / "a" / "best" / "plan.json").read_text())
    assert best_plan["predicted"]["max_peak_bytes"] == summary.best.measured_peak_bytes
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["best"]["key"] == summary.best.key

    fastest = run_search(
        config(SPACE, tmp_path, objective="min_time_that_fits", top_k=4, actors=2),
        out=tmp_path / "b",
        progress=False,
        evaluate_candidate=FakeEvaluator(str(tmp_path / "evals_b.log")),
    )
    assert fastest.best.overrides["devices.0.count"] == 2  # the fake step time grows with devices


def test_faults_are_statuses_and_the_search_completes(tmp_path):
    space = {"planner.schedule": ["as_given", "dfs", "bfs", "least_peak", "greedy_free"]}
    cfg = config(space, tmp_path, top_k=5, actors=2, timeout_s=2.0, retries=1)
    log = tmp_path / "evals.log"
    fake = FakeEvaluator(str(log), die=("dfs",), hang=("bfs",), oom=("least_peak",), error=("greedy_free",))
    summary = run_search(cfg, out=tmp_path / "out", progress=False, evaluate_candidate=fake)
    got = {r["overrides"]["planner.schedule"]: r for r in lines(tmp_path / "out" / "results.jsonl")}
    assert {k: (v["status"], v["attempts"]) for k, v in got.items()} == {
        "as_given": ("ok", 1),
        "dfs": ("actor_died", 2),  # retried once on a fresh actor, then recorded
        "bfs": ("timeout", 2),
        "least_peak": ("oom", 1),  # the actor survives an OOM: no retry needed
        "greedy_free": ("error", 1),
    }
    assert "DeviceOutOfMemory" in got["least_peak"]["error"] and "disagrees" in got["greedy_free"]["error"]
    assert summary.state == "finished" and summary.best.overrides == {"planner.schedule": "as_given"}
    assert summary.evaluations == 7


def test_interrupted_search_resumes_without_repeating_or_losing_anything(tmp_path):
    space = {"devices.0.count": [2, 4], "planner.schedule": ["as_given", "dfs", "greedy_free", "least_peak"]}
    cfg = config(space, tmp_path, top_k=8, actors=2, timeout_s=60)
    log = tmp_path / "evals.log"
    fake = FakeEvaluator(str(log), sleep_s=0.2)
    seen: list[Result] = []

    def stop_after_three(result: Result) -> None:
        seen.append(result)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_search(cfg, out=tmp_path / "out", progress=False, evaluate_candidate=fake, on_result=stop_after_three)
    finished_first = {d["key"] for d in lines(tmp_path / "out" / "results.jsonl")}
    assert len(finished_first) == 3
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["state"] == "interrupted"

    resumed = run_search(cfg, out=tmp_path / "out", resume=True, progress=False, evaluate_candidate=fake)
    counts = {k: evaluated(log).count(k) for k in set(evaluated(log))}
    assert all(counts[k] == 1 for k in finished_first)  # nothing finished is evaluated again
    keys = [d["key"] for d in lines(tmp_path / "out" / "results.jsonl")]
    assert len(keys) == len(set(keys)) == 8  # nothing lost, nothing twice

    straight = run_search(
        cfg, out=tmp_path / "straight", progress=False, evaluate_candidate=FakeEvaluator(str(tmp_path / "s.log"))
    )
    assert resumed.best.key == straight.best.key
    assert {k: v for k, v in resumed.counts.items()} == straight.counts


def test_driver_killed_with_sigkill_resumes(tmp_path):
    """A real kill: the driver runs in a subprocess joined to this Ray cluster and gets SIGKILL mid-search."""
    space = {"devices.0.count": [2, 4], "planner.schedule": ["as_given", "dfs", "greedy_free", "least_peak"]}
    cfg_raw = {
        "model": CHAIN,
        "devices": [{"count": 2, "capacity": "64MiB"}],
        "search": {"space": space, "top_k": 8, "actors": 1, "timeout_s": 60},
    }
    (tmp_path / "search.yaml").write_text(json.dumps(cfg_raw))
    log, out = tmp_path / "evals.log", tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from ray import cloudpickle
        import test_cluster_search as t
        cloudpickle.register_pickle_by_value(t)
        from mpplan.cluster import run_search
        run_search({str(tmp_path / "search.yaml")!r}, address={ray.get_runtime_context().gcs_address!r},
                   out={str(out)!r}, progress=False, evaluate_candidate=t.FakeEvaluator({str(log)!r}, sleep_s=0.3))
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and driver.poll() is None:
            done = (
                [d for d in lines(out / "results.jsonl") if d["attempts"]] if (out / "results.jsonl").exists() else []
            )
            if len(done) >= 3:
                break
            time.sleep(0.05)
        assert driver.poll() is None, "the driver ended before it could be killed"
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    finished_first = {d["key"] for d in lines(out / "results.jsonl")}
    fake = FakeEvaluator(str(log))
    resumed = run_search(tmp_path / "search.yaml", out=out, resume=True, progress=False, evaluate_candidate=fake)
    counts = {k: evaluated(log).count(k) for k in set(evaluated(log))}
    assert all(counts[k] == 1 for k in finished_first)
    keys = [d["key"] for d in lines(out / "results.jsonl")]
    assert len(keys) == len(set(keys)) == 8
    assert resumed.counts["ok"] == 8 and resumed.best.overrides["devices.0.count"] == 4


def test_max_batch_bisects_to_the_linear_scan_answer(tmp_path):
    """Fit is predicted (45 MiB cuts batches above ~400) and measured (the fake fits iff batch <= K)."""
    key, values, fit = "model.synthetic.batch", list(range(8, 1032, 8)), 136
    space = {key: {"min": 8, "max": 1024, "step": 8}, "planner.assign": ["greedy_by_size", "best_fit"]}
    raw = {
        "model": CHAIN,
        "devices": [{"count": 2, "capacity": "45MiB"}],
        "planner": {"placement": "pipeline", "schedule": "as_given"},  # 20 ms a plan: the scan below plans 128
        "search": {"space": space, "objective": "max_batch", "batch_key": key, "top_k": 1, "actors": 1},
    }
    cfg = parse_config(raw, str(tmp_path / "search.yaml"))
    log = tmp_path / "evals.log"
    fake = FakeEvaluator(str(log), fit_batch=fit, batch_key=key)
    summary = run_search(cfg, out=tmp_path / "out", progress=False, evaluate_candidate=fake)

    # the linear scan: plan every batch, and measure each predicted fit by the same rule
    base, predicted = base_raw(cfg), []
    for batch in values:
        point = candidate_config(
            base, ((key, batch), ("planner.assign", summary.best.overrides["planner.assign"])), cfg.source
        )
        made = plan(graph_from_config(point), resolve_devices(point), PlannerSettings.from_config(point.planner))
        predicted.append(not made.misfits)
    assert not all(predicted) and any(p and b > fit for b, p in zip(values, predicted))  # both phases matter
    expected = max(b for b, p in zip(values, predicted) if p and b <= fit)
    assert summary.best.overrides[key] == expected == fit
    scan_measurements = sum(predicted)
    measured = len(evaluated(log))
    assert measured <= math.ceil(math.log2(scan_measurements + 1)) < scan_measurements / 5
    assert summary.counts["oom"] >= 1 and summary.counts["ok"] >= 1
    print(f"\nmax_batch: {measured} measured probes; a linear scan measures {scan_measurements}")


def test_measured_phase_scales_with_actors(tmp_path, record_property):
    """8 candidates of 0.5 s: with 2 actors the measured phase takes about half as long as with 1."""
    space = {"devices.0.count": [2, 4], "planner.schedule": ["as_given", "dfs", "greedy_free", "least_peak"]}
    seconds = {}
    for actors in (1, 2):
        cfg = config(space, tmp_path, top_k=8, actors=actors, timeout_s=60)
        fake = FakeEvaluator(str(tmp_path / f"evals{actors}.log"), sleep_s=0.5)
        summary = run_search(cfg, out=tmp_path / f"out{actors}", progress=False, evaluate_candidate=fake)
        assert summary.counts["ok"] == 8
        seconds[actors] = summary.measure_seconds
    speedup = seconds[1] / seconds[2]
    record_property("measure_seconds", seconds)
    print(f"\nmeasured phase: 1 actor {seconds[1]:.2f}s, 2 actors {seconds[2]:.2f}s, speed-up {speedup:.2f}x")
    assert seconds[1] >= 4.0 and speedup > 1.5


def test_real_executor_measures_a_torch_model(tmp_path):
    """The default evaluator: mpplan.runtime runs the zoo MLP on virtual devices inside the actors."""
    raw = {
        "model": {
            "torch": {
                "factory": "mpplan.zoo.mlp:mlp",
                "inputs": [{"shape": ["batch", 64], "dtype": "float32"}],
                "mode": "train",
                "optimizer": "sgd",
            }
        },
        "workload": {"batch": 8},
        "devices": [{"name": "cuda:0", "capacity": "1GiB"}],
        "search": {
            "space": {"planner.schedule": ["as_given", "dfs"]},
            "top_k": 2,
            "actors": 1,
            "timeout_s": 120,
            "measure": {"steps": 1, "warmup": 0},
        },
    }
    cfg = parse_config(raw, str(tmp_path / "search.yaml"))
    summary = run_search(cfg, out=tmp_path / "out", progress=False)
    results = lines(tmp_path / "out" / "results.jsonl")
    assert [r["status"] for r in results] == ["ok", "ok"], [r["error"] for r in results]
    for r in results:
        (device,) = r["measurement"]["devices"]
        # arena mode: exact (tracked live bytes; on a GPU the measured peak is the allocator's)
        assert device["tracked_peak_bytes"] == r["predicted"]["max_peak_bytes"]
    assert summary.best is not None


def test_the_readme_main_job_searches_the_quickstart(tmp_path, capsys):
    """`mpplan search configs/quickstart.yaml`, the README's first command, end to end through the CLI."""
    from mpplan.cli import main
    from mpplan.plan import load_plan
    from mpplan.verify import verify

    out = tmp_path / "qs"
    code = main(["-q", "search", str(REPO / "configs" / "quickstart.yaml"), "--out", str(out),
                 "--set", "search.measure.steps=1", "--set", "search.measure.warmup=0"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "search finished" in printed and "best (min_peak)" in printed and "report:" in printed
    for figure in ("memory_timeline.png", "devices.png", "candidates.png"):
        assert (out / figure).stat().st_size > 1000, figure
    assert "measured" in (out / "report.md").read_text()
    results = lines(out / "results.jsonl")
    assert sorted(r["status"] for r in results) == ["ok", "ok", "predicted_fit", "predicted_fit"]
    best = load_plan(out / "best" / "plan.json")
    config = load_config(REPO / "configs" / "quickstart.yaml")
    measured = [r for r in results if r["status"] == "ok"]
    # Regression: the search planned without what arena mode holds outside the arena (the blocks and scratch of
    # ``mpplan plan`` and ``mpplan run``), so every candidate measured 1.5 MiB over its prediction, and over what
    # `mpplan run` measures for the same settings.  Each device's measured peak is now the plan's, to the byte.
    for r in measured:
        for d in r["measurement"]["devices"]:
            assert d["measured_peak_bytes"] == d["predicted_peak_bytes"] == r["predicted"]["devices"][d["name"]], d
    assert min(r["predicted"]["max_peak_bytes"] for r in measured) == best.max_peak_bytes
    verify(graph_from_config(config), best)


REMAT_MODEL = {"synthetic": {"kind": "transformer", "layers": 4, "train": True, "batch": 8, "seq": 64, "hidden": 32,
                             "heads": 2, "vocab": 64}}


def test_mxnet_threshold_search_measures_the_generated_thresholds(tmp_path):
    """MXNet's guesses and grid become candidates; the measured best is the least peak among them."""
    raw = {
        "model": REMAT_MODEL,
        "devices": [{"name": "cuda:0", "capacity": "1GiB"}],
        "planner": {"remat": {"policy": "mirror"}},
        "search": {"space": {"planner.remat.threshold": {"generate": "mxnet", "ntrial": 4}}, "top_k": 3, "actors": 1},
    }
    cfg = parse_config(raw, str(tmp_path / "search.yaml"))
    summary = run_search(cfg, out=tmp_path / "out", progress=False,
                         evaluate_candidate=FakeEvaluator(str(tmp_path / "l")))
    results = lines(tmp_path / "out" / "results.jsonl")
    from mpplan.passes.remat import mirror_thresholds

    thresholds = mirror_thresholds(graph_from_config(cfg), ntrial=4)
    assert sorted(r["overrides"]["planner.remat.threshold"] for r in results) == sorted(thresholds)
    measured = [r for r in results if r["status"] == "ok"]
    assert len(measured) == 3
    assert summary.best.measured_peak_bytes == min(r["predicted"]["max_peak_bytes"] for r in results)


def test_budget_bisection_finds_the_least_recompute_that_fits(tmp_path):
    """max_batch over the remat budget: the largest budget (least recompute) whose plan fits the device,
    the same as a linear scan, in about log2 as many measurements."""
    key = "planner.remat.budget"
    values = [round(0.5 + 0.025 * i, 12) for i in range(21)]
    base = {"model": REMAT_MODEL, "planner": {"remat": {"policy": "budget", "budget": 1.0, "solver": "heuristic"}}}
    no_remat = plan(graph_from_config(parse_config(base, "b.yaml")), [Device("cuda:0", 1 << 40)])
    capacity = int(no_remat.max_peak_bytes * 0.85)
    raw = {
        **base,
        "devices": [{"name": "cuda:0", "capacity": capacity}],
        "search": {"space": {key: {"min": 0.5, "max": 1.0, "step": 0.025}}, "objective": "max_batch",
                   "batch_key": key, "top_k": 1, "actors": 1},
    }
    cfg = parse_config(raw, str(tmp_path / "search.yaml"))
    log = tmp_path / "evals.log"
    summary = run_search(cfg, out=tmp_path / "out", progress=False, evaluate_candidate=FakeEvaluator(str(log)))
    fits = []
    for budget in values:
        point = candidate_config(base_raw(cfg), ((key, budget),), cfg.source)
        try:
            made = plan(graph_from_config(point), resolve_devices(point), PlannerSettings.from_config(point.planner))
        except InfeasibleError:
            fits.append(False)
            continue
        verify(graph_from_config(point), made, check_capacity=False)
        fits.append(not made.misfits)
    assert any(fits) and not all(fits)
    expected = max(b for b, f in zip(values, fits) if f)
    assert summary.best.overrides[key] == expected
    assert len(evaluated(log)) <= math.ceil(math.log2(sum(fits) + 1))


@pytest.mark.parametrize(
    ("configured", "devices", "biggest", "expected"),
    [
        (None, 2, 4, 2),  # one GPU per planned device when a node has them
        (None, 2, 0, 0),  # no GPUs: virtual devices
        (None, 4, 1, 0),  # a 4-device search on a 1-GPU machine measures on virtual devices
        (8, 2, 4, 8),  # an explicit setting is taken as it is (and refused later when too large)
        (0, 2, 4, 0),
    ],
)
def test_gpus_per_actor(configured, devices, biggest, expected) -> None:
    from mpplan.cluster.driver import _gpus_per_actor

    assert _gpus_per_actor(configured, devices, biggest) == expected

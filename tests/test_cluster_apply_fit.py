"""``search.fit: apply``: max_batch judged by the user's own loop under ``mpplan.apply`` (issue 15).

The zoo GPT trains with SGD on a virtual device.  The cap is chosen between the
plan's own predicted peak and ``apply``'s prediction at one batch, so the two ways
of judging fit disagree there.  With ``fit: apply`` the search picks the largest
batch that ``plan_for_apply`` fits (the oracle, planned here point by point), and
that batch, trained through ``apply`` in a plain loop, measures under the cap; the
point ``fit: plan`` picks, trained the same way, does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray import cloudpickle

from mpplan.capture import graph_from_config
from mpplan.cluster import Status, run_search
from mpplan.cluster.apply_fit import ApplyEvaluator, ApplyMisfit, ApplyPoint, apply_budget, plan_point
from mpplan.cluster.records import Candidate
from mpplan.config import Device, parse_config, resolve_devices
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow

MODEL = {
    "torch": {
        "factory": "mpplan.zoo.transformer:gpt",
        "kwargs": {"vocab_size": 256, "max_seq_len": 64, "d_model": 64, "n_heads": 2, "n_layers": 2},
        "inputs": [{"shape": ["batch", 64], "dtype": "int64", "high": 256}],
        "mode": "train",
        "optimizer": "sgd",
    }
}
BATCHES = [1, 2, 3, 4, 5, 6]
SPLIT = 4
"""The batch whose two predictions the cap lies between."""


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def _raw(capacity: int, fit: str, tmp_path: Path, top_k: int = 1, step_in_backward: bool = False) -> dict:
    return {
        "model": MODEL,
        "workload": {"batch": 1},
        "devices": [{"name": "cuda:0", "capacity": capacity}],
        "search": {"space": {"workload.batch": BATCHES}, "objective": "max_batch", "top_k": top_k, "actors": 1,
                   "fit": fit, "timeout_s": 300, "measure": {"steps": 2, "warmup": 0},
                   "step_in_backward": step_in_backward},
        "output": {"dir": str(tmp_path / f"{fit}-{step_in_backward}")},
    }


def _point(batch: int, capacity: int, tmp_path: Path, step_in_backward: bool = False):
    raw = _raw(capacity, "apply" if step_in_backward else "plan", tmp_path, step_in_backward=step_in_backward)
    cfg = parse_config({**raw, "workload": {"batch": batch}}, "p.yaml")
    return cfg, resolve_devices(cfg), PlannerSettings.from_config(cfg.planner)


def _predictions(batch: int, tmp_path: Path) -> tuple[int, int]:
    """The plan's own peak and ``apply``'s (no recompute) at ``batch``, on a device large enough for both."""
    cfg, devices, settings = _point(batch, 1 << 40, tmp_path)
    own = plan(graph_from_config(cfg), devices, settings).max_peak_bytes
    fitted = plan_point(cfg, devices, settings)
    assert isinstance(fitted, ApplyPoint) and not fitted.plan.remat
    return own, fitted.predicted_peak_bytes


def _measure_in_loop(batch: int, capacity: int, tmp_path: Path, planned) -> int:
    cfg, _, _ = _point(batch, capacity, tmp_path)
    result = ApplyEvaluator(steps=2)(Candidate("k", (("workload.batch", batch),), cfg, planned))
    return result["devices"][0]["measured_peak_bytes"]


def test_fit_apply_picks_the_batch_that_fits_the_users_loop(tmp_path):
    own, applied = _predictions(SPLIT, tmp_path)
    assert own != applied, "the two predictions must differ for the cap to lie between them"
    cap = (own + applied) // 2

    # the oracles, point by point: the plan's own fit, and plan_for_apply's
    plan_fits, apply_fits = [], []
    for batch in BATCHES:
        cfg, devices, settings = _point(batch, cap, tmp_path)
        graph = graph_from_config(cfg)
        plan_fits.append(not plan(graph, devices, settings).misfits)
        point = plan_point(cfg, devices, settings)
        if isinstance(point, ApplyPoint):
            verify(graph, point.plan, check_capacity=False)
            assert point.predicted_peak_bytes <= cap
        apply_fits.append(isinstance(point, ApplyPoint))
    expect_plan = max(b for b, f in zip(BATCHES, plan_fits) if f)
    expect_apply = max(b for b, f in zip(BATCHES, apply_fits) if f)

    by_plan = run_search(parse_config(_raw(cap, "plan", tmp_path, top_k=0), "s.yaml"), progress=False)
    by_apply = run_search(parse_config(_raw(cap, "apply", tmp_path), "s.yaml"), progress=False)
    assert by_plan.best is not None and by_apply.best is not None
    plan_batch = by_plan.best.overrides["workload.batch"]
    apply_batch = by_apply.best.overrides["workload.batch"]
    assert plan_batch == expect_plan and apply_batch == expect_apply

    # fit: apply measured its choice in the user's loop, under the cap and as predicted
    best = by_apply.best
    assert best.status is Status.OK and best.measurement["fit"] == "apply"
    assert best.measured_peak_bytes <= cap
    assert best.predicted["fit"] == "apply" and best.predicted["max_peak_bytes"] <= cap
    assert abs(best.measured_peak_bytes - best.predicted["max_peak_bytes"]) <= 0.01 * cap

    # the two disagree: what fit: plan picks, trained in the user's loop as planned, overruns the cap
    cfg, devices, settings = _point(plan_batch, cap, tmp_path)
    planned_by_plan = plan(graph_from_config(cfg), devices, settings)
    chosen = plan_point(*_point(apply_batch, cap, tmp_path))
    assert isinstance(chosen, ApplyPoint)
    assert plan_batch != apply_batch or (not planned_by_plan.remat and chosen.plan.remat)
    overrun = _measure_in_loop(plan_batch, cap, tmp_path, planned_by_plan)
    print(f"\ncap {cap} (batch {SPLIT}: plan {own}, apply {applied}); fit: plan picks {plan_batch}, "
          f"{overrun} in the loop; fit: apply picks {apply_batch} (recomputes {len(chosen.plan.remat)}), "
          f"{best.measured_peak_bytes} measured, {best.predicted['max_peak_bytes']} predicted")
    assert overrun > cap


def _least_peak(batch: int, tmp_path: Path, step_in_backward: bool) -> int:
    """``apply``'s least predicted peak at ``batch``, any recompute: the floor no remat goes under."""
    point = plan_point(*_point(batch, 1000, tmp_path, step_in_backward), step_in_backward=step_in_backward)
    assert isinstance(point, ApplyMisfit)
    return point.least_peak_bytes


def test_step_in_backward_fits_a_larger_batch_and_the_loop_measures_it_under_the_cap(tmp_path):
    """The step in backward frees each gradient once its parameter is updated, so the floor that gradients set
    (which no recompute lowers) falls: with a cap between the two floors at one batch, the search with
    ``search.step_in_backward`` picks a larger batch than without, and that batch, trained through ``apply``
    with SGD stepping inside backward, measures under the cap and as predicted."""
    plain_floor, stepped_floor = (_least_peak(SPLIT, tmp_path, sib) for sib in (False, True))
    assert stepped_floor < plain_floor
    cap = (plain_floor + stepped_floor) // 2

    fits: dict[bool, list[int]] = {}
    for sib in (False, True):  # the oracle, point by point
        points = {b: plan_point(*_point(b, cap, tmp_path, sib), step_in_backward=sib) for b in BATCHES}
        fits[sib] = [b for b, point in points.items() if isinstance(point, ApplyPoint)]
    assert max(fits[True]) > max(fits[False])

    plain = run_search(parse_config(_raw(cap, "apply", tmp_path, top_k=0), "s.yaml"), progress=False)
    stepped = run_search(parse_config(_raw(cap, "apply", tmp_path, step_in_backward=True), "s.yaml"),
                         progress=False)
    assert plain.best is not None and stepped.best is not None
    assert plain.best.overrides["workload.batch"] == max(fits[False])
    assert stepped.best.overrides["workload.batch"] == max(fits[True])
    assert plain.best.key != stepped.best.key or max(fits[True]) != max(fits[False])

    best = stepped.best
    assert best.status is Status.OK and best.measurement["fit"] == "apply"
    assert best.predicted["max_peak_bytes"] <= cap and best.measured_peak_bytes <= cap
    assert abs(best.measured_peak_bytes - best.predicted["max_peak_bytes"]) <= 0.01 * cap

    # the same plan in a loop that steps at the end holds every gradient at once: over the cap
    chosen = plan_point(*_point(best.overrides["workload.batch"], cap, tmp_path, True), step_in_backward=True)
    assert isinstance(chosen, ApplyPoint)
    at_end = _measure_in_loop(best.overrides["workload.batch"], cap, tmp_path, chosen.plan)
    print(f"\ncap {cap} (floors at batch {SPLIT}: {plain_floor} stepping at the end, {stepped_floor} in backward); "
          f"batch {max(fits[False])} -> {max(fits[True])}; {best.measured_peak_bytes} measured in backward, "
          f"{at_end} at the end")
    assert at_end > cap


@pytest.mark.cuda
@pytest.mark.parametrize("step_in_backward", [False, True])
def test_on_cuda_the_loop_holds_the_prediction_under_the_cap(tmp_path, step_in_backward):
    """On a GPU (SGD's foreach default) the evaluator replans for the GPU's graph; max_memory_allocated
    stays under the cap and within 5% of apply's prediction, with the step at the end or inside backward."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cap = _predictions(SPLIT, tmp_path)[1] * 9 // 10  # below the unplanned loop: the plan must recompute
    cfg, devices, settings = _point(SPLIT, cap, tmp_path, step_in_backward)
    point = plan_point(cfg, devices, settings, on="cuda:0", step_in_backward=step_in_backward)
    assert isinstance(point, ApplyPoint) and point.plan.remat
    evaluate = ApplyEvaluator(steps=2, step_in_backward=step_in_backward)
    result = evaluate(Candidate("k", (("workload.batch", SPLIT),), cfg, point.plan))
    measured, predicted = result["devices"][0]["measured_peak_bytes"], result["apply_predicted_peak_bytes"]
    assert result["recomputed"] > 0 and predicted <= cap
    assert abs(measured - predicted) <= 0.05 * predicted, (measured, predicted)


def test_the_apply_budget_is_the_remat_budget_under_the_capacity():
    devices = [Device("cuda:0", 1000, reserve=100), Device("cuda:1", 2000)]
    assert apply_budget(PlannerSettings(), devices, 5000) == 900
    assert apply_budget(PlannerSettings(remat="budget", remat_budget=700), devices, 5000) == 700
    assert apply_budget(PlannerSettings(remat="budget", remat_budget=5000), devices, 5000) == 900
    assert apply_budget(PlannerSettings(remat="budget", remat_budget=0.1), devices, 5000) == 500
    assert apply_budget(PlannerSettings(remat="budget", remat_budget="0.5 capacity"), devices, 5000) == 500
    assert apply_budget(PlannerSettings(remat="sqrt", remat_budget=700), devices, 5000) == 900


def test_a_resume_measures_what_a_ranking_run_left_predicted(tmp_path):
    """A ``fit: apply`` run that only ranked (top_k 0), resumed with top_k 1, plans the stored point for
    the user's loop again and measures it there: same key, measured under the cap."""
    cap = (sum(_predictions(SPLIT, tmp_path))) // 2
    ranked = run_search(parse_config(_raw(cap, "apply", tmp_path, top_k=0), "s.yaml"), progress=False)
    assert ranked.best is not None and ranked.best.status is Status.PREDICTED_FIT
    resumed = run_search(parse_config(_raw(cap, "apply", tmp_path), "s.yaml"), progress=False, resume=True)
    assert resumed.best is not None and resumed.best.key == ranked.best.key
    assert resumed.best.status is Status.OK and resumed.best.measurement["fit"] == "apply"
    assert resumed.best.measured_peak_bytes <= cap


def test_a_point_no_recompute_fits_is_a_predicted_misfit_with_its_least_peak(tmp_path):
    """Under the parameters alone no recompute helps: the point is a misfit that says how far it is."""
    own, _ = _predictions(1, tmp_path)
    cfg, devices, settings = _point(1, own // 4, tmp_path)
    point = plan_point(cfg, devices, settings)
    assert isinstance(point, ApplyMisfit) and point.budget_bytes == own // 4
    assert point.least_peak_bytes > own // 4

"""The search space without Ray: axes, validation errors by message, config round trip, keys, bisection, objectives."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
import textwrap

import pytest
from conftest import REPO

from mpplan.cluster.batch import BatchChain, largest_fitting, probe_indices
from mpplan.cluster.objective import Objective
from mpplan.cluster.records import Result, Status
from mpplan.cluster.space import (
    axes,
    base_raw,
    candidate_config,
    candidate_key,
    grid,
    planner_section,
    split_batch_axis,
)
from mpplan.config import Device, SearchSection, axis_values, load_config, parse_config
from mpplan.errors import ConfigError

CHAIN = {"synthetic": {"kind": "chain", "n": 20}}


def parse(search: dict, **sections) -> object:
    return parse_config(
        {"model": CHAIN, "devices": [{"count": 2, "capacity": "1GiB"}], "search": search, **sections}, "s.yaml"
    )


@pytest.mark.parametrize(
    "spec, values",
    [
        ([3, 1, 2], (3, 1, 2)),
        ({"min": 8, "max": 64, "factor": 2}, (8, 16, 32, 64)),
        ({"min": 8, "max": 60, "factor": 2}, (8, 16, 32)),
        ({"min": 1, "max": 10, "step": 4}, (1, 5, 9)),
        ({"min": 0.1, "max": 0.3, "step": 0.1}, (0.1, 0.2, 0.3)),
        ({"min": 8, "max": 30, "factor": 1.5}, (8, 12, 18, 27)),
        ({"min": 5, "max": 5, "step": 1}, (5,)),
    ],
)
def test_axis_values(spec, values):
    assert axis_values(spec) == values


@pytest.mark.parametrize(
    "search, message",
    [
        (
            {"space": {"planner.bogus": [1]}},
            "s.yaml: search.space.planner.bogus: value 1 does not make a valid config: planner.bogus: unknown key",
        ),
        (
            {"space": {"workload.batch": {"min": 64, "max": 8, "step": 8}}},
            "s.yaml: search.space.workload.batch: empty range, min 64 is above max 8",
        ),
        ({"space": {"workload.batch": []}}, "s.yaml: search.space.workload.batch: empty list"),
        (
            {"space": {"workload.batch": [8, -4]}},
            "s.yaml: search.space.workload.batch: value -4 does not make a valid config: "
            "workload.batch: must be positive",
        ),
        ({"space": {"workload.batch": {"min": -8, "max": 8, "step": 8}}}, "value -8 does not make a valid config"),
        (
            {"objective": "fastest"},
            "s.yaml: search.objective: expected one of min_peak, min_time_that_fits, max_batch, got 'fastest'",
        ),
        (
            {"space": {"planner.schedule": ["dfs", "sideways"]}},
            "s.yaml: search.space.planner.schedule: value 'sideways' does not make a valid config: planner.schedule:",
        ),
        ({"space": {"workload.batch": {"min": 1, "max": 8}}}, "a range needs min, max and exactly one of step, factor"),
        (
            {"space": {"workload.batch": {"min": 1, "max": 8, "factor": 1}}},
            "search.space.workload.batch.factor: must be above 1",
        ),
        ({"space": {"workload.batch": "8"}}, "expected a list of values or a range"),
        ({"space": {"search.top_k": [1]}}, "search.space.search.top_k: expected a dotted config key outside search"),
        (
            {"objective": "max_batch", "space": {"planner.schedule": ["dfs"]}},
            "search.space: objective max_batch bisects workload.batch",
        ),
        ({"objective": "max_batch", "space": {"workload.batch": [1.5]}}, "value 1.5 does not make a valid config"),
        ({"top_k": -1}, "s.yaml: search.top_k: must be at least 0, got -1"),
        ({"timeout_s": 0}, "s.yaml: search.timeout_s: must be positive"),
        ({"bogus": 1}, "s.yaml: search.bogus: unknown key"),
    ],
)
def test_bad_search_section_is_one_line_config_error(search, message):
    with pytest.raises(ConfigError) as info:
        parse(search)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_space_fails_before_ray_starts(tmp_path, monkeypatch):
    import ray

    from mpplan.cluster import run_search

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr(ray, "init", no_ray)
    path = tmp_path / "search.yaml"
    path.write_text(
        textwrap.dedent(
            """
            model: {synthetic: {kind: chain, n: 20}}
            devices: [{count: 2, capacity: 1GiB}]
            search: {space: {workload.batch: {min: 64, max: 8, factor: 2}}}
            """
        )
    )
    with pytest.raises(ConfigError, match=r"search.space.workload.batch: empty range, min 64 is above max 8"):
        run_search(path, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_measuring_a_synthetic_graph_needs_an_evaluator_or_top_k_0(tmp_path):
    from mpplan.cluster import run_search

    config = parse({"space": {"planner.schedule": ["dfs"]}, "top_k": 2})
    with pytest.raises(ConfigError, match="search.top_k: measuring runs model.torch"):
        run_search(config, out=tmp_path / "out")


def test_prediction_only_search_needs_no_ray(tmp_path, monkeypatch):
    import ray

    from mpplan.cluster import run_search

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    config = parse({"space": {"devices.0.count": [1, 2, 4], "planner.placement": ["pipeline"]}, "top_k": 0})
    summary = run_search(config, out=tmp_path / "out", progress=False)
    assert summary.counts["predicted_fit"] == 3 and summary.best.overrides["devices.0.count"] == 4
    assert (tmp_path / "out" / "best" / "plan.json").is_file()


@pytest.mark.parametrize("name", ["quickstart.yaml", "synthetic_transformer.yaml", "zoo_mlp.yaml"])
def test_base_raw_round_trips_the_config(name):
    config = load_config(REPO / "configs" / name)
    assert parse_config(base_raw(config), config.source) == dataclasses.replace(config, search=SearchSection())


def test_base_raw_keeps_yaml_keys_and_candidate_applies_overrides():
    config = parse({"space": {"planner.shift.from": ["cuda:1"], "devices.0.count": [4]}})
    point = candidate_config(base_raw(config), (("planner.shift.from", "cuda:1"), ("devices.0.count", 4)), "s.yaml")
    assert point.planner.shift.from_device == "cuda:1" and point.devices[0].count == 4
    assert point.search.space == {}  # a candidate carries no search of its own


def test_grid_is_the_product_in_axis_order():
    config = parse({"space": {"planner.schedule": ["dfs", "bfs"], "devices.0.count": [1, 2, 4]}})
    points = list(grid(axes(config.search)))
    assert len(points) == 6
    assert points[0] == (("planner.schedule", "dfs"), ("devices.0.count", 1))
    assert points[-1] == (("planner.schedule", "bfs"), ("devices.0.count", 4))
    assert list(grid(())) == [()]


def test_split_batch_axis_sorts_the_batch_values():
    config = parse({"objective": "max_batch", "space": {"workload.batch": [32, 8, 16, 8], "planner.schedule": ["dfs"]}})
    batch, others = split_batch_axis(config.search, axes(config.search))
    assert batch.values == (8, 16, 32) and [a.key for a in others] == ["planner.schedule"]


def test_candidate_key_is_stable_and_sees_what_matters():
    devices = [Device("cuda:0", 100), Device("cuda:1", 100)]
    dfs = {"schedule": "dfs", "remat": {"policy": "none"}}
    key = candidate_key("g", dfs, devices, {"batch": 8, "seq": 2})
    assert key == candidate_key("g", dict(reversed(dfs.items())), devices, {"seq": 2, "batch": 8})
    assert key != candidate_key("h", dfs, devices, {"batch": 8, "seq": 2})
    assert key != candidate_key("g", {**dfs, "schedule": "bfs"}, devices, {"batch": 8, "seq": 2})
    assert key != candidate_key("g", {**dfs, "remat": {"policy": "sqrt"}}, devices, {"batch": 8, "seq": 2})
    assert key != candidate_key("g", dfs, devices[:1], {"batch": 8, "seq": 2})
    assert key != candidate_key("g", dfs, devices, {"batch": 16, "seq": 2})


def test_every_planner_key_reaches_the_candidate_key():
    config = parse({})
    section = planner_section(config)
    assert set(section) == {f.metadata.get("key") or f.name for f in dataclasses.fields(config.planner)}


@pytest.mark.parametrize("count", [1, 2, 7, 64, 100])
@pytest.mark.parametrize("width", [1, 2, 3])
def test_bisection_matches_a_linear_scan(count, width):
    for limit in range(-1, count):
        fits = functools.partial(operator.ge, limit)  # fits(i) is limit >= i
        linear = max((i for i in range(count) if fits(i)), default=-1)
        assert largest_fitting(count, fits) == linear
        chain = BatchChain(0, lo=-1, hi=count, width=width)
        probes = 0
        while not chain.done:
            for index in chain.next_round():
                probes += 1
                chain.answer(index, fits(index))
        assert chain.lo == linear
        if width == 1:
            assert probes <= math.ceil(math.log2(count + 1))


def test_probe_indices_are_distinct_and_inside():
    for lo in range(-1, 10):
        for hi in range(lo + 1, 12):
            for width in range(1, 5):
                probes = probe_indices(lo, hi, width)
                assert len(set(probes)) == len(probes) == min(width, hi - lo - 1)
                assert all(lo < p < hi for p in probes)


def _result(key, status=Status.OK, peak=100, time=1.0, batch=8, predicted=100, overhead=0.0, cross=0):
    measurement = {"devices": [{"name": "a", "measured_peak_bytes": peak}], "step_time_s": time}
    predicted_ = {"max_peak_bytes": predicted, "compute_overhead": overhead, "cross_device_bytes": cross}
    return Result(
        key,
        status,
        {"workload.batch": batch},
        workload={"batch": batch},
        predicted=predicted_,
        measurement=measurement if status is Status.OK else None,
    )


def test_objectives_rank_and_choose():
    a = _result("a", peak=100, time=3.0, batch=8)
    b = _result("b", peak=90, time=4.0, batch=16)
    c = _result("c", peak=80, time=2.0, batch=4)
    died = _result("d", Status.ACTOR_DIED, batch=64)
    assert Objective("min_peak").best([a, b, c, died], measured=True).key == "c"
    assert Objective("min_time_that_fits").best([a, b, died], measured=True).key == "a"
    assert Objective("max_batch").best([a, b, c, died], measured=True).key == "b"
    tie = _result("0", peak=80, time=2.0, batch=4)
    assert Objective("min_peak").best([c, tie], measured=True).key == "0"  # ties break on the key
    fit = [_result("p", Status.PREDICTED_FIT, predicted=50), _result("q", Status.PREDICTED_FIT, predicted=40)]
    assert Objective("min_peak").best(fit, measured=False).key == "q"
    assert Objective("min_peak").best(fit, measured=True) is None
    slow = _result("s", Status.PREDICTED_FIT, overhead=0.5)
    assert Objective("min_time_that_fits").predicted_rank(a) < Objective("min_time_that_fits").predicted_rank(slow)


# --- generated axes: MXNet's threshold search ------------------------------------------------

MIRROR_MODEL = {"synthetic": {"kind": "transformer", "layers": 3, "train": True, "batch": 4, "seq": 32, "hidden": 16,
                              "heads": 2, "vocab": 32}}


def test_mxnet_generator_makes_mxnets_thresholds_from_the_base_graph():
    from mpplan.capture import graph_from_config
    from mpplan.passes.remat import mirror_search, mirror_thresholds

    raw = {"model": MIRROR_MODEL, "planner": {"remat": {"policy": "mirror"}},
           "search": {"space": {"planner.remat.threshold": {"generate": "mxnet", "ntrial": 4}}, "top_k": 0}}
    cfg = parse_config(raw, "s.yaml")
    (axis,) = axes(cfg.search, cfg.source, base=cfg)
    graph = graph_from_config(cfg)
    assert axis.key == "planner.remat.threshold" and axis.values == mirror_thresholds(graph, ntrial=4)
    assert len(axis.values) >= 4 and axis.values[0] == 0
    assert mirror_search(graph, ntrial=4)[0] in axis.values


@pytest.mark.parametrize(
    ("space", "remat", "message"),
    [
        ({"planner.remat.budget": {"generate": "mxnet"}}, "mirror",
         "unknown generator 'mxnet' for planner.remat.budget"),
        ({"planner.remat.threshold": {"generate": "chen"}}, "mirror", "unknown generator 'chen'"),
        ({"planner.remat.threshold": {"generate": "mxnet", "ntrial": 0}}, "mirror", "ntrial: expected a positive"),
        ({"planner.remat.threshold": {"generate": "mxnet", "steps": 3}}, "mirror", "takes generate and ntrial"),
        ({"planner.remat.threshold": {"generate": "mxnet"}}, "none", "set it (it is 'none')"),
    ],
)
def test_bad_generated_axes_are_one_line_errors(space, remat, message):
    raw = {"model": MIRROR_MODEL, "planner": {"remat": {"policy": remat}}, "search": {"space": space}}
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(raw, "s.yaml")

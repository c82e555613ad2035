"""The evaluation contract without Ray: every outcome an ``Evaluation``, the OOM rule, the default evaluator."""

from __future__ import annotations

import pytest
from conftest import REPO, chain

from mpplan.cluster.evaluator import DeviceOutOfMemory, RuntimeEvaluator, evaluate_safely, is_out_of_memory
from mpplan.cluster.records import Candidate, Status
from mpplan.config import Device, load_config, parse_config, resolve_devices
from mpplan.planner import PlannerSettings, plan


def candidate(capacity: int = 10**6) -> Candidate:
    config = parse_config({"model": {"synthetic": {"kind": "chain", "n": 2}}}, "c.yaml")
    return Candidate("k", (), config, plan(chain(4), [Device("a", capacity)]))


def measured(peak: int):
    return lambda c: {"devices": [{"name": "a", "measured_peak_bytes": peak}], "step_time_s": 0.25}


class OutOfMemoryError(RuntimeError):
    """Named like torch's: the rule matches by name, wherever the class lives."""


class ExecutorOOM(OutOfMemoryError):
    pass


def test_the_oom_rule():
    import torch

    assert is_out_of_memory(DeviceOutOfMemory("x"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(ExecutorOOM("subclass of a class named OutOfMemoryError"))
    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))  # torch raises some CUDA OOMs so
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("index out of range"))
    assert not is_out_of_memory(ValueError("out of memory"))  # the message counts on a RuntimeError only
    assert not is_out_of_memory(ValueError())


def raiser(exc):
    def evaluate(c):
        raise exc

    return evaluate


@pytest.mark.parametrize(
    "evaluate, status, error",
    [
        (measured(500), Status.OK, None),
        (raiser(DeviceOutOfMemory("a: 2 GiB")), Status.OOM, "DeviceOutOfMemory: a: 2 GiB"),
        (raiser(RuntimeError("CUDA error: out of memory")), Status.OOM, "RuntimeError: CUDA error: out of memory"),
        (raiser(MemoryError()), Status.OOM, "MemoryError"),
        (raiser(OutOfMemoryError("CUDA out of memory")), Status.OOM, "OutOfMemoryError: CUDA out of memory"),
        (raiser(KeyError("x")), Status.ERROR, "KeyError: 'x'"),
        (lambda c: [1], Status.ERROR, "evaluator returned a list, expected a measurement dict"),
        (lambda c: {"devices": []}, Status.ERROR, "evaluator returned no devices list"),
        (lambda c: {"devices": [{"name": "a", "measured_peak_bytes": -1}]}, Status.ERROR, "measured_peak_bytes -1"),
        (lambda c: {"devices": [{"name": "a", "measured_peak_bytes": 1}], "x": object()}, Status.ERROR, "not JSON"),
    ],
)
def test_outcomes_are_statuses(evaluate, status, error):
    evaluation = evaluate_safely(evaluate, candidate(), worker="w")
    assert evaluation.status is status
    assert evaluation.worker == "w" and evaluation.seconds >= 0
    if error is None:
        assert evaluation.error is None and evaluation.measurement["step_time_s"] == 0.25
    else:
        assert error in evaluation.error


def test_a_measured_peak_above_capacity_is_an_oom_that_keeps_its_numbers():
    evaluation = evaluate_safely(measured(2000), candidate(capacity=1000))
    assert evaluation.status is Status.OOM
    assert evaluation.error == "a measured 2000 bytes, capacity 1000"
    assert evaluation.measurement["devices"][0]["measured_peak_bytes"] == 2000


def test_runtime_evaluator_measures_and_caches_the_build():
    pytest.importorskip("mpplan.runtime.evaluate")
    config = load_config(REPO / "configs" / "zoo_mlp.yaml")
    from mpplan.capture import graph_from_config

    made = plan(graph_from_config(config), resolve_devices(config), PlannerSettings.from_config(config.planner))
    evaluator = RuntimeEvaluator(steps=1, warmup=0)
    first = evaluate_safely(evaluator, Candidate("k", (), config, made))
    assert first.status is Status.OK, first.error
    # Tracked live bytes: exact on virtual devices and on a GPU alike (there measured is the allocator's).
    assert first.measurement["devices"][0]["tracked_peak_bytes"] == made.max_peak_bytes
    built = dict(evaluator._built)
    evaluate_safely(evaluator, Candidate("k", (), config, made))
    assert evaluator._built.keys() == built.keys() and all(evaluator._built[k] is built[k] for k in built)


def test_runtime_evaluator_refuses_graphs_it_cannot_run():
    evaluation = evaluate_safely(RuntimeEvaluator(), candidate())
    assert evaluation.status is Status.ERROR and "only model.torch can be measured" in evaluation.error


def test_runtime_evaluator_replans_a_graph_traced_for_other_kernels():
    """The driver plans a CPU trace; an actor tracing for its GPU gets another graph and plans it again."""
    pytest.importorskip("mpplan.runtime.evaluate")
    config = load_config(REPO / "configs" / "zoo_mlp.yaml")
    driver_plan = plan(chain(4), resolve_devices(config), PlannerSettings.from_config(config.planner))
    evaluation = evaluate_safely(RuntimeEvaluator(steps=1, warmup=0), Candidate("k", (), config, driver_plan))
    assert evaluation.status is Status.OK, evaluation.error
    replanned = evaluation.measurement["replanned"]
    assert replanned["graph_hash"] != driver_plan.graph_hash
    assert evaluation.measurement["devices"][0]["tracked_peak_bytes"] == replanned["max_peak_bytes"]


def test_runtime_evaluator_measures_a_rematerialised_plan_exactly():
    pytest.importorskip("mpplan.runtime.evaluate")
    from mpplan.capture import graph_from_config

    config = load_config(REPO / "configs" / "zoo_mlp.yaml", ["planner.remat.policy=sqrt"])
    made = plan(graph_from_config(config), resolve_devices(config), PlannerSettings.from_config(config.planner))
    assert made.remat
    evaluation = evaluate_safely(RuntimeEvaluator(steps=1, warmup=0, eager=True), Candidate("k", (), config, made))
    assert evaluation.status is Status.OK, evaluation.error
    assert "replanned" not in evaluation.measurement
    assert evaluation.measurement["devices"][0]["tracked_peak_bytes"] == made.max_peak_bytes


# The quickstart's transformer, small: on virtual devices a plan without arena blocks measures 12,288 bytes over
# its prediction on cuda:0 (an op's copied-in results are held beside the one-block arena), while the other device
# (the larger peak) measures as predicted: only per-device peaks tell the two plans apart.
SMALL_GPT = ["model.torch.kwargs.n_layers=1", "model.torch.kwargs.d_model=32", "model.torch.kwargs.max_seq_len=16",
             "workload.batch=2", "workload.seq=16"]


def measured_peaks(measurement: dict) -> dict[str, int]:
    return {d["name"]: d["measured_peak_bytes"] for d in measurement["devices"]}


def test_runtime_evaluator_replans_as_arena_mode_runs_it():
    """A replanned candidate's per-device peaks are predicted as the run holds them (blocks and scratch)."""
    pytest.importorskip("mpplan.runtime.evaluate")
    config = load_config(REPO / "configs" / "quickstart.yaml", SMALL_GPT)
    driver_plan = plan(chain(4), resolve_devices(config), PlannerSettings.from_config(config.planner))
    evaluation = evaluate_safely(RuntimeEvaluator(steps=1, warmup=0), Candidate("k", (), config, driver_plan))
    assert evaluation.status is Status.OK, evaluation.error
    replanned = evaluation.measurement["replanned"]
    assert measured_peaks(evaluation.measurement) == replanned["devices"]
    assert replanned["max_peak_bytes"] == max(replanned["devices"].values())


@pytest.mark.parametrize("planned_for", ["cpu", "cuda"])
def test_runtime_evaluator_replans_for_kernels_of_another_device_type(planned_for):
    """Same graph, other device type: the actor derives the blocks and scratch for the kernels it runs."""
    pytest.importorskip("mpplan.runtime.evaluate")
    from mpplan.capture import program_from_config
    from mpplan.runtime.scratch import plan_as_run
    from mpplan.verify import verify

    config = load_config(REPO / "configs" / "quickstart.yaml", SMALL_GPT)
    program = program_from_config(config)
    settings = PlannerSettings.from_config(config.planner)
    # The driver's plan for virtual devices; planned "for cuda" stands for one derived for a GPU's kernels (none
    # here), which a CPU actor must not run as it is: the plain plan, without blocks, measures over it.
    driver_plan = (plan_as_run(program, resolve_devices(config), settings, "cpu") if planned_for == "cpu"
                   else plan(program.graph, resolve_devices(config), settings))
    verify(program.graph, driver_plan)
    candidate = Candidate("k", (), config, driver_plan, planned_for=planned_for)
    evaluation = evaluate_safely(RuntimeEvaluator(steps=1, warmup=0), candidate)
    assert evaluation.status is Status.OK, evaluation.error
    measured = measured_peaks(evaluation.measurement)
    virtual = set(evaluation.measurement["device_map"].values()) == {"cpu"}
    if planned_for == "cpu" and virtual:  # the driver's plan, as it predicted
        assert "replanned" not in evaluation.measurement
        assert measured == {d.name: d.peak_bytes for d in driver_plan.devices}
    else:
        replanned = evaluation.measurement["replanned"]
        assert replanned["graph_hash"] == driver_plan.graph_hash
        assert measured == replanned["devices"] != {d.name: d.peak_bytes for d in driver_plan.devices}

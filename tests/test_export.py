"""Exports: an accelerate device_map that accelerate accepts, and pipeline split points."""

from __future__ import annotations

import json

import pytest

from mpplan.config import Device
from mpplan.errors import PlanError
from mpplan.export import accelerate_device_map, export, split_points
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gpt_infer():
    from mpplan.capture.torch_capture import capture
    from mpplan.zoo.transformer import example_inputs, gpt

    model = gpt(n_layers=4, device="meta")
    graph = capture(model, example_inputs(batch=2, seq_len=32, device="meta"), mode="infer")
    return model, graph


def test_device_map_covers_every_parameter_and_uses_all_devices(gpt_infer):
    model, graph = gpt_infer
    static = sum(t.nbytes for t in graph.tensors if t.kind.value == "param")
    devices = [Device(f"cuda:{i}", static // 2) for i in range(4)]
    p = plan(graph, devices, PlannerSettings(placement="pipeline"))
    verify(graph, p)
    device_map = accelerate_device_map(p)
    assert set(device_map.values()) == {0, 1, 2, 3}
    keys = list(device_map)
    assert not any(a != b and b.startswith(a + ".") for a in keys for b in keys), "keys do not overlap"
    for name, _ in model.named_parameters():
        assert any(name == k or name.startswith(k + ".") for k in keys), f"{name} is not covered"
    accelerate = pytest.importorskip("accelerate")
    accelerate.utils.check_device_map(model, device_map)


def test_split_points_follow_stage_order(gpt_infer):
    _, graph = gpt_infer
    devices = [Device(f"cuda:{i}", 1 << 30) for i in range(2)]
    p = plan(graph, devices, PlannerSettings(placement="pipeline"))
    points = split_points(p)
    modules = list(p.module_devices)
    bounds = [0, *(modules.index(m) for m in points), len(modules)]
    stages = [modules[a:b] for a, b in zip(bounds, bounds[1:])]
    stage_devices = [p.module_devices[stage[0]] for stage in stages]
    assert all(p.module_devices[m] == device for stage, device in zip(stages, stage_devices) for m in stage)
    assert all(a != b for a, b in zip(stage_devices, stage_devices[1:])), "a split point changes device"
    assert stage_devices[:2] == ["cuda:0", "cuda:1"]
    # The LM head is tied to the embedding: it runs back on the embedding's device, as a last stage.
    assert stage_devices[2:] == ["cuda:0"] and stages[2] == ["head"]


def test_cli_export_and_errors(capsys, tmp_path, gpt_infer):
    from mpplan.cli import main
    from mpplan.plan import Plan, save_plan

    _, graph = gpt_infer
    p = plan(graph, [Device("cuda:0", 1 << 30), Device("cuda:1", 1 << 30)], PlannerSettings(placement="pipeline"))
    path = save_plan(p, tmp_path / "plan.json")
    assert main(["export", str(path), "--format", "accelerate"]) == 0
    assert json.loads(capsys.readouterr().out) == accelerate_device_map(p)
    with pytest.raises(PlanError, match="unknown format"):
        export(p, "onnx")
    bare = Plan(graph_name="g", graph_hash="h", devices=p.devices, schedule=(), placement={}, buffers={})
    with pytest.raises(PlanError, match="no module paths"):
        accelerate_device_map(bare)

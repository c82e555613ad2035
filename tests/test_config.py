"""Config schema: defaults, device expansion, overrides, and every error by its message."""

from __future__ import annotations

import textwrap

import pytest

from mpplan.config import (
    Config,
    apply_override,
    load_config,
    parse_config,
    resolve_devices,
    schema_fields,
)
from mpplan.errors import ConfigError

SYNTH = {"synthetic": {"kind": "chain", "n": 4}}


def parse(**sections):
    return parse_config({"model": SYNTH, **sections}, "run.yaml")


def test_defaults_and_sizes():
    config = parse(devices=[{"name": "a", "capacity": "16GiB", "reserve": "512MB"}])
    assert config.planner.schedule == "auto" and config.planner.alignment == 64
    (dev,) = resolve_devices(config)
    assert dev.capacity == 16 * 2**30 and dev.reserve == 512 * 10**6
    assert dev.usable == 16 * 2**30 - 512 * 10**6


def test_count_devices_expand_and_mix_with_named():
    config = parse(devices=[{"count": 2, "capacity": 1000, "kind": "cuda"}, {"name": "big", "capacity": "1KiB"}])
    assert [d.name for d in resolve_devices(config)] == ["cuda:0", "cuda:1", "big"]


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"model": {}}, "run.yaml: model: needs exactly one of torch, graph, synthetic; found none"),
        ({"model": {**SYNTH, "graph": {"path": "g.yaml"}}},
         "model: needs exactly one of torch, graph, synthetic; found graph, synthetic"),
        ({"model": SYNTH, "colour": 1},
         "run.yaml: colour: unknown key; expected one of model, devices, workload, planner, output"),
        ({"model": SYNTH, "planner": {"schedule": "fastest"}},
         "run.yaml: planner.schedule: expected one of auto, as_given"),
        ({"model": SYNTH, "planner": {"alignment": "x"}}, "run.yaml: planner.alignment: expected an integer, got 'x'"),
        ({"model": SYNTH, "planner": {"alignment": 0}},
         "run.yaml: planner.alignment: must be a positive number of bytes, got 0"),
        ({"model": SYNTH, "planner": {"parallel_safe": "yes"}},
         "run.yaml: planner.parallel_safe: expected true or false, got 'yes'"),
        ({"model": SYNTH, "planner": []}, "run.yaml: planner: expected a mapping, got list"),
        ({"model": SYNTH, "devices": {"name": "a"}}, "run.yaml: devices: expected a list, got dict"),
        ({"model": SYNTH, "devices": [{"name": "a"}]}, "run.yaml: devices[0].capacity: missing"),
        ({"model": SYNTH, "devices": [{"name": "a", "capacity": "12XB"}]},
         "run.yaml: devices[0].capacity: expected a size such as 16GiB"),
        ({"model": SYNTH, "devices": [{"name": "a", "capacity": -5}]},
         "run.yaml: devices[0].capacity: expected a non-negative size, got -5"),
        ({"model": SYNTH, "devices": [{"name": "a", "capacity": 0}]},
         "run.yaml: devices[0].capacity: must be positive"),
        ({"model": SYNTH, "devices": [{"capacity": 10}]}, "run.yaml: devices[0]: needs a name, or a count"),
        ({"model": SYNTH, "devices": [{"capacity": 10, "count": 2, "name": "a"}]},
         "run.yaml: devices[0]: give either name or count, not both"),
        ({"model": SYNTH, "devices": [{"capacity": 10, "count": 0}]},
         "run.yaml: devices[0].count: must be at least 1, got 0"),
        ({"model": SYNTH, "devices": [{"capacity": 10, "name": "a", "reserve": 10}]},
         "run.yaml: devices[0].reserve: must be below the capacity"),
        ({"model": SYNTH, "devices": [{"capacity": 10, "name": "a"}, {"capacity": 10, "name": "a"}]},
         "run.yaml: devices[1].name: device 'a' named twice"),
        ({"model": SYNTH, "workload": {"batch": 0}}, "run.yaml: workload.batch: must be positive, got 0"),
        ({"model": SYNTH, "workload": {"batch": "four"}}, "run.yaml: workload.batch: expected an integer, got 'four'"),
        ({"model": {"synthetic": {"n": 3}}}, "run.yaml: model.synthetic.kind: missing"),
        ({"model": {"graph": {"path": "nowhere.yaml"}}}, "run.yaml: model.graph.path: file not found"),
        ({"model": {"graph": {"path": "g.yaml", "format": "onnx"}}},
         "run.yaml: model.graph.format: expected one of auto, mpplan, node-link, got 'onnx'"),
        ({"model": {"torch": {"factory": "nocolon"}}},
         "run.yaml: model.torch.factory: expected 'package.module:callable', got 'nocolon'"),
        ({"model": {"torch": {"factory": "m:f", "mode": "eval"}}},
         "run.yaml: model.torch.mode: expected one of infer, train, got 'eval'"),
        ({"model": {"torch": {"factory": "m:f", "dtype": "float13"}}},
         "run.yaml: model.torch.dtype: unknown dtype 'float13'"),
        ({"model": {"torch": {"factory": "m:f", "inputs": [{"shape": ["batch"]}]}}},
         "run.yaml: model.torch.inputs[0].shape[0]: 'batch' is not a workload key"),
        ({"model": {"torch": {"factory": "m:f", "inputs": [{"shape": [2], "size": 3}]}}},
         "run.yaml: model.torch.inputs[0].size: unknown key"),
        ({"model": {"torch": {"factory": "m:f", "inputs": {"ids": {"dtype": "int64"}}}}},
         "run.yaml: model.torch.inputs.ids: expected {shape"),
        ({"model": {"torch": {"factory": "m:f", "inputs": [{"shape": [-1]}]}}},
         "run.yaml: model.torch.inputs[0].shape[0]: expected a non-negative integer"),
        ({"model": {"torch": {"factory": "m:f", "inputs": "x"}}},
         "run.yaml: model.torch.inputs: expected a list or mapping of tensor specs"),
    ],
)
def test_errors_name_file_and_key(raw, message):
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "run.yaml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_load_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="missing.yaml: file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+: invalid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match=r"scalar.yaml: \(top level\): expected a mapping, got int"):
        load_config(scalar)


def test_yaml_is_read_safely(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(evil)


def test_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            """
            model: {synthetic: {kind: chain, n: 4}}
            devices: [{name: a, capacity: 1GiB}]
            """
        )
    )
    config = load_config(path, ["planner.schedule=dfs", "devices.0.capacity=2GiB", "planner.parallel_safe=true"])
    assert config.planner.schedule == "dfs" and config.planner.parallel_safe is True
    assert config.devices[0].capacity == 2 * 2**30
    with pytest.raises(ConfigError, match=r"--set 'planner': expected dotted.key=value"):
        load_config(path, ["planner"])
    with pytest.raises(ConfigError, match=r"devices.5: no such list element"):
        load_config(path, ["devices.5.capacity=1"])
    with pytest.raises(ConfigError, match=r"planner.schedule: expected one of"):
        load_config(path, ["planner.schedule=nope"])


def test_override_does_not_mutate_input():
    raw = {"planner": {"schedule": "auto"}}
    out = apply_override(raw, "planner.schedule=bfs", "x")
    assert raw["planner"]["schedule"] == "auto" and out["planner"]["schedule"] == "bfs"


def test_schema_lists_every_key():
    keys = {row[0] for row in schema_fields(Config)}
    assert {"model.torch.factory", "devices[].capacity", "planner.alignment", "output.dir"} <= keys
    assert all(row[3] for row in schema_fields(Config)), "every key is documented"


PUBLIC = (
    "Config Device DeviceSpec GENERATORS GraphModel MAX_AXIS_VALUES MAX_DEVICES MAX_GRID MAX_INT MAX_SYNTHETIC_UNITS "
    "ModelSection OutputSection PlannerSection RematSection SearchMeasureSection SearchSection ShiftSection Size "
    "TorchModel apply_override axis_generator axis_values batch_axis_key capacity_fraction format_override "
    "load_config parse_budget parse_config resolve_devices schema_fields"
).split()


def test_the_package_keeps_every_public_name_of_the_old_module():
    import mpplan.config

    assert sorted(mpplan.config.__all__) == sorted(PUBLIC)
    assert all(getattr(mpplan.config, name, None) is not None for name in PUBLIC)


def test_no_pass_imports_the_config_and_config_modules_stay_small():
    """Passes read budgets through mpplan.budget: the config sits above them, not below."""
    import ast
    from pathlib import Path

    import mpplan

    root = Path(mpplan.__file__).parent
    for path in (root / "passes").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n == "mpplan.config" or n.startswith("mpplan.config.") for n in names), path
    for path in (root / "config").glob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path


def test_budget_forms():
    from mpplan.budget import capacity_fraction, parse_budget

    assert parse_budget("1KiB") == 1024 and parse_budget(0.5) == 0.5 and parse_budget(64) == 64
    assert capacity_fraction("0.9 capacity") == 0.9 and capacity_fraction("90% of the capacity") == 0.9
    assert capacity_fraction("16GiB") is None and capacity_fraction(0.9) is None
    for bad in (0.0, 1.5, 0, "-1", True):
        with pytest.raises(ValueError):
            parse_budget(bad)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        capacity_fraction("120% capacity")

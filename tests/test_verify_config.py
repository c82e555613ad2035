"""``mpplan verify --config``: devices, capacities, alignment, parallel_safe and grads come from the
config, and a plan whose copies of them differ fails naming the field; without a config the output
says what was taken on trust."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import chain
from mpplan.capture.graph_file import save_graph
from mpplan.cli import main

CONFIG = """
model: {{graph: {{path: g.yaml}}}}
devices: [{{name: gpu0, capacity: 1MiB}}, {{name: gpu1, capacity: 2MiB, reserve: 1KiB}}]
planner: {{alignment: 64, placement: pipeline{extra}}}
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def planned(capsys, tmp_path) -> tuple[Path, Path]:
    """A two-device plan of an 8-op chain and the config it was made from."""
    save_graph(chain(8, nbytes=1000), tmp_path / "g.yaml")
    config = tmp_path / "run.yaml"
    config.write_text(textwrap.dedent(CONFIG.format(extra="")))
    code, _, err = run(capsys, "plan", str(config), "--out", str(tmp_path / "out"))
    assert code == 0, err
    return tmp_path / "out" / "plan.json", config


def edited(path: Path, edit) -> Path:
    data = json.loads(path.read_text())
    edit(data)
    out = path.with_name("edited.json")
    out.write_text(json.dumps(data))
    return out


def test_with_config_nothing_is_taken_on_trust(capsys, planned):
    plan, config = planned
    code, out, err = run(capsys, "verify", str(plan), "--config", str(config))
    assert code == 0, err
    assert "ok" in out and "trust" not in out


def test_without_config_the_output_says_what_was_trusted(capsys, planned, tmp_path):
    plan, _ = planned
    code, out, err = run(capsys, "verify", str(plan), "--graph", str(tmp_path / "g.yaml"))
    assert code == 0, err
    assert "taken on trust from the plan: device names, capacities" in out and "--config" in out


def _more_capacity(data):
    data["devices"][0]["capacity_bytes"] *= 2


def _renamed(data):
    data["devices"][1]["name"] = "gpu7"
    for key, value in list(data["placement"].items()):
        data["placement"][key] = "gpu7" if value == "gpu1" else value
    for buf in data["buffers"].values():
        buf["device"] = "gpu7" if buf["device"] == "gpu1" else buf["device"]
    for copy in data["copies"]:
        copy["src"] = "gpu7" if copy["src"] == "gpu1" else copy["src"]
        copy["dst"] = "gpu7" if copy["dst"] == "gpu1" else copy["dst"]


def _looser_alignment(data):
    data["planner"]["settings"]["alignment"] = 1


def _parallel_safe_claimed(data):
    data["planner"]["settings"]["parallel_safe"] = True


def _grads(data):
    settings = data["planner"]["settings"]
    settings["grads"] = "static" if settings["grads"] == "dynamic" else "dynamic"


@pytest.mark.parametrize(
    "edit, field",
    [
        (_more_capacity, "devices[0].capacity_bytes"),
        (_renamed, "devices: the plan lists gpu0, gpu7, the config has gpu0, gpu1"),
        (_looser_alignment, "planner.settings.alignment"),
        (_parallel_safe_claimed, "planner.settings.parallel_safe"),
        (_grads, "planner.settings.grads"),
    ],
)
def test_a_plan_that_disagrees_with_its_config_fails_naming_the_field(capsys, planned, edit, field):
    plan, config = planned
    bad = edited(plan, edit)
    code, _, err = run(capsys, "verify", str(bad), "--config", str(config))
    assert code == 1 and err.count("\n") == 1
    assert field in err


def test_renamed_devices_and_looser_alignment_pass_on_trust_alone(capsys, planned, tmp_path):
    """The edits above are self-consistent: only the config can catch them."""
    plan, _ = planned
    for edit in (_renamed, _more_capacity):
        code, out, err = run(capsys, "verify", str(edited(plan, edit)), "--graph", str(tmp_path / "g.yaml"))
        assert code == 0, err
        assert "trust" in out


def test_the_config_capacity_decides_the_fit(capsys, planned, tmp_path):
    """With --config the capacity is the config's: a smaller device makes the same plan a misfit."""
    plan, config = planned
    small = tmp_path / "small.yaml"
    small.write_text(config.read_text().replace("capacity: 1MiB", "capacity: 1KiB"))
    code, _, err = run(capsys, "verify", str(plan), "--config", str(small))
    assert code == 1 and "devices[0].capacity_bytes" in err


@pytest.mark.parametrize(("value", "says"), [
    ("nope", "planner.settings.grads: expected one of static, dynamic, got 'nope'"),  # before: taken as static
    ("Dynamic", "planner.settings.grads: expected one of static, dynamic, got 'Dynamic'"),
])
def test_a_grads_setting_taken_on_trust_must_be_a_known_one(capsys, planned, tmp_path, value, says):
    """Without a config, grads is the plan's own word: a word other than static or dynamic is a finding,
    not a plan checked as if it said static."""
    plan, _ = planned

    def edit(data):
        data["planner"]["settings"]["grads"] = value

    code, _, err = run(capsys, "verify", str(edited(plan, edit)), "--graph", str(tmp_path / "g.yaml"))
    assert code == 1 and err.strip().endswith(says), err


def test_a_parallel_safe_setting_taken_on_trust_must_be_true_or_false():
    """Through the API a ``PlanSettings`` is not type-checked when made: ``bool("no")`` must not turn it on."""
    from dataclasses import replace

    from mpplan.config import Device
    from mpplan.errors import VerificationError
    from mpplan.planner import plan
    from mpplan.verify import verify

    graph = chain(4)
    p = plan(graph, [Device("gpu0", 1 << 20)])
    with pytest.raises(VerificationError, match="planner.settings.parallel_safe: expected true or false, got 'no'"):
        verify(graph, replace(p, settings=replace(p.settings, parallel_safe="no")))

"""End-to-end CLI: inspect, plan, verify; errors are one line with exit code 2."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import CHECKMATE, REPO, SHARED, SHARED_DATA_REASON, tiny
from mpplan.capture.graph_file import save_graph
from mpplan.cli import main
from mpplan.plan import load_plan
from mpplan.units import format_size


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_config(tmp_path, body: str, name: str = "run.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def tiny_file(tmp_path):
    return save_graph(tiny(), tmp_path / "tiny.yaml")


def test_inspect_graph_file_json(capsys, tiny_file):
    code, out, err = run(capsys, "inspect", str(tiny_file), "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["ops"] == 2 and data["tensors"] == 4
    assert data["static_bytes"] == 128  # x (input) + w (param)
    assert data["bytes_by_kind"] == {"activation": 64, "input": 64, "param": 64}
    assert data["max_op_working_set_bytes"] == 64
    assert data["as_given_peak_bytes"] == 128 + 64


def test_inspect_config_text(capsys, tmp_path):
    config = write_config(tmp_path, "model: {synthetic: {kind: chain, n: 5}}\n")
    code, out, _ = run(capsys, "inspect", str(config))
    assert code == 0
    assert "ops" in out and "as-given peak" in out


def test_plan_then_verify(capsys, tmp_path, tiny_file):
    config = write_config(
        tmp_path,
        f"""
        model: {{graph: {{path: {tiny_file.name}}}}}
        devices: [{{name: gpu0, capacity: 1MiB}}]
        planner: {{alignment: 1}}
        """,
    )
    out_dir = tmp_path / "out"
    code, out, err = run(capsys, "plan", str(config), "--out", str(out_dir))
    assert code == 0, err
    assert "lower bound" in out and "perfect allocator" in out
    plan = load_plan(out_dir / "plan.json")
    assert plan.devices[0].peak_bytes == plan.devices[0].lower_bound_bytes == 192
    code, out, err = run(capsys, "verify", str(out_dir / "plan.json"), "--graph", str(tiny_file))
    assert code == 0 and "ok" in out
    code, out, err = run(capsys, "verify", str(out_dir / "plan.json"), "--config", str(config))
    assert code == 0


def test_plan_that_does_not_fit_exits_3(capsys, tmp_path, tiny_file):
    config = write_config(
        tmp_path,
        f"""
        model: {{graph: {{path: {tiny_file.name}}}}}
        devices: [{{name: gpu0, capacity: 100}}]
        """,
    )
    code, out, err = run(capsys, "plan", str(config), "--out", str(tmp_path / "o"))
    assert code == 3
    peak = load_plan(tmp_path / "o" / "plan.json").max_peak_bytes
    assert f"gpu0 needs {peak - 100} B ({peak - 100} bytes) more than its capacity of 100 B (peak {peak} B)" in err
    assert (tmp_path / "o" / "plan.json").is_file(), "the best infeasible plan is still written"
    assert "alone touches" not in err  # 100 bytes hold any one op of tiny: the placement is what misses


def test_a_misfit_names_every_device_in_human_sizes_and_says_so_first(capsys, tmp_path):
    # regression: one device was named, in raw bytes, under "plan written to ... (verified)"
    config = write_config(
        tmp_path,
        """
        model: {synthetic: {kind: transformer, layers: 4, train: true, batch: 4, seq: 64, hidden: 64, heads: 2,
                            vocab: 64}}
        devices: [{name: a, capacity: 256KiB}, {name: b, capacity: 256KiB}]
        planner: {placement: pipeline}
        """,
    )
    code, out, err = run(capsys, "plan", str(config), "--out", str(tmp_path / "o"))
    assert code == 3
    plan = load_plan(tmp_path / "o" / "plan.json")
    over = [d for d in plan.devices if d.peak_bytes > d.capacity_bytes]
    assert len(over) == 2, "both devices miss: the test needs a plan that misfits on every device"
    summary, where = out.strip().splitlines()[-2:]
    assert summary.startswith("does not fit on 2 of 2 device(s): ") and "plan written to" not in out
    assert where.startswith("the best plan found (verified, capacities aside) is written to ")
    assert str(tmp_path / "o" / "plan.json") in where
    (line,) = [line for line in err.splitlines() if line.startswith("mpplan: error:")]
    assert line.startswith("mpplan: error: does not fit: ")
    for d in over:
        missing = d.peak_bytes - d.capacity_bytes
        text = f"{d.name} needs {format_size(missing)} ({missing} bytes) more than its capacity of 256.00 KiB"
        assert text in line and text in summary


def test_plan_without_out_never_writes_over_a_search(capsys, tmp_path, monkeypatch, tiny_file):
    # regression: `mpplan plan` defaulted to output.dir, the folder `mpplan search` writes, and replaced its report
    config = write_config(
        tmp_path,
        f"""
        model: {{graph: {{path: {tiny_file.name}}}}}
        devices: [{{name: gpu0, capacity: 1MiB}}]
        output: {{dir: runs/x}}
        """,
    )
    monkeypatch.chdir(tmp_path)
    search = tmp_path / "runs" / "x"
    search.mkdir(parents=True)
    (search / "results.jsonl").write_text("{}\n")
    (search / "report.md").write_text("the search's report\n")
    code, out, err = run(capsys, "plan", str(config))
    assert code == 0, err
    assert (search / "plan" / "plan.json").is_file() and (search / "plan" / "report.md").is_file()
    assert (search / "report.md").read_text() == "the search's report\n" and not (search / "plan.json").exists()
    assert f"plan written to {Path('runs/x/plan/plan.json')} (verified)" in out
    for folder in (search, tmp_path / "best"):
        (tmp_path / "best").mkdir(exist_ok=True)
        (tmp_path / "best" / "result.json").write_text("{}")
        code, _, err = run(capsys, "plan", str(config), "--out", str(folder))
        assert code == 2 and f"{folder} holds the results of mpplan search" in err and "another folder" in err
    assert not (tmp_path / "best" / "plan.json").exists() and (search / "results.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("verb", ["", "inspect", "plan", "verify", "run", "search", "report", "export"])
def test_help_has_no_rst_markup(capsys, verb):
    with pytest.raises(SystemExit) as done:
        main([verb, "--help"] if verb else ["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: mpplan") and "`" not in out


def test_every_argument_of_every_verb_says_what_it_is():
    # regression: `mpplan export --help` listed --format's two choices and said nothing of either
    import argparse

    from mpplan.cli import build_parser

    (verbs,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [f"{verb} {action.dest}" for verb, sub in verbs.choices.items() for action in sub._actions
              if not action.help]
    assert not silent, silent


def test_inspect_prints_the_totals_by_kind_apart_from_the_peak(capsys, tmp_path, tiny_file):
    code, out, _ = run(capsys, "inspect", str(tiny_file))
    assert code == 0
    top, kinds = out.strip().split("\n\n")
    assert top.splitlines()[-1].startswith("as-given peak")
    assert kinds.splitlines()[0].startswith("tensor kind") and "all tensors of the step" in kinds.splitlines()[0]
    assert [line.split()[0] for line in kinds.splitlines()[2:]] == ["activation", "input", "param"]
    assert not any(line.startswith(" ") for line in out.splitlines()[2:]), "no row indented under another"


def test_an_op_larger_than_every_device_is_named(capsys, tmp_path, tiny_file):
    config = write_config(
        tmp_path,
        f"""
        model: {{graph: {{path: {tiny_file.name}}}}}
        devices: [{{name: gpu0, capacity: 40}}, {{name: gpu1, capacity: 40}}]
        """,
    )
    code, _, err = run(capsys, "plan", str(config), "--out", str(tmp_path / "o"))
    assert code == 3
    assert "op 'fc' alone touches 64 bytes of activations, more than any device holds" in err


def test_verify_rejects_corrupt_plan(capsys, tmp_path, tiny_file):
    config = write_config(
        tmp_path,
        f"""
        model: {{graph: {{path: {tiny_file.name}}}}}
        devices: [{{name: gpu0, capacity: 1MiB}}]
        """,
    )
    run(capsys, "plan", str(config), "--out", str(tmp_path / "o"))
    path = tmp_path / "o" / "plan.json"
    data = json.loads(path.read_text())
    data["devices"][0]["peak_bytes"] += 1
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "verify", str(path), "--graph", str(tiny_file))
    assert code == 1 and err.count("\n") == 1 and "peak_bytes" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "nowhere.yaml"], "nowhere.yaml"),
        (["plan", "nowhere.yaml"], "nowhere.yaml: file not found"),
        (["verify", "nowhere.json", "--graph", "g.yaml"], "nowhere.json: file not found"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("mpplan: error: ") and err.count("\n") == 1 and message in err


def test_bad_config_key_is_one_line(capsys, tmp_path):
    config = write_config(tmp_path, "model: {synthetic: {kind: chain, n: 3}}\nplanner: {schedul: dfs}\n")
    code, _, err = run(capsys, "plan", str(config))
    assert code == 2
    assert err == (f"mpplan: error: {config}: planner.schedul: unknown key; expected one of schedule, assign, "
                   "alignment, parallel_safe, grads, placement, device_map, no_split, shift, remat\n")


def test_plan_without_devices_is_an_error(capsys, tmp_path):
    config = write_config(tmp_path, "model: {synthetic: {kind: chain, n: 3}}\n")
    code, _, err = run(capsys, "plan", str(config))
    assert code == 2 and "devices: needs at least one device" in err


def test_plan_json_is_deterministic(capsys, tmp_path):
    config = write_config(
        tmp_path, "model: {synthetic: {kind: chain, n: 30}}\ndevices: [{name: g, capacity: 1GiB}]\n"
    )
    for out in ("a", "b"):
        assert run(capsys, "plan", str(config), "--out", str(tmp_path / out))[0] == 0
    a, b = (json.loads((tmp_path / o / "plan.json").read_text()) for o in ("a", "b"))
    del a["planner"]["seconds"], b["planner"]["seconds"]
    assert a == b


CONFIGS = sorted((REPO / "configs").glob("*.yaml"))


def test_configs_folder_ships_ready_runs():
    assert len(CONFIGS) >= 5, "configs/ ships ready runs"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_configs_folder_configs_parse(path):
    from mpplan.config import load_config

    graph_file = ((yaml.safe_load(path.read_text())["model"].get("graph") or {}).get("path"))
    if graph_file and (path.parent / graph_file).resolve().is_relative_to(SHARED) and not CHECKMATE.is_dir():
        pytest.skip(SHARED_DATA_REASON)
    load_config(path)


def test_plan_with_remat_records_the_recomputes_and_verifies(capsys, tmp_path):
    body = """
        model: {{synthetic: {{kind: transformer, layers: 2, train: true, batch: 4, seq: 32, hidden: 16, heads: 2,
                             vocab: 32}}}}
        devices: [{{name: gpu0, capacity: 1GiB}}]
        planner: {{remat: {remat}}}
        """
    plain = write_config(tmp_path, body.format(remat="{policy: none}"), "plain.yaml")
    sqrt = write_config(tmp_path, body.format(remat="{policy: sqrt}"), "sqrt.yaml")
    printed = {}
    for config in (plain, sqrt):
        code, printed[config.stem], err = run(capsys, "plan", str(config), "--out", str(tmp_path / config.stem))
        assert code == 0, err
    assert "without recomputation" not in printed["plain"]
    assert "these settings without recomputation" in printed["sqrt"] and "recomputation (sqrt)" in printed["sqrt"]
    assert "Recomputation (sqrt)" in (tmp_path / "sqrt" / "report.md").read_text()
    base, remat = (load_plan(tmp_path / name / "plan.json") for name in ("plain", "sqrt"))
    assert not base.remat and remat.remat and remat.compute_overhead > 0
    assert remat.settings["remat"]["policy"] == "sqrt"
    assert remat.max_peak_bytes < base.max_peak_bytes
    code, out, err = run(capsys, "verify", str(tmp_path / "sqrt" / "plan.json"), "--config", str(sqrt))
    assert code == 0 and "ok" in out, err


@pytest.mark.parametrize("policy", ["budget", "none", "sqrt"])
def test_bad_remat_budget_is_one_line(capsys, tmp_path, policy):
    """Under any policy: a typo'd budget is bad input even while the policy leaves it unused."""
    config = write_config(
        tmp_path,
        f"""
        model: {{synthetic: {{kind: chain, n: 5}}}}
        planner: {{remat: {{policy: {policy}, budget: lots}}}}
        """,
    )
    code, _, err = run(capsys, "plan", str(config))
    assert code == 2
    assert err.startswith(f"mpplan: error: {config}: planner.remat.budget:") and err.count("\n") == 1


def test_one_shot_verbs_run_with_the_cyclic_collector_paused(capsys, monkeypatch, tiny_file):
    import gc

    from mpplan import cli

    seen = {}

    def spy(name):
        def verb(args):
            seen[name] = gc.isenabled()
            return 0
        return verb

    for name in ("cmd_inspect", "cmd_search"):
        monkeypatch.setattr(cli, name, spy(name))
    assert gc.isenabled()
    assert main(["inspect", str(tiny_file)]) == 0 and main(["search", "any.yaml"]) == 0
    assert seen == {"cmd_inspect": False, "cmd_search": True} and gc.isenabled()


def test_the_cli_starts_without_numpy_torch_ray_or_matplotlib() -> None:
    """``mpplan --help`` and a verb's help load none of the heavy libraries (numpy alone took 0.2 s of a
    0.35 s start); the verbs import them when they run.  A fresh interpreter, so other tests' imports do not count."""
    import subprocess
    import sys

    probe = textwrap.dedent(
        """
        import sys
        from mpplan.cli import main
        for argv in (["--help"], ["plan", "--help"]):
            try:
                main(argv)
            except SystemExit:
                pass
        heavy = ("numpy", "torch", "ray", "matplotlib", "scipy", "highspy")
        print(" ".join(sorted(name for name in heavy if name in sys.modules)) or "none")
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "none"

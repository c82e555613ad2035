"""docs/tutorial.md, step by step, so the tutorial cannot rot.

"My model OOMs on one GPU -> trained on four": the one-device config misses its
capacity (exit 3, by the number of bytes the tutorial quotes), the four-device config
plans (exit 0), verifies, exports an accelerate device map and reports with figures,
and ``mpplan.apply`` trains the model on the plan's placement exactly like eager
PyTorch.  ``mpplan run`` and ``mpplan search`` are left to tests/test_runtime.py and
tests/test_cluster_search.py (they take minutes here); the tutorial's search space is
only checked to expand as the tutorial says.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from mpplan.cli import main
from mpplan.plan import load_plan
from mpplan.report import plan_text

torch = pytest.importorskip("torch")

ONE_GPU = REPO / "configs" / "tutorial_one_gpu.yaml"
FOUR_GPUS = REPO / "configs" / "tutorial_four_gpus.yaml"
TUTORIAL = REPO / "docs" / "tutorial.md"
MiB = 1 << 20


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def four(tmp_path_factory) -> Path:
    """`mpplan plan configs/tutorial_four_gpus.yaml` once for the module: the folder it wrote."""
    out = tmp_path_factory.mktemp("tutorial") / "four"
    assert main(["-q", "plan", str(FOUR_GPUS), "--out", str(out)]) == 0
    return out


def test_one_gpu_does_not_fit_and_says_by_how_much(capsys, tmp_path):
    code, out, _ = cli(capsys, "inspect", str(ONE_GPU), "--json")
    assert code == 0
    sizes = json.loads(out)
    assert sizes["static_bytes"] < 24 * MiB < sizes["as_given_peak_bytes"]  # the weights fit, the step does not

    code, out, err = cli(capsys, "plan", str(ONE_GPU), "--out", str(tmp_path / "one"))
    assert code == 3
    missing = int(re.search(r"cuda:0 needs [\d.]+ \w+ \((\d+) bytes\) more than its capacity", err).group(1))
    plan = json.loads((tmp_path / "one" / "plan.json").read_text())  # the best infeasible plan is still written
    (device,) = plan["devices"]
    assert device["capacity_bytes"] == 24 * MiB
    assert device["peak_bytes"] == device["capacity_bytes"] + missing
    assert device["peak_bytes"] > 2 * device["capacity_bytes"]  # not a near miss: more than twice the device
    # The tutorial quotes this very line; a planner that changes the number must update the tutorial too.
    assert err.strip().splitlines()[-1] in TUTORIAL.read_text(), "docs/tutorial.md quotes another misfit"
    assert "this plan" in out and "placement: single" in out
    _assert_quoted(_device_rows(out), "one-GPU plan table")
    code, out, _ = cli(capsys, "inspect", str(ONE_GPU))
    assert code == 0
    _assert_quoted(out.splitlines()[:1], "inspect header (graph name and hash)")


def test_four_gpus_fit_and_verify(capsys, four):
    plan = json.loads((four / "plan.json").read_text())
    assert plan["planner"]["settings"]["placement_chosen"] == "pipeline"
    devices = plan["devices"]
    assert [d["name"] for d in devices] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert all(0 < d["peak_bytes"] <= d["capacity_bytes"] == 24 * MiB for d in devices)
    peak = max(d["peak_bytes"] for d in devices)
    # The tutorial quotes the plan's table: its largest peak, as `mpplan plan` prints it, is in there.
    assert f"{_human(peak)} ({peak})" in TUTORIAL.read_text(), "docs/tutorial.md quotes another four-GPU peak"

    _assert_quoted(_device_rows(plan_text(load_plan(four / "plan.json"), {})), "four-GPU plan table")

    code, out, _ = cli(capsys, "verify", str(four / "plan.json"), "--config", str(FOUR_GPUS))
    assert code == 0
    assert out.startswith(f"{four / 'plan.json'}: ok (") and "4 devices" in out
    _assert_quoted([out.strip().split(": ", 1)[1]], "verify's counts")


def _device_rows(table: str) -> list[str]:
    """The per-device rows of a plan table, as ``mpplan plan`` prints them."""
    return [line for line in table.splitlines() if line.startswith("cuda:")]


def _assert_quoted(lines: list[str], what: str) -> None:
    """Regression: the tutorial quoted a stale hash, buffer count and table cells; every line is quoted verbatim."""
    text = TUTORIAL.read_text()
    assert lines and all(line in text for line in lines), f"docs/tutorial.md quotes another {what}: {lines}"


def test_batch_16_fits_with_sqrt_because_adam_state_moves_to_the_last_stage():
    """The search's best point (step 4).  It fits only because the DP also tries the optimizer's
    arithmetic on the last stage: with every Adam moment beside its parameter, cuda:3 needs
    24.57 MiB of its 24."""
    import mpplan
    from mpplan.capture import graph_from_config
    from mpplan.planner import PlannerSettings, placed_graph, plan

    config = mpplan.load_config(FOUR_GPUS, ["workload.batch=16", "planner.remat.policy=sqrt"])
    graph = graph_from_config(config)
    devices = [mpplan.Device(f"cuda:{i}", 24 * MiB) for i in range(4)]
    p = plan(graph, devices, PlannerSettings.from_config(config.planner))
    assert p.max_peak_bytes <= 24 * MiB
    placed = placed_graph(graph, p)
    topo = placed.graph.topology
    home = {t.name: placed.storage_device[topo.storage_of[topo.tensor_index[t.name]]] for t in graph.tensors}
    moved = [t.name for t in graph.tensors if t.name.endswith(".exp_avg_sq") and home[t.name] != home[t.name[:-11]]]
    assert moved and {home[name] for name in moved} == {"cuda:3"}


def test_export_gives_accelerate_a_device_map_over_the_four_devices(capsys, four):
    code, out, _ = cli(capsys, "export", str(four / "plan.json"), "--format", "accelerate")
    assert code == 0
    device_map = json.loads(out)
    assert set(device_map.values()) == {0, 1, 2, 3}
    assert device_map["tok_emb"] == 0 and device_map["head"] == 3
    code, out, _ = cli(capsys, "export", str(four / "plan.json"), "--format", "split-points")
    assert code == 0 and len(json.loads(out)) == 3  # three cuts make four stages


def test_report_writes_html_and_real_figures(capsys, four):
    code, out, _ = cli(capsys, "report", str(four), "--html")
    assert code == 0 and "report.html" in out
    assert (four / "report.html").stat().st_size > 0
    markdown = (four / "report.md").read_text()
    for figure in ("memory_timeline.png", "devices.png"):
        assert f"]({figure})" in markdown
        _assert_picture(four / figure)


def test_the_search_space_expands_as_the_tutorial_says():
    from mpplan.cluster.space import axes, split_batch_axis
    from mpplan.config import load_config

    config = load_config(FOUR_GPUS)
    search = config.search
    assert search.objective == "max_batch"
    batch, others = split_batch_axis(search, axes(search, config.source))
    assert batch.values == (8, 16, 32, 64)
    assert [(a.key, a.values) for a in others] == [("planner.remat.policy", ("none", "sqrt"))]


def test_apply_trains_on_the_plans_placement_like_eager(four):
    """The tutorial's last step: an ordinary loop on ``mpplan.apply(model, plan, ...)``."""
    import torch.nn.functional as F

    import mpplan
    from mpplan.capture import build_torch_model

    config = mpplan.load_config(FOUR_GPUS)
    plan = mpplan.load_plan(four / "plan.json")
    torch.manual_seed(0)
    model, example_inputs = build_torch_model(config)
    reference = copy.deepcopy(model)
    # devices="virtual" pins the test to CPU memory even on a machine with four GPUs (the tutorial
    # leaves it out: cuda:0..3 when there are four GPUs, virtual devices otherwise).
    planned = mpplan.apply(model, plan, example_inputs, optimizer="adam", devices="virtual")
    assert set(planned.planned.values()) == {"cuda:0", "cuda:1", "cuda:2", "cuda:3"}
    assert planned.planned["tok_emb"] == "cuda:0" and planned.planned["head"] == "cuda:3"

    def train(module: torch.nn.Module, steps: int = 3) -> list[float]:
        torch.manual_seed(1)
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
        losses = []
        for _ in range(steps):
            tokens = torch.randint(0, 1024, (8, 129))
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            logits = module(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.to(logits.device).flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    got = train(planned)
    want = train(reference)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)  # virtual devices, same kernels: equal in practice
    assert got[-1] < got[0]
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7), name


@pytest.mark.skipif(torch.cuda.device_count() >= 4, reason="the block would run on cuda:0..3 with a CPU-traced plan")
def test_the_tutorials_python_block_runs_as_written(four, monkeypatch, capsys):
    """The ```python block of docs/tutorial.md, verbatim but for the plan's folder, prints what the tutorial shows."""
    text = TUTORIAL.read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    assert '"runs/tutorial_four_gpus/plan/plan.json"' in block
    monkeypatch.chdir(REPO)
    runnable = block.replace("runs/tutorial_four_gpus/plan/plan.json", str(four / "plan.json"))
    code = compile(runnable, "tutorial.md", "exec")
    exec(code, {})  # noqa: S102 - the tutorial's own code, run as a reader would
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] in text  # the placement dict, as quoted
    losses = [float(line.split("loss ")[1]) for line in printed[1:]]
    assert len(losses) == 3 and losses[2] < losses[0]
    assert [line for line in printed[1:] if line not in text] == []  # the losses the tutorial quotes


def _assert_picture(path: Path) -> None:
    import matplotlib.image as mpimg

    assert path.is_file() and path.stat().st_size > 5_000
    pixels = mpimg.imread(path)
    height, width = pixels.shape[:2]
    assert width >= 300 and height >= 200
    rgb = pixels[..., :3]
    assert not (rgb == rgb.flat[0]).all(), f"{path.name} is one colour"
    assert float(rgb.std()) > 0.01, f"{path.name} is blank"


def _human(n: int) -> str:
    from mpplan.units import format_size

    return format_size(n)

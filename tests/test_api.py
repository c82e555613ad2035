"""The facade: every name in ``mpplan.__all__`` is what docs/api.md says it is, and each documented
verb works when called through ``mpplan.<name>`` (regression: ``mpplan.plan`` was the module)."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys

import pytest

import mpplan
from conftest import REPO, chain

DOC = (REPO / "docs" / "api.md").read_text()
DOCUMENTED = dict(re.findall(r"^\| `(\w+)` \| (function|class|exception) \|", DOC, flags=re.M))


def test_every_public_name_is_documented_once_and_nothing_else() -> None:
    assert sorted(DOCUMENTED) == sorted(mpplan.__all__)
    assert len(re.findall(r"^\| `\w+` \|", DOC, flags=re.M)) == len(DOCUMENTED)


@pytest.mark.parametrize("name", sorted(mpplan.__all__))
def test_each_name_is_the_kind_the_docs_say(name: str) -> None:
    value = getattr(mpplan, name)
    kind = DOCUMENTED[name]
    if kind == "function":
        assert inspect.isfunction(value), f"mpplan.{name} is {value!r}, documented as a function"
    elif kind == "exception":
        assert isinstance(value, type) and issubclass(value, mpplan.MpplanError)
    else:
        assert isinstance(value, type) and not issubclass(value, BaseException)


def test_verbs_beat_their_submodules_whatever_was_imported_first() -> None:
    # a fresh interpreter: the submodules are imported before the verbs are looked up
    code = (
        "import mpplan.plan, mpplan.verify, mpplan.capture.graph_file, mpplan, inspect\n"
        "from mpplan.plan import Plan\n"
        "assert all(inspect.isfunction(getattr(mpplan, n)) for n in ('plan', 'verify', 'capture')), "
        "[getattr(mpplan, n) for n in ('plan', 'verify', 'capture')]\n"
        "assert mpplan.Plan is Plan and mpplan.save_plan.__module__ == 'mpplan.plan'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert importlib.import_module("mpplan.plan").Plan is mpplan.Plan


def test_graph_verbs_called_through_the_facade(tmp_path) -> None:
    graph = mpplan.synthetic_graph("transformer", layers=1, train=True, batch=2, seq=8, hidden=8, heads=2, vocab=16)
    path = mpplan.save_graph(graph, tmp_path / "g.json")
    assert mpplan.load_graph(path).content_hash == graph.content_hash
    order = mpplan.schedule(graph, "greedy_free")
    assert sorted(order) == list(range(len(graph.ops)))
    records = [(64, 0, 1), (32, 1, 2), (64, 2, 3)]
    assert mpplan.assign_offsets(records, alignment=1).arena == 96
    assert mpplan.share_objects(records).total == 96
    assert mpplan.remat(graph, "sqrt").graph.ops
    devices = [mpplan.Device(name="gpu0", capacity=1 << 30)]
    planned = mpplan.plan(graph, devices, mpplan.PlannerSettings(schedule="auto"))
    assert isinstance(planned, mpplan.Plan) and mpplan.verify(graph, planned).ops == len(planned.schedule)
    saved = mpplan.save_plan(planned, tmp_path / "plan.json")
    assert mpplan.load_plan(saved) == planned
    with pytest.raises(mpplan.VerificationError):
        mpplan.verify(graph, mpplan.plan(chain(3), devices))  # another graph's plan


def test_config_and_search_verbs_called_through_the_facade(tmp_path) -> None:
    config_path = tmp_path / "run.yaml"
    config_path.write_text(
        "model: {synthetic: {kind: chain, n: 4, train: true}}\n"
        "devices: [{name: gpu0, capacity: 1GiB}]\n"
        "search: {space: {planner.schedule: [as_given, greedy_free]}, top_k: 0}\n"
    )
    config = mpplan.load_config(config_path)
    with pytest.raises(mpplan.ConfigError):
        mpplan.load_config(config_path, ["planner.schedule=nonsense"])
    summary = mpplan.run_search(config, out=tmp_path / "search", progress=False)
    assert summary.best is not None and summary.best_plan is not None


def test_torch_verbs_called_through_the_facade(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from mpplan import zoo

    torch.manual_seed(0)
    model = zoo.build("mlp", in_features=8, hidden=16, out_features=4, layers=2)
    inputs = zoo.example_inputs("mlp", batch=2, in_features=8)
    graph = mpplan.capture(model, inputs, mode="train", optimizer="sgd")
    assert isinstance(graph, mpplan.Graph)
    assert mpplan.capture_program(model, inputs, mode="train", optimizer="sgd").graph.content_hash == graph.content_hash
    planned = mpplan.plan(graph, [mpplan.Device(name="gpu0", capacity=1 << 30)])
    measured = mpplan.evaluate(planned, model, inputs, mode="train", optimizer="sgd", steps=1, warmup=0,
                               devices="virtual")
    assert isinstance(measured, mpplan.Measurement) and measured.numerics is not None and measured.numerics.ok
    wrapped = mpplan.apply(model, planned, inputs, optimizer="sgd", devices="virtual")
    assert set(wrapped.planned.values()) == {"gpu0"}
    config_path = tmp_path / "mlp.yaml"
    config_path.write_text(
        "model: {torch: {factory: 'mpplan.zoo.mlp:mlp', kwargs: {in_features: 8, hidden: 16, out_features: 4},\n"
        "  inputs: [{shape: [batch, 8], dtype: float32}], mode: train, optimizer: sgd}}\n"
        "workload: {batch: 2}\ndevices: [{name: gpu0, capacity: 1GiB}]\n"
    )
    run = mpplan.run_config(mpplan.load_config(config_path), steps=1, warmup=0, devices="virtual")
    assert run.measurement.numerics is not None and run.measurement.numerics.ok

"""The result store: one durable line per candidate, nothing overwritten, resume after any cut."""

from __future__ import annotations

import json

import pytest
from conftest import chain

from mpplan.cluster.records import Result, Status
from mpplan.cluster.store import ResultStore
from mpplan.errors import ConfigError
from mpplan.plan import Plan, load_plan


def result(key: str, status: Status = Status.OK, attempts: int = 1) -> Result:
    return Result(
        key,
        status,
        {"planner.schedule": "dfs", "workload.batch": 8},
        graph_hash="g",
        workload={"batch": 8},
        capacities={"a": 100},
        predicted={"max_peak_bytes": 90},
        measurement={"devices": [{"name": "a", "measured_peak_bytes": 90}], "step_time_s": 0.5},
        attempts=attempts,
    )


def test_result_round_trips_through_json():
    r = result("k")
    assert Result.from_dict(json.loads(r.to_json()), "x") == r
    assert r.measured_peak_bytes == 90 and r.step_time_s == 0.5 and r.predicted_peak_bytes == 90
    with pytest.raises(ConfigError, match="x: not a search result"):
        Result.from_dict({"key": "k"}, "x")


def test_fresh_search_refuses_a_folder_with_results(tmp_path):
    with ResultStore(tmp_path, resume=False) as store:
        store.add(result("a"))
    with pytest.raises(ConfigError) as info:
        ResultStore(tmp_path, resume=False)
    assert str(info.value) == (
        f"{tmp_path / 'results.jsonl'}: --out: a search already wrote results here; pass --resume to continue it, "
        "or choose another --out"
    )
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 1  # untouched


def test_an_empty_results_file_is_no_search(tmp_path):
    (tmp_path / "results.jsonl").write_text("")
    with ResultStore(tmp_path, resume=False) as store:  # a fresh search may take the folder
        assert store.results == {} and store.loaded_keys == frozenset()
        assert store.add(result("a"))
    assert (tmp_path / "results.jsonl").read_text().count("\n") == 1


def test_out_must_be_a_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        ResultStore(tmp_path / "file")


def test_resume_loads_and_drops_a_cut_last_line(tmp_path):
    with ResultStore(tmp_path) as store:
        assert store.add(result("a")) and store.add(result("b"))
        assert not store.add(result("a", Status.OOM))  # final: the first result of a key stands
    with open(tmp_path / "results.jsonl", "a") as handle:
        handle.write(result("c").to_json()[:40])  # the kill came mid-write
    with ResultStore(tmp_path, resume=True) as store:
        assert sorted(store.results) == ["a", "b"] and store.loaded_keys == {"a", "b"}
        assert store.results["a"].status is Status.OK
        store.add(result("c"))
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["key"] for r in rows] == ["a", "b", "c"]


def test_a_corrupt_line_in_the_middle_is_reported(tmp_path):
    (tmp_path / "results.jsonl").write_text(result("a").to_json() + "\n{oops\n" + result("b").to_json() + "\n")
    with pytest.raises(ConfigError, match=r"results.jsonl: line 2: invalid JSON"):
        ResultStore(tmp_path, resume=True)


def test_a_measurement_supersedes_predicted_fit(tmp_path):
    with ResultStore(tmp_path) as store:
        store.add(result("a", Status.PREDICTED_FIT, attempts=0))
        assert store.add(result("a", Status.OK, attempts=1))
        assert not store.add(result("a", Status.OOM, attempts=1))
    with ResultStore(tmp_path, resume=True) as store:
        assert store.results["a"].status is Status.OK


def test_two_searches_cannot_share_a_folder(tmp_path):
    with ResultStore(tmp_path), pytest.raises(ConfigError, match="another search is writing into this folder"):
        ResultStore(tmp_path, resume=True)


def test_best_and_summary_are_written_whole(tmp_path):
    from mpplan.config import Device
    from mpplan.planner import plan

    made: Plan = plan(chain(4), [Device("a", 10**6)])
    with ResultStore(tmp_path) as store:
        store.write_best(made, result("k"))
        store.write_summary({"best": "k"})
        assert store.best_on_disk() == "k"
    assert load_plan(tmp_path / "best" / "plan.json") == made
    assert json.loads((tmp_path / "summary.json").read_text()) == {"best": "k"}
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "best",
        "plan.json",
        "result.json",
        "results.jsonl",
        "summary.json",
    ]


def test_a_resumed_torch_search_flags_results_predicted_without_arena_blocks(tmp_path, caplog):
    """A store written before ``predicted.planned_for`` was recorded predicted the plain plan: it still loads,
    and a resume says how many of its results rank by those other peaks."""
    from conftest import REPO

    from mpplan.cluster import run_search
    from mpplan.config import load_config

    small = ["model.torch.kwargs.n_layers=1", "model.torch.kwargs.d_model=32", "model.torch.kwargs.max_seq_len=16",
             "workload.batch=2", "workload.seq=16", "search.top_k=0"]
    config = load_config(REPO / "configs" / "quickstart.yaml", small)
    out = tmp_path / "out"
    first = run_search(config, out=out, progress=False)
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == first.candidates == 4
    assert all(line["predicted"]["planned_for"] == "cpu" for line in lines)

    with caplog.at_level("WARNING", logger="mpplan"):
        run_search(config, out=out, resume=True, progress=False)
    assert "predicted without arena blocks" not in caplog.text

    del lines[0]["predicted"]["planned_for"], lines[2]["predicted"]["planned_for"]  # as written before
    (out / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    caplog.clear()
    with caplog.at_level("WARNING", logger="mpplan"):
        resumed = run_search(config, out=out, resume=True, progress=False)
    assert resumed.resumed == 4
    assert "search: 2 resumed result(s)" in caplog.text and "predicted without arena blocks" in caplog.text

"""plan.json's settings and remat as typed records: same bytes, old files load, bad fields name themselves."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import device
from mpplan.capture import synthetic
from mpplan.errors import PlanError
from mpplan.plan import _BUFFER_FIELDS, Buffer, Plan, PlanSettings, RematRecord, load_plan, save_plan
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify


@pytest.fixture(scope="module")
def rematted():
    graph = synthetic.transformer(2, train=True, batch=4, seq=32, hidden=16, heads=2, vocab=32, optimizer="adam")
    planned = plan(graph, [device(1 << 40, "cuda:0")], PlannerSettings(remat="sqrt"))
    assert planned.remat, "sqrt recomputed nothing"
    return graph, planned


def test_a_planned_plan_holds_typed_records_that_write_the_same_json(rematted, tmp_path):
    graph, planned = rematted
    assert isinstance(planned.settings, PlanSettings) and all(isinstance(r, RematRecord) for r in planned.remat)
    assert planned.settings.remat == {"policy": "sqrt", "threshold": None, "budget": None, "solver": "auto",
                                      "time_limit_s": 60.0}
    assert planned.settings.alignment == 64 and planned.settings.placement_chosen == "single"
    first = planned.remat[0]
    assert first.recompute_op == f"{first.op}@recompute" and first.bytes == graph.tensor(first.tensor).nbytes
    text = save_plan(planned, tmp_path / "plan.json").read_text()
    assert text == json.dumps(planned.to_dict(), indent=1) + "\n"  # the buffers, written by column, included
    data = json.loads(text)
    assert list(data["planner"]["settings"]) == list(planned.settings)  # the planner's key order, kept
    assert data["remat"][0] == {"tensor": first.tensor, "op": first.op, "recompute_op": first.recompute_op,
                                "recompute_tensor": first.recompute_tensor, "bytes": first.bytes}
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded == planned
    assert save_plan(loaded, tmp_path / "again.json").read_text() == text
    verify(graph, loaded)


def test_records_read_as_the_dicts_they_replace(rematted):
    _, planned = rematted
    record = planned.remat[0]
    assert record["op"] == record.op and record.get("bytes") == record.bytes and record.get("nothing") is None
    assert dict(record) == record.to_dict() == {**record} and record == record.to_dict()
    settings = planned.settings
    assert settings["grads"] == settings.grads == "dynamic" and settings.get("absent", 3) == 3
    flipped = dataclasses.replace(planned, settings={**settings, "parallel_safe": True})
    assert flipped.settings.parallel_safe is True and list(flipped.settings) == list(settings)
    assert dataclasses.replace(planned, remat=tuple(dict(r) for r in planned.remat)) == planned


def test_an_old_or_hand_written_settings_mapping_loads_and_saves_as_it_was(rematted, tmp_path):
    _, planned = rematted
    data = planned.to_dict()
    data["planner"]["settings"] = {"grads": "static", "future_knob": [1, 2], "alignment": None}
    data["remat"] = []
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data, indent=1))
    loaded = load_plan(path)
    assert loaded.settings.grads == "static" and loaded.settings.alignment is None
    assert loaded.settings.extra == {"future_knob": [1, 2]} and loaded.settings.schedule is None
    assert "schedule" not in loaded.settings and loaded.settings.get("parallel_safe", False) is False
    assert loaded.to_dict()["planner"]["settings"] == {"grads": "static", "future_knob": [1, 2], "alignment": None}
    assert Plan.from_dict(loaded.to_dict()).to_dict() == loaded.to_dict()


def test_the_buffer_fields_are_the_records_fields_in_order() -> None:
    """plan.json's buffer fields are written and read from one list, ``_BUFFER_FIELDS``; the reader hands them
    to ``Buffer`` by position, so they must be its fields in its order."""
    assert _BUFFER_FIELDS == tuple(f.name for f in dataclasses.fields(Buffer))


@pytest.mark.parametrize(
    "where, value, message",
    [
        ("settings", {"alignment": "64"}, "planner.settings.alignment: expected an integer, got '64'"),
        ("settings", {"parallel_safe": 1}, "planner.settings.parallel_safe: expected true or false, got 1"),
        ("settings", {"alignment": True}, "planner.settings.alignment: expected an integer, got True"),
        ("settings", {"device_map": {"a": 1}}, "planner.settings.device_map: expected a mapping of module prefix"),
        ("settings", {"no_split": [1]}, "planner.settings.no_split: expected a list of module prefixes"),
        ("buffer", {"device": "cuda:0", "offset": "0", "bytes": 8}, "buffers.t.offset: expected an integer, got '0'"),
        ("buffer", {"device": 0, "offset": 0, "bytes": 8}, "buffers.t.device: expected a string, got 0"),
        ("remat", [{"tensor": "t"}], "remat[0].op: missing"),
        ("remat", [{"tensor": "t", "op": "o", "recompute_op": "r", "recompute_tensor": "s", "bytes": "8"}],
         "remat[0].bytes: expected an integer, got '8'"),
        ("remat", [{"tensor": "t", "op": "o", "recompute_op": "r", "recompute_tensor": "s", "bytes": 8, "x": 1}],
         "remat[0].x: unknown key"),
        ("remat", [{"tensor": "t", "op": "o", "recompute_op": "r", "recompute_tensor": "s", "bytes": 8, "from_op": 3}],
         "remat[0].from_op: expected a string, got 3"),
    ],
)
def test_a_malformed_record_is_a_plan_error_naming_the_file_and_field(rematted, tmp_path, where, value, message):
    _, planned = rematted
    data = planned.to_dict()
    if where == "settings":
        data["planner"]["settings"] = value
    elif where == "buffer":
        data["buffers"] = {"t": value}
    else:
        data["remat"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    assert str(caught.value).startswith(f"{path}: {message}")

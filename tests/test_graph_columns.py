"""The columnar layout of graph files: the same graphs as the rows, and the rows' own messages for any bad value."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_graph_file import TINY, error, graphs, write
from test_graph_file_fast import _EDGES, _VALUE

from mpplan.capture import graph_columns
from mpplan.capture.graph_columns import OP_COLUMNS, TENSOR_COLUMNS, columns_of_rows
from mpplan.capture.graph_file import graph_from_dict, graph_to_dict, load_graph, save_graph
from mpplan.capture.synthetic import synthetic_graph
from mpplan.cli import main
from mpplan.errors import GraphError, GraphFileError

#: The documented example of ``mpplan.capture.graph_columns``.
TINY_COLUMNS = {
    "name": "tiny", "layout": "columns",
    "tensors": {"name": ["x", "w", "h", "hv"], "bytes": [64, None, 64, None],
                "shape": [None, [4, 4], None, None], "dtype": [None, "float32", None, None],
                "kind": ["input", "param", None, None], "alias_of": [None, None, None, "h"]},
    "ops": {"name": ["fc", "relu"], "type": ["Linear", "Relu"], "inputs": [["x", "w"], ["h"]],
            "outputs": [["h"], ["h"]], "cost": [2.0, None]},
    "outputs": ["h"],
}


def _outcome(build: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", build()
    except (GraphFileError, GraphError) as exc:
        return "error", str(exc)


def test_the_documented_example_loads(tmp_path):
    assert graph_from_dict(TINY_COLUMNS) == TINY
    assert load_graph(write(tmp_path, json.dumps(TINY_COLUMNS), "tiny.json")) == TINY
    assert columns_of_rows(graph_to_dict(TINY)) == TINY_COLUMNS


def test_the_example_of_the_concepts_page_loads():
    text = (Path(__file__).resolve().parents[1] / "docs" / "concepts.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    g = graph_from_dict(json.loads(example))
    assert [(t.name, t.nbytes, t.kind.value) for t in g.tensors] == [("x", 64, "input"), ("h", 64, "activation")]
    assert [(o.name, o.inputs, o.outputs) for o in g.ops] == [("relu", ("x",), ("h",))]


def test_json_is_written_in_columns_and_yaml_in_rows(tmp_path):
    lines = save_graph(TINY, tmp_path / "tiny.json").read_text().splitlines()
    assert lines[:5] == ["{", '  "name": "tiny",', '  "layout": "columns",', '  "tensors": {',
                         '    "name": ["x", "w", "h", "hv"],']
    assert '    "inputs": [["x", "w"], ["h"]],' in lines
    assert json.loads("\n".join(lines)) == TINY_COLUMNS
    text = save_graph(TINY, tmp_path / "tiny.yaml").read_text()
    assert "layout" not in text and "- {name: relu, type: Relu, inputs: [h], outputs: [h]}\n" in text
    yaml_columns = save_graph(TINY, tmp_path / "c.yaml", layout="columns").read_text()
    assert "layout: columns\n" in yaml_columns and "  name: [x, w, h, hv]\n" in yaml_columns
    # rows carry no layout key: mpplan before the columnar layout reads them
    assert "layout" not in save_graph(TINY, tmp_path / "rows.json", layout="rows").read_text()
    with pytest.raises(ValueError, match="layout: expected one of rows, columns, got 'cols'"):
        save_graph(TINY, tmp_path / "x.json", layout="cols")


@pytest.mark.parametrize("suffix, layout", [(".json", None), (".json", "rows"), (".yaml", "columns")])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs())
def test_round_trip_is_exact_in_either_layout(suffix, layout, g):
    with tempfile.TemporaryDirectory() as tmp:
        again = load_graph(save_graph(g, Path(tmp) / f"g{suffix}", layout=layout))
    assert again == g
    assert [type(o.cost) for o in again.ops] == [float] * len(g.ops)


def test_a_plain_file_is_built_from_whole_columns(tmp_path, monkeypatch):
    """The synthetic transformer's columns take the plain case: no entry goes through the row functions."""
    g = synthetic_graph("transformer", layers=2, train=True)
    path = save_graph(g, tmp_path / "t.json")

    def by_row(*args: object) -> None:
        raise AssertionError("a plain column went through the row functions")

    monkeypatch.setattr(graph_columns, "tensor_from_row", by_row)
    monkeypatch.setattr(graph_columns, "op_from_row", by_row)
    assert load_graph(path) == g


@st.composite
def faults(draw) -> tuple[dict[str, Any], dict[str, Any]]:
    """A valid graph's document in rows and in columns, with one field of one entry set to the same value in both."""
    g = draw(graphs())
    rows = graph_to_dict(g)
    table = draw(st.sampled_from([t for t in ("tensors", "ops") if rows[t]] or ["tensors"]))
    assume(rows[table])
    count = len(rows[table])
    i = draw(st.integers(0, count - 1))
    field = draw(st.sampled_from(TENSOR_COLUMNS if table == "tensors" else OP_COLUMNS))
    value = draw(st.one_of(_VALUE, st.sampled_from(list(rows["tensors"]))))
    columns = copy.deepcopy(columns_of_rows(rows))
    columns[table].setdefault(field, [None] * count)[i] = value
    if table == "ops":
        rows["ops"][i][field] = value
    elif field == "name":  # a tensor's name is its row's key: rename the i-th tensor
        names = list(rows["tensors"])
        assume(isinstance(value, (str, int, float, bool, type(None))) and value not in names[:i] + names[i + 1:])
        rows["tensors"] = {value if n == i else key: fields for n, (key, fields) in enumerate(rows["tensors"].items())}
    else:
        rows["tensors"][list(rows["tensors"])[i]][field] = value
    return rows, columns


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(docs=faults())
def test_a_fault_reads_as_in_rows(docs):
    """Random graphs, one field of one tensor or op set to a random value: the same graph, or the same message."""
    rows, columns = docs
    assert _outcome(lambda: graph_from_dict(columns)) == _outcome(lambda: graph_from_dict(rows))


def test_every_edge_value_in_every_field_reads_as_in_rows():
    """Each field of each tensor and op of the example set to each value at the edge of the plain case."""
    rows = graph_to_dict(TINY)
    for table, fields in (("tensors", TENSOR_COLUMNS[1:]), ("ops", OP_COLUMNS)):
        for i in range(len(rows[table])):
            for field in fields:
                for value in _EDGES:
                    faulty = copy.deepcopy(rows)
                    entries = list(faulty[table].values()) if table == "tensors" else faulty[table]
                    entries[i][field] = value
                    columns = columns_of_rows(faulty)
                    columns[table].setdefault(field, [None] * len(entries))[i] = value  # a column all null is left out
                    assert _outcome(lambda: graph_from_dict(columns)) == _outcome(lambda: graph_from_dict(faulty)), (
                        table, i, field, value)


@pytest.mark.parametrize(
    "change, message",
    [
        pytest.param({"tensors": {**TINY_COLUMNS["tensors"], "size": [1, 2, 3, 4]}},
                     "tensors.size: unknown column; expected one of name, bytes, shape, dtype, kind, alias_of, "
                     "grad_of", id="unknown-tensor-column"),
        pytest.param({"ops": {**TINY_COLUMNS["ops"], "colour": ["red", "red"]}},
                     "ops.colour: unknown column; expected one of name, type, inputs, outputs, cost, device, "
                     "backward_of, module, stage, recompute_of", id="unknown-op-column"),
        pytest.param({"tensors": {k: v for k, v in TINY_COLUMNS["tensors"].items() if k != "name"}},
                     "tensors.name: missing column; the columnar layout needs name", id="no-tensor-names"),
        pytest.param({"ops": {k: v for k, v in TINY_COLUMNS["ops"].items() if k != "type"}},
                     "ops.type: missing column; the columnar layout needs name and type", id="no-op-types"),
        pytest.param({"tensors": {**TINY_COLUMNS["tensors"], "kind": ["input", "param", None]}},
                     "tensors.kind: 3 entries, but tensors.name has 4; every column has one entry per tensor",
                     id="short-column"),
        pytest.param({"ops": {**TINY_COLUMNS["ops"], "cost": [1, 2, 3]}},
                     "ops.cost: 3 entries, but ops.name has 2; every column has one entry per op", id="long-column"),
        pytest.param({"ops": {**TINY_COLUMNS["ops"], "name": "fc"}},
                     "ops.name: expected a list, one entry per op, got 'fc'", id="column-not-a-list"),
        pytest.param({"tensors": [["x", 64]]},
                     "tensors: expected a mapping of field name to a list (the columnar layout), got [['x', 64]]",
                     id="table-not-a-mapping"),
        pytest.param({"layout": "cols"}, "layout: expected rows or columns, got 'cols'", id="unknown-layout"),
        # the rows' own messages, naming the tensor or the op's index and the field
        pytest.param({"tensors": {**TINY_COLUMNS["tensors"], "bytes": [64, None, -4, None]}},
                     "tensors.h.bytes: expected a non-negative size, got -4", id="negative-bytes"),
        pytest.param({"ops": {**TINY_COLUMNS["ops"], "cost": [2.0, "fast"]}},
                     "ops[1].cost: expected a non-negative number, got 'fast'", id="bad-cost"),
        # what the graph says, validated as ever
        pytest.param({"tensors": {**TINY_COLUMNS["tensors"], "name": ["x", "w", "h", "h"]}},
                     "tensor 'h': defined twice", id="tensor-named-twice"),
    ],
)
def test_column_errors_are_one_line_naming_the_column(tmp_path, capsys, change, message):
    path = write(tmp_path, json.dumps({**TINY_COLUMNS, **change}), "g.json")
    assert error(path) == f"{path}: {message}"
    config = write(tmp_path, f"model: {{graph: {{path: {path.name}}}}}\ndevices: [{{name: d, capacity: 1GiB}}]\n",
                   "run.yaml")
    assert main(["plan", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: {message}" in err and "Traceback" not in err

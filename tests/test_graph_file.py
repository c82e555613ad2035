"""Graph files: the documented format, exact round trips, and every error as one line."""

from __future__ import annotations

import json
import math
import os
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpplan.capture.graph_file import graph_from_dict, graph_to_dict, load_graph, save_graph
from mpplan.errors import GraphError, GraphFileError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.units import DTYPE_BYTES

TINY_YAML = """\
name: tiny
tensors:                        # every tensor an op names: bytes, or shape + dtype
  x:  {bytes: 64, kind: input}
  w:  {shape: [4, 4], dtype: float32, kind: param}
  h:  {bytes: 64}               # kind defaults to activation
  hv: {alias_of: h}             # a view of h: no storage of its own
ops:                            # listed in a valid execution order (the "as_given" order)
  - {name: fc,   type: Linear, inputs: [x, w], outputs: [h], cost: 2.0}
  - {name: relu, type: Relu,   inputs: [h],    outputs: [h]}   # same name in and out: in place
outputs: [h]
"""

TINY = Graph(
    "tiny",
    (
        Tensor("x", 64, Kind.INPUT),
        Tensor("w", 64, Kind.PARAM, shape=(4, 4), dtype="float32"),
        Tensor("h", 64),
        Tensor("hv", 0, alias_of="h"),
    ),
    (Op("fc", "Linear", ("x", "w"), ("h",), cost=2.0), Op("relu", "Relu", ("h",), ("h",))),
    ("h",),
)


def write(tmp_path: Path, text: str, name: str = "tiny.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error(path: Path, **kwargs) -> str:
    with pytest.raises(GraphFileError) as info:
        load_graph(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the documented example ----------------------------------------------------------


def test_the_documented_example_loads(tmp_path):
    g = load_graph(write(tmp_path, TINY_YAML))
    assert g == TINY
    assert g.op("relu").in_place == ("h",)
    assert isinstance(g.op("relu").cost, float)


def test_the_same_structure_in_json(tmp_path):
    import yaml

    doc = yaml.safe_load(TINY_YAML)
    assert load_graph(write(tmp_path, json.dumps(doc), "tiny.json")) == TINY


def test_name_defaults_to_the_file_stem(tmp_path):
    path = write(tmp_path, "tensors: {x: {bytes: 4, kind: input}}\nops: []\n", "stem.yml")
    assert load_graph(path).name == "stem"


def test_sizes_accept_units_and_null_means_absent(tmp_path):
    path = write(
        tmp_path,
        """
        tensors:
          x: {bytes: 1KiB, kind: input, alias_of: null}
          y: {bytes: 8, shape: [2], dtype: torch.float32, kind: null}
          s: {shape: [], dtype: int64}
          v: {alias_of: y, shape: [2], dtype: float32}
        ops:
          - {name: f, type: F, inputs: [x], outputs: [y, s], cost: 3, device: null}
        """,
    )
    g = load_graph(path)
    assert [t.nbytes for t in g.tensors] == [1024, 8, 8, 0]
    assert g.tensor("y").dtype == "torch.float32" and g.tensor("y").kind is Kind.ACTIVATION
    assert g.tensor("s").shape == () and g.op("f").cost == 3.0 and g.op("f").device is None


def test_every_op_field_is_read(tmp_path):
    path = write(
        tmp_path,
        """
        tensors: {x: {bytes: 4, kind: input}, y: {bytes: 4}, gy: {bytes: 4, kind: grad, grad_of: y}}
        ops:
          - {name: f, type: F, inputs: [x], outputs: [y], cost: 1.5, device: gpu0, module: layers.0, stage: s0}
          - {name: fr, type: F, inputs: [x], outputs: [gy], backward_of: f, recompute_of: f}
        """,
    )
    f, fr = load_graph(path).ops
    assert (f.device, f.module, f.stage, f.cost) == ("gpu0", "layers.0", "s0", 1.5)
    assert (fr.backward_of, fr.recompute_of, fr.cost) == ("f", "f", 0.0)


# --- round trips ---------------------------------------------------------------------

NAME = st.one_of(
    st.text(
        alphabet=st.sampled_from("abcXYZ019 ._:-#'\"[]{},&*!|>%@`é"),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from(["null", "true", "~", "1", "1.5", "no", "- a", "? x", "yes"]),
)
DTYPES = sorted(DTYPE_BYTES)
PRODUCED_KINDS = [Kind.ACTIVATION, Kind.GRAD, Kind.OUTPUT, Kind.WORKSPACE, Kind.PARAM]
SOURCE_KINDS = [Kind.INPUT, Kind.PARAM, Kind.OPTIMIZER_STATE]
OPTIONAL_TEXT = st.one_of(st.none(), NAME)


@st.composite
def sized(draw, name: str, kind: Kind, alias_of: str | None = None, grad_of: str | None = None) -> Tensor:
    """A tensor in any of the ways the format can hold its size."""
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    dtype = draw(st.sampled_from(DTYPES))
    derived = math.prod(shape) * DTYPE_BYTES[dtype]
    if alias_of is not None:
        choice = draw(st.sampled_from(["none", "bytes", "shaped-zero", "shaped-bytes"]))
        if choice == "none":
            return Tensor(name, 0, kind, alias_of=alias_of, grad_of=grad_of)
        if choice == "bytes":
            return Tensor(name, draw(st.integers(0, 10**12)), kind, alias_of=alias_of, grad_of=grad_of)
        if choice == "shaped-zero":
            return Tensor(name, 0, kind, shape, dtype, alias_of, grad_of)
        return Tensor(name, derived, kind, shape, dtype, alias_of, grad_of)
    choice = draw(st.sampled_from(["bytes", "shape+dtype", "bytes+dtype", "bytes+shape"]))
    if choice == "bytes":
        return Tensor(name, draw(st.integers(0, 10**12)), kind, grad_of=grad_of)
    if choice == "shape+dtype":
        return Tensor(name, derived, kind, shape, dtype, grad_of=grad_of)
    if choice == "bytes+dtype":
        return Tensor(name, draw(st.integers(0, 10**6)), kind, dtype=dtype, grad_of=grad_of)
    return Tensor(name, draw(st.integers(0, 10**6)), kind, shape=shape, grad_of=grad_of)


@st.composite
def graphs(draw) -> Graph:
    """Small valid graphs: sources, views, in-place ops, every kind and optional field (an op's links name an
    earlier op)."""
    names = iter(draw(st.lists(NAME, min_size=24, max_size=24, unique=True)))
    tensors: list[Tensor] = []
    available: list[str] = []

    def grad_of() -> str | None:
        return draw(st.one_of(st.none(), st.sampled_from(available))) if available else None

    for _ in range(draw(st.integers(1, 3))):
        t = draw(sized(next(names), draw(st.sampled_from(SOURCE_KINDS)), grad_of=grad_of()))
        tensors.append(t)
        available.append(t.name)
    ops: list[Op] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):  # a free-standing view of something that exists
            t = draw(
                sized(next(names), draw(st.sampled_from(PRODUCED_KINDS)), alias_of=draw(st.sampled_from(available)))
            )
            tensors.append(t)
            available.append(t.name)
        inputs = draw(st.lists(st.sampled_from(available), max_size=3, unique=True))
        outputs = []
        for _ in range(draw(st.integers(0, 2))):
            alias = draw(st.one_of(st.none(), st.sampled_from(available)))
            t = draw(sized(next(names), draw(st.sampled_from(PRODUCED_KINDS)), alias_of=alias, grad_of=grad_of()))
            tensors.append(t)
            outputs.append(t.name)
        if inputs and draw(st.booleans()):
            outputs.insert(draw(st.integers(0, len(outputs))), draw(st.sampled_from(inputs)))  # in place
        cost = draw(st.one_of(st.just(0.0), st.floats(0, 1e12, allow_nan=False), st.integers(0, 10**6).map(float)))
        earlier = st.one_of(st.none(), st.sampled_from([o.name for o in ops])) if ops else st.none()
        ops.append(
            Op(
                next(names),
                draw(NAME),
                tuple(inputs),
                tuple(outputs),
                cost,
                device=draw(OPTIONAL_TEXT),
                backward_of=draw(earlier),
                module=draw(OPTIONAL_TEXT),
                stage=draw(OPTIONAL_TEXT),
                recompute_of=draw(earlier),
            )
        )
        available += [o for o in outputs if o not in available]
    tensors = draw(st.permutations(tensors))
    outputs = draw(st.lists(st.sampled_from([t.name for t in tensors]), max_size=3))
    return Graph(draw(NAME), tuple(tensors), tuple(ops), tuple(outputs)).validate()


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs())
def test_round_trip_is_exact(suffix, g):
    with tempfile.TemporaryDirectory() as tmp:
        path = save_graph(g, Path(tmp) / f"g{suffix}")
        again = load_graph(path)
    assert again == g
    assert [type(o.cost) for o in again.ops] == [float] * len(g.ops)
    assert again.content_hash == g.content_hash


def test_round_trip_of_the_example_and_its_text(tmp_path):
    path = save_graph(TINY, tmp_path / "tiny.yaml")
    assert load_graph(path) == TINY
    text = path.read_text()
    assert "  x: {bytes: 64, kind: input}\n" in text
    assert "  w: {shape: [4, 4], dtype: float32, kind: param}\n" in text
    assert "  hv: {alias_of: h}\n" in text
    assert "- {name: relu, type: Relu, inputs: [h], outputs: [h]}\n" in text
    assert graph_from_dict(graph_to_dict(TINY)) == TINY


def test_json_in_rows_has_one_op_per_line(tmp_path):
    path = save_graph(TINY, tmp_path / "tiny.json", layout="rows")
    lines = path.read_text().splitlines()
    assert '    {"name": "fc", "type": "Linear", "inputs": ["x", "w"], "outputs": ["h"], "cost": 2.0},' in lines
    assert json.loads(path.read_text()) == graph_to_dict(TINY)
    assert load_graph(path) == TINY


def test_empty_graph_round_trips(tmp_path):
    g = Graph("empty", (), ())
    for suffix in (".yaml", ".json"):
        assert load_graph(save_graph(g, tmp_path / f"e{suffix}")) == g


# --- saving --------------------------------------------------------------------------


def test_save_replaces_atomically_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "g.json"
    path.write_text("old")
    assert save_graph(TINY, path) == path
    assert load_graph(path) == TINY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_save_refuses_what_would_not_read_back(tmp_path):
    bad = Graph("bad", (Tensor("x", 60, Kind.INPUT, shape=(4, 4), dtype="float32"),), ())
    path = tmp_path / "bad.yaml"
    with pytest.raises(GraphFileError) as info:
        save_graph(bad, path)
    assert str(info.value) == (
        f"{path}: cannot save graph 'bad': tensors.x: bytes 60 disagree with shape [4, 4] and dtype float32, "
        "which give 64 bytes"
    )
    assert not path.exists()


def test_save_validates_the_graph(tmp_path):
    with pytest.raises(GraphError, match="produced by no op"):
        save_graph(Graph("g", (Tensor("a", 4),), ()), tmp_path / "g.yaml")


def test_save_errors(tmp_path):
    with pytest.raises(GraphFileError) as info:
        save_graph(TINY, tmp_path / "g.txt")
    assert str(info.value) == f"{tmp_path / 'g.txt'}: unsupported extension '.txt'; expected .yaml, .yml or .json"
    missing = tmp_path / "no" / "g.yaml"
    with pytest.raises(GraphFileError) as info:
        save_graph(TINY, missing)
    assert str(info.value) == f"{missing}: cannot write: No such file or directory"


def test_save_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "g.yaml"
    save_graph(TINY, path)
    before = path.read_text()

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(GraphFileError, match="cannot write: No space left on device"):
        save_graph(Graph("other", TINY.tensors, TINY.ops), path)
    assert path.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


# --- errors --------------------------------------------------------------------------

OK_TENSORS = "tensors: {x: {bytes: 4, kind: input}, h: {bytes: 4}}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        pytest.param(
            "tensors:\n  w: {kind: param}\nops: []\n", "tensors.w: needs bytes, or shape and dtype", id="no-size"
        ),
        pytest.param(
            "tensors:\n  w: {shape: [4, 4], kind: param}\nops: []\n",
            "tensors.w: needs bytes, or shape and dtype",
            id="shape-without-dtype",
        ),
        pytest.param(
            "tensors:\n  w: {bytes: 60, shape: [4, 4], dtype: float32, kind: param}\nops: []\n",
            "tensors.w: bytes 60 disagree with shape [4, 4] and dtype float32, which give 64 bytes",
            id="size-disagrees",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [x], outputs: [h]}\n  - {name: b, type: B, inputs: h}\n",
            "ops[1].inputs: expected a list of tensor names, got 'h'",
            id="inputs-not-a-list",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [x, 3]}\n",
            "ops[0].inputs: expected a list of tensor names, got ['x', 3]",
            id="input-not-a-name",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, outputs: {h: 1}}\n",
            "ops[0].outputs: expected a list of tensor names, got {'h': 1}",
            id="outputs-not-a-list",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, colour: red}\n",
            "ops[0].colour: unknown key; expected one of name, type, inputs, outputs, cost, device, backward_of, "
            "module, stage, recompute_of",
            id="unknown-op-key",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: 4, shade: 2}\nops: []\n",
            "tensors.x.shade: unknown key; expected one of bytes, shape, dtype, kind, alias_of, grad_of",
            id="unknown-tensor-key",
        ),
        pytest.param(
            OK_TENSORS + "ops: []\ncolour: red\n",
            "colour: unknown key; expected one of name, layout, tensors, ops, outputs",
            id="unknown-top-key",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: 4, kind: weights}\nops: []\n",
            "tensors.x.kind: unknown kind 'weights'; expected one of input, param, activation, grad, "
            "optimizer_state, output, workspace",
            id="unknown-kind",
        ),
        pytest.param(
            "tensors:\n  x: {shape: [2], dtype: float42, kind: input}\nops: []\n",
            "tensors.x.dtype: unknown dtype 'float42'; expected one of " + ", ".join(DTYPE_BYTES),
            id="unknown-dtype",
        ),
        pytest.param(
            "tensors:\n  x: {shape: [2], dtype: 4, kind: input}\nops: []\n",
            "tensors.x.dtype: expected a dtype name such as float32, got 4",
            id="dtype-not-a-string",
        ),
        pytest.param(
            "tensors:\n  x: {shape: [2, -1], dtype: float32, kind: input}\nops: []\n",
            "tensors.x.shape: expected a list of non-negative integers, got [2, -1]",
            id="negative-dim",
        ),
        pytest.param(
            "tensors:\n  x: {shape: 4, dtype: float32, kind: input}\nops: []\n",
            "tensors.x.shape: expected a list of non-negative integers, got 4",
            id="shape-not-a-list",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: 1.5, kind: input}\nops: []\n",
            "tensors.x.bytes: expected a size in bytes (an integer or a string such as 64MiB), got 1.5",
            id="fractional-bytes",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: -4, kind: input}\nops: []\n",
            "tensors.x.bytes: expected a non-negative size, got -4",
            id="negative-bytes",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: lots, kind: input}\nops: []\n",
            "tensors.x.bytes: expected a size such as 16GiB, 512MB or an integer, got 'lots'",
            id="bad-size-string",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: true, kind: input}\nops: []\n",
            "tensors.x.bytes: expected a size in bytes (an integer or a string such as 64MiB), got True",
            id="bool-bytes",
        ),
        pytest.param(
            "tensors:\n  x: {bytes: 4, kind: input}\n  v: {alias_of: 3}\nops: []\n",
            "tensors.v.alias_of: expected a string, got 3",
            id="alias-not-a-name",
        ),
        pytest.param(
            "tensors:\n  x: 64\nops: []\n",
            "tensors.x: expected a mapping of fields (bytes, shape, dtype, kind, alias_of, grad_of), got 64",
            id="tensor-not-a-mapping",
        ),
        pytest.param(
            "tensors:\n  1: {bytes: 4, kind: input}\nops: []\n",
            "tensors: tensor names must be strings, got 1",
            id="tensor-name-not-a-string",
        ),
        pytest.param(
            "tensors: [x]\nops: []\n",
            "tensors: expected a mapping of tensor name to fields, got ['x']",
            id="tensors-not-a-mapping",
        ),
        pytest.param(OK_TENSORS + "ops: {a: 1}\n", "ops: expected a list of ops, got {'a': 1}", id="ops-not-a-list"),
        pytest.param(
            OK_TENSORS + "ops: [fc]\n",
            "ops[0]: expected a mapping of op fields (name, type, inputs, ...), got 'fc'",
            id="op-not-a-mapping",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {type: A}\n",
            "ops[0].name: missing; every op needs a name and a type",
            id="op-without-name",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a}\n",
            "ops[0].type: missing; every op needs a name and a type",
            id="op-without-type",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: 7, type: A}\n",
            "ops[0].name: expected a string, got 7",
            id="op-name-not-a-string",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, cost: fast}\n",
            "ops[0].cost: expected a non-negative number, got 'fast'",
            id="cost-not-a-number",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, cost: -1}\n",
            "ops[0].cost: expected a non-negative number, got -1",
            id="negative-cost",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, cost: .inf}\n",
            "ops[0].cost: expected a non-negative number, got inf",
            id="infinite-cost",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, device: [0]}\n",
            "ops[0].device: expected a string, got [0]",
            id="device-not-a-string",
        ),
        pytest.param(
            OK_TENSORS + "ops: []\noutputs: h\n",
            "outputs: expected a list of tensor names, got 'h'",
            id="outputs-not-a-list",
        ),
        pytest.param(OK_TENSORS + "ops: []\nname: 5\n", "name: expected a non-empty string, got 5", id="bad-name"),
        pytest.param("ops: []\n", "tensors: missing; a graph file lists its tensors and its ops", id="no-tensors"),
        pytest.param(OK_TENSORS, "ops: missing; a graph file lists its tensors and its ops", id="no-ops"),
        # graph validation errors come back prefixed with the file
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [q], outputs: [h]}\n",
            "op 'a': input names unknown tensor 'q'",
            id="validation-unknown-tensor",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [x], outputs: [h]}\n  - {name: a, type: A}\n",
            "op 'a': defined twice",
            id="validation-duplicate-op",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [h], outputs: [x]}\n",
            "tensor 'h': produced by no op and not declared input, param or optimizer_state",
            id="validation-unproduced",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [x], outputs: [h]}\noutputs: [zz]\n",
            "graph output 'zz' is not a known tensor",
            id="validation-unknown-output",
        ),
        pytest.param(
            OK_TENSORS + "ops:\n  - {name: a, type: A, inputs: [x], outputs: [h], recompute_of: nope}\n",
            "op 'a': recompute_of names unknown op 'nope'",
            id="validation-unknown-recompute-of",
        ),
    ],
)
def test_errors_are_one_line_naming_file_and_field(tmp_path, text, message):
    path = write(tmp_path, text)
    assert error(path) == f"{path}: {message}"


@pytest.mark.parametrize(
    "text, name, message",
    [
        (
            "tensors: {x: {bytes: 4}\n",
            "g.yaml",
            "line 2, column 1: invalid YAML: expected ',' or '}', but got '<stream end>'",
        ),
        ("a: b: c\n", "g.yml", "line 1, column 5: invalid YAML: mapping values are not allowed here"),
        ('{"tensors": {}, "ops": [}', "g.json", "line 1, column 25: invalid JSON: Expecting value"),
        ("", "g.yaml", "not a graph file: expected a mapping with ops and tensors, got an empty document"),
        ("[1, 2]", "g.json", "not a graph file: expected a mapping with ops and tensors, got [1, 2]"),
        (
            "{colour: red}",
            "g.yaml",
            (
                "not a graph file: expected a mapping with ops and tensors (an mpplan graph) or nodes and links "
                "(networkx node-link), got keys colour"
            ),
        ),
    ],
)
def test_syntax_and_content_errors(tmp_path, text, name, message):
    path = write(tmp_path, text, name)
    assert error(path) == f"{path}: {message}"


def test_file_errors(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    assert error(missing) == f"{missing}: file not found"
    other = write(tmp_path, "x", "g.toml")
    assert error(other) == f"{other}: unsupported extension '.toml'; expected .yaml, .yml or .json"
    binary = tmp_path / "g.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert error(binary) == f"{binary}: not UTF-8 text (byte 0xff at offset 0); save the file as UTF-8"
    assert error(tmp_path.joinpath("d.yaml")) == f"{tmp_path / 'd.yaml'}: file not found"
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    assert error(folder).startswith(f"{folder}: cannot read: ")


def test_format_argument(tmp_path):
    links = {"nodes": [{"id": 0, "name": "a", "cost_ram": 8}], "links": []}
    path = write(tmp_path, json.dumps(links), "nl.json")
    assert [o.name for o in load_graph(path).ops] == ["a"]
    assert [o.name for o in load_graph(path, format="node-link").ops] == ["a"]
    expected = f"{path}: nodes: unknown key; expected one of name, layout, tensors, ops, outputs"
    assert error(path, format="mpplan") == expected
    with pytest.raises(ValueError, match="format: expected one of auto, mpplan, node-link, got 'xml'"):
        load_graph(path, format="xml")


def test_node_link_errors_are_prefixed_with_the_file(tmp_path):
    path = write(tmp_path, json.dumps({"nodes": [{"id": 0}], "links": []}), "nl.json")
    assert error(path) == f"{path}: nodes: no size attribute; expected one of cost_ram, out_cost, or pass size_attr"


def test_node_link_file_name_is_the_graph_name_else_the_stem(tmp_path):
    data = {"nodes": [{"id": 0, "cost_ram": 8}], "links": []}
    assert load_graph(write(tmp_path, json.dumps(data), "stem.json")).name == "stem"
    data["graph"] = {"name": "given"}
    assert load_graph(write(tmp_path, json.dumps(data), "stem.json")).name == "given"

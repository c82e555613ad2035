"""Graph files: read and write the mpplan YAML/JSON graph format, exactly.

The format (YAML or JSON, same structure) is a user-facing contract::

    name: tiny
    tensors:                        # every tensor an op names: bytes, or shape + dtype
      x:  {bytes: 64, kind: input}
      w:  {shape: [4, 4], dtype: float32, kind: param}
      h:  {bytes: 64}               # kind defaults to activation
      hv: {alias_of: h}             # a view of h: no storage of its own
    ops:                            # listed in a valid execution order (the as-given order)
      - {name: fc,   type: Linear, inputs: [x, w], outputs: [h], cost: 2.0}
      - {name: relu, type: Relu,   inputs: [h],    outputs: [h]}   # in and out: in place
    outputs: [h]

Top-level keys: ``name`` (default: the file's stem), ``tensors`` (a mapping, in
tensor order), ``ops`` (a list, in the as-given order) and ``outputs`` (default
none).  Tensor fields: ``bytes`` (an integer or a size such as ``64MiB``), ``shape``
and ``dtype`` (when both are given with ``bytes`` they must agree), ``kind``
(``input``, ``param``, ``activation``, ``grad``, ``optimizer_state``, ``output``,
``workspace``; default ``activation``), ``alias_of`` and ``grad_of``.  A tensor
without ``bytes`` takes ``prod(shape) * width(dtype)``, except a view
(``alias_of``), which takes 0: a view allocates nothing, its storage is its base's,
and 0 is what a view's ``nbytes`` reads back as.  Op fields: ``name``, ``type``,
``inputs``, ``outputs``, ``cost`` (a non-negative number, default 0), ``device``,
``backward_of``, ``module``, ``stage``, ``recompute_of``.  ``null`` means absent.

``load_graph`` also reads networkx node-link JSON (see ``mpplan.capture.nodelink``):
the content decides, not the extension.  Files are read by ``mpplan.reading``:
``safe_load``'s types, and no alias bombs, duplicate keys or runaway nesting.
Every error is a ``GraphFileError`` of one line, ``<file>: <dotted.field>: <what>``;
graph-validation errors come back the same way, prefixed with the file.

``save_graph`` writes YAML or JSON by extension, atomically, and only what reads
back as the very same graph: ``load_graph(save_graph(g, p)) == g``.  For graphs of
100k ops prefer JSON: PyYAML's pure-Python ``safe_load`` is slow at that size.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, cast

import yaml

from mpplan.capture.nodelink import graph_from_node_link
from mpplan.durable import write_text
from mpplan.errors import GraphError, GraphFileError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.reading import load_json, load_yaml, read_document
from mpplan.units import DTYPE_BYTES, MAX_BYTES, dtype_bytes, parse_size

#: Content formats ``load_graph`` accepts; ``auto`` decides from the content.
FORMATS = ("auto", "mpplan", "node-link")

_SYNTAX = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}
_TOP_KEYS = ("name", "tensors", "ops", "outputs")
_TENSOR_KEYS = ("bytes", "shape", "dtype", "kind", "alias_of", "grad_of")
_OP_KEYS = ("name", "type", "inputs", "outputs", "cost", "device", "backward_of", "module", "stage", "recompute_of")
_OP_OPTIONAL = ("device", "backward_of", "module", "stage", "recompute_of")
_TOP_KEY_SET = frozenset(_TOP_KEYS)
_TENSOR_KEY_SET = frozenset(_TENSOR_KEYS)
_OP_KEY_SET = frozenset(_OP_KEYS)
_KINDS = {k.value: k for k in Kind}
#: Element width of each dtype name a graph file may use (``torch.float32`` as well as ``float32``).
_WIDTHS = {**DTYPE_BYTES, **{f"torch.{name}": width for name, width in DTYPE_BYTES.items()}}


def load_graph(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    size_attr: str | None = None,
    cost_attr: str | None = None,
) -> Graph:
    """Read a validated ``Graph`` from a ``.yaml``, ``.yml`` or ``.json`` file.

    The extension picks the syntax; ``format`` picks the content: ``mpplan`` (a
    mapping with ``ops``/``tensors``), ``node-link`` (networkx node-link: ``nodes``
    and ``links`` or ``edges``), or ``auto`` to tell them apart.  ``size_attr`` and
    ``cost_attr`` name node attributes of node-link files and are ignored for
    mpplan files.  Raises ``GraphFileError`` with one line naming the file and field.
    """
    if format not in FORMATS:
        raise ValueError(f"format: expected one of {', '.join(FORMATS)}, got {format!r}")
    path = Path(path)
    # read before the extension is judged: a missing file is "file not found", whatever its name
    doc = read_document(path, lambda text: (load_json if _syntax(path) == "json" else load_yaml)(text), GraphFileError)
    try:
        content = _content_format(doc) if format == "auto" else format
        if content == "node-link":
            attrs = doc.get("graph") if isinstance(doc, dict) else None
            named = isinstance(attrs, dict) and isinstance(attrs.get("name"), str) and attrs["name"] != ""
            data = cast("dict[str, Any]", doc)  # graph_from_node_link checks its type itself
            return graph_from_node_link(
                data, name=None if named else path.stem, size_attr=size_attr, cost_attr=cost_attr
            )
        graph = graph_from_dict(doc, default_name=path.stem)
        total = sum(t.nbytes for t in graph.tensors)
        if total > MAX_BYTES:
            raise GraphFileError(f"tensors: {total} bytes in all, more than 2**62")
        return graph
    except (GraphFileError, GraphError) as exc:
        raise GraphFileError(f"{path}: {exc}") from None


def save_graph(graph: Graph, path: str | os.PathLike[str]) -> Path:
    """Write ``graph`` as YAML or JSON (by extension), atomically; return the path.

    The graph is validated first, and the document is read back in memory before
    anything touches the disk, so a file is only written when ``load_graph`` will
    return an equal graph.  The file appears whole or not at all (temp file + rename).
    """
    path = Path(path)
    syntax = _syntax(path)
    graph.validate()
    doc = graph_to_dict(graph)
    try:
        again = _graph_from_doc(doc, graph.name)  # equal to a valid graph, so valid itself
    except GraphFileError as exc:
        raise GraphFileError(f"{path}: cannot save graph {graph.name!r}: {exc}") from None
    if again != graph:
        raise GraphFileError(f"{path}: cannot save graph {graph.name!r}: it would not read back as the same graph")
    text = _dump_yaml(doc) if syntax == "yaml" else _dump_json(doc)
    try:
        write_text(path, text, make_folder=False)
    except OSError as exc:
        raise GraphFileError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return path


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """The mpplan graph document of ``graph``: plain dicts, lists, strings and numbers.

    Fields equal to their defaults are left out; ``bytes`` is left out exactly when
    the reader would derive the same value (from shape and dtype, or 0 for a view).
    """
    doc: dict[str, Any] = {
        "name": graph.name,
        "tensors": {t.name: _tensor_doc(t) for t in graph.tensors},
        "ops": [_op_doc(o) for o in graph.ops],
    }
    if graph.outputs:
        doc["outputs"] = list(graph.outputs)
    return doc


def graph_from_dict(doc: object, *, default_name: str = "graph") -> Graph:
    """Build and validate a ``Graph`` from an mpplan graph document (parsed YAML/JSON).

    Raises ``GraphFileError("<dotted.field>: <what>")`` for a malformed document and
    ``GraphError`` when the graph it describes is invalid.
    """
    return _graph_from_doc(doc, default_name).validate()


def _graph_from_doc(doc: object, default_name: str) -> Graph:
    """The graph a document describes, checked field by field but not yet validated."""
    if not isinstance(doc, dict):
        got = "an empty document" if doc is None else _show(doc)
        raise GraphFileError(f"expected a mapping with keys {', '.join(_TOP_KEYS)}, got {got}")
    _check_keys(doc, _TOP_KEY_SET, _TOP_KEYS, "")
    for key in ("tensors", "ops"):
        if key not in doc:
            raise GraphFileError(f"{key}: missing; a graph file lists its tensors and its ops")
    name = doc.get("name")
    if name is None:
        name = default_name
    elif not isinstance(name, str) or not name:
        raise GraphFileError(f"name: expected a non-empty string, got {_show(name)}")
    specs = doc["tensors"]
    if specs is None:
        specs = {}
    if not isinstance(specs, dict):
        raise GraphFileError(f"tensors: expected a mapping of tensor name to fields, got {_show(specs)}")
    tensors = []
    for tname, spec in specs.items():
        if not isinstance(tname, str):
            raise GraphFileError(f"tensors: tensor names must be strings, got {_show(tname)}")
        tensors.append(_tensor(tname, spec))
    op_specs = doc["ops"]
    if op_specs is None:
        op_specs = []
    if not isinstance(op_specs, list):
        raise GraphFileError(f"ops: expected a list of ops, got {_show(op_specs)}")
    ops = [_op(spec, i) for i, spec in enumerate(op_specs)]
    outputs = _names(doc.get("outputs"), "", "outputs")
    return Graph(name, tuple(tensors), tuple(ops), outputs)


# --- reading -------------------------------------------------------------------------


def _syntax(path: Path) -> str:
    syntax = _SYNTAX.get(path.suffix.lower())
    if syntax is None:
        raise GraphFileError(f"{path}: unsupported extension {path.suffix!r}; expected .yaml, .yml or .json")
    return syntax


def _content_format(doc: object) -> str:
    """``mpplan`` or ``node-link``, from the top-level keys."""
    if isinstance(doc, dict):
        if "ops" in doc or "tensors" in doc:
            return "mpplan"
        if "nodes" in doc and ("links" in doc or "edges" in doc):
            return "node-link"
        keys = ", ".join(map(str, doc)) or "none"
        raise GraphFileError(
            "not a graph file: expected a mapping with ops and tensors (an mpplan graph) or nodes and "
            f"links (networkx node-link), got keys {keys}"
        )
    got = "an empty document" if doc is None else _show(doc)
    raise GraphFileError(f"not a graph file: expected a mapping with ops and tensors, got {got}")


def _tensor(name: str, spec: object) -> Tensor:
    """The tensor ``tensors.<name>`` describes.  The plain case, every field given with its usual
    type (an int of bytes, a list of ints, a known dtype and kind, strings), is checked inline; any
    other goes through the field checkers in order (``_checked_tensor``), which name the first bad field."""
    if type(spec) is dict and spec.keys() <= _TENSOR_KEY_SET:
        get = spec.get
        nbytes, shape, dtype, kind = get("bytes"), get("shape"), get("dtype"), get("kind")
        alias_of, grad_of = get("alias_of"), get("grad_of")
        if (
            (nbytes is None or (type(nbytes) is int and 0 <= nbytes <= MAX_BYTES))
            and (shape is None or (type(shape) is list and _INT_ONLY.issuperset(map(type, shape))
                                   and (not shape or min(shape) >= 0)))
            and (dtype is None or (type(dtype) is str and dtype in _WIDTHS))
            and (kind is None or (type(kind) is str and kind in _KINDS))
            and (alias_of is None or type(alias_of) is str)
            and (grad_of is None or type(grad_of) is str)
        ):
            return _tensor_of(name, nbytes, None if shape is None else tuple(shape), dtype,
                              None if dtype is None else _WIDTHS[dtype], _KINDS[kind or "activation"],
                              alias_of, grad_of)
    return _checked_tensor(name, spec, f"tensors.{name}")


def _checked_tensor(name: str, spec: object, where: str) -> Tensor:
    if not isinstance(spec, dict):
        raise GraphFileError(f"{where}: expected a mapping of fields ({', '.join(_TENSOR_KEYS)}), got {_show(spec)}")
    _check_keys(spec, _TENSOR_KEY_SET, _TENSOR_KEYS, where)
    get = spec.get
    nbytes = _size(get("bytes"), where, "bytes")
    shape = _shape(get("shape"), where, "shape")
    dtype, width = _dtype(get("dtype"), where, "dtype")
    kind = _kind(get("kind"), where, "kind")
    alias_of = _optional_str(get("alias_of"), where, "alias_of")
    grad_of = _optional_str(get("grad_of"), where, "grad_of")
    return _tensor_of(name, nbytes, shape, dtype, width, kind, alias_of, grad_of)


def _tensor_of(name: str, nbytes: int | None, shape: tuple[int, ...] | None, dtype: str | None, width: int | None,
               kind: Kind, alias_of: str | None, grad_of: str | None) -> Tensor:
    """The tensor from its checked fields: ``bytes`` against (or derived from) shape and dtype."""
    derived = None if shape is None or width is None else math.prod(shape) * width
    if derived is not None and derived > MAX_BYTES:
        raise GraphFileError(f"tensors.{name}: shape {_show(list(shape or ()))} makes more than 2**62 bytes")
    if nbytes is None:
        if alias_of is not None:
            nbytes = 0
        elif derived is None:
            raise GraphFileError(f"tensors.{name}: needs bytes, or shape and dtype")
        else:
            nbytes = derived
    elif derived is not None and derived != nbytes:
        raise GraphFileError(
            f"tensors.{name}: bytes {nbytes} disagree with shape {list(shape or ())} and dtype {dtype}, "
            f"which give {derived} bytes"
        )
    return Tensor(name, nbytes, kind, shape, dtype, alias_of, grad_of)


def _op(spec: object, i: int) -> Op:
    """The op ``ops[i]`` describes; the plain case (name and type strings, lists of names, a float
    or int cost, strings or nulls for the rest) inline, any other through ``_checked_op``."""
    if type(spec) is dict and spec.keys() <= _OP_KEY_SET:
        get = spec.get
        name, type_, inputs, outputs, cost = get("name"), get("type"), get("inputs"), get("outputs"), get("cost")
        optional = (get("device"), get("backward_of"), get("module"), get("stage"), get("recompute_of"))
        if (
            type(name) is str
            and type(type_) is str
            and (inputs is None or (type(inputs) is list and _STR_ONLY.issuperset(map(type, inputs))))
            and (outputs is None or (type(outputs) is list and _STR_ONLY.issuperset(map(type, outputs))))
            and (cost is None or (type(cost) is float and 0.0 <= cost < math.inf)
                 or (type(cost) is int and 0 <= cost <= MAX_BYTES))
            and _OPTIONAL_ONLY.issuperset(map(type, optional))
        ):
            return Op(name, type_, () if inputs is None else tuple(inputs), () if outputs is None else tuple(outputs),
                      0.0 if cost is None else float(cost), *optional)
    return _checked_op(spec, f"ops[{i}]")


def _checked_op(spec: object, where: str) -> Op:
    if not isinstance(spec, dict):
        raise GraphFileError(f"{where}: expected a mapping of op fields (name, type, inputs, ...), got {_show(spec)}")
    _check_keys(spec, _OP_KEY_SET, _OP_KEYS, where)
    get = spec.get
    for key in ("name", "type"):
        if get(key) is None:
            raise GraphFileError(f"{where}.{key}: missing; every op needs a name and a type")
    return Op(
        name=_string(spec["name"], where, "name"),
        type=_string(spec["type"], where, "type"),
        inputs=_names(get("inputs"), where, "inputs"),
        outputs=_names(get("outputs"), where, "outputs"),
        cost=_cost(get("cost"), where, "cost"),
        device=_optional_str(get("device"), where, "device"),
        backward_of=_optional_str(get("backward_of"), where, "backward_of"),
        module=_optional_str(get("module"), where, "module"),
        stage=_optional_str(get("stage"), where, "stage"),
        recompute_of=_optional_str(get("recompute_of"), where, "recompute_of"),
    )


# Field checkers: ``where`` and ``key`` name the field, joined only for a message;
# each takes the plain case first, since a graph of 100k ops calls them a million times.


def _field(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _check_keys(mapping: dict[Any, Any], allowed: frozenset[str], order: tuple[str, ...], where: str) -> None:
    if mapping.keys() <= allowed:
        return
    key = next(k for k in mapping if k not in allowed)
    raise GraphFileError(f"{_field(where, str(key))}: unknown key; expected one of {', '.join(order)}")


def _string(value: object, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise GraphFileError(f"{_field(where, key)}: expected a string, got {_show(value)}")
    return value


def _optional_str(value: object, where: str, key: str) -> str | None:
    return None if value is None else _string(value, where, key)


def _names(value: object, where: str, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if type(value) is list and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise GraphFileError(f"{_field(where, key)}: expected a list of tensor names, got {_show(value)}")


def _size(value: object, where: str, key: str) -> int | None:
    if value is None:
        return None
    if type(value) is int and 0 <= value <= MAX_BYTES:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise GraphFileError(
            f"{_field(where, key)}: expected a size in bytes (an integer or a string such as 64MiB), got {_show(value)}"
        )
    try:
        return parse_size(value)
    except ValueError as exc:
        raise GraphFileError(f"{_field(where, key)}: {exc}") from None


_INT_ONLY = frozenset({int})
_STR_ONLY = frozenset({str})
_OPTIONAL_ONLY = frozenset({str, type(None)})


def _shape(value: object, where: str, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if type(value) is list and _INT_ONLY.issuperset(map(type, value)) and (not value or min(value) >= 0):
        return tuple(value)  # every entry exactly an int (not a bool), none negative: checked in C
    raise GraphFileError(f"{_field(where, key)}: expected a list of non-negative integers, got {_show(value)}")


def _dtype(value: object, where: str, key: str) -> tuple[str | None, int | None]:
    """The dtype as written and its element width (both None when absent)."""
    if value is None:
        return None, None
    if not isinstance(value, str):
        raise GraphFileError(f"{_field(where, key)}: expected a dtype name such as float32, got {_show(value)}")
    try:
        return value, dtype_bytes(value)
    except ValueError as exc:
        raise GraphFileError(f"{_field(where, key)}: {exc}") from None


def _kind(value: object, where: str, key: str) -> Kind:
    if value is None:
        return Kind.ACTIVATION
    if not isinstance(value, str) or value not in _KINDS:
        raise GraphFileError(f"{_field(where, key)}: unknown kind {_show(value)}; expected one of {', '.join(_KINDS)}")
    return _KINDS[value]


def _cost(value: object, where: str, key: str) -> float:
    if value is None:
        return 0.0
    try:  # a 400-digit integer does not convert to a float
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise GraphFileError(f"{_field(where, key)}: expected a non-negative number, got {_show(value)}")
    return number


def _derived_bytes(shape: tuple[int, ...] | None, dtype: str | None) -> int | None:
    """``prod(shape) * width(dtype)``, or None when either is missing or the dtype unknown."""
    if shape is None or dtype is None:
        return None
    try:
        return math.prod(shape) * dtype_bytes(dtype)
    except ValueError:
        return None


def _show(value: object, limit: int = 60) -> str:
    """A short one-line repr for error messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- writing -------------------------------------------------------------------------


def _tensor_doc(t: Tensor) -> dict[str, Any]:
    if t.alias_of is not None:
        needs_bytes = t.nbytes != 0
    else:
        needs_bytes = _derived_bytes(t.shape, t.dtype) != t.nbytes
    doc: dict[str, Any] = {}
    if needs_bytes:
        doc["bytes"] = t.nbytes
    if t.shape is not None:
        doc["shape"] = list(t.shape)
    if t.dtype is not None:
        doc["dtype"] = t.dtype
    if t.kind is not Kind.ACTIVATION:
        doc["kind"] = t.kind.value
    if t.alias_of is not None:
        doc["alias_of"] = t.alias_of
    if t.grad_of is not None:
        doc["grad_of"] = t.grad_of
    return doc


def _op_doc(o: Op) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": o.name, "type": o.type}
    if o.inputs:
        doc["inputs"] = list(o.inputs)
    if o.outputs:
        doc["outputs"] = list(o.outputs)
    if o.cost:
        doc["cost"] = float(o.cost)
    for key in _OP_OPTIONAL:
        value = getattr(o, key)
        if value is not None:
            doc[key] = value
    return doc


class _Flow(dict[str, Any]):
    """A mapping the YAML writer puts on one line: ``{bytes: 64, kind: input}``."""


class _Dumper(yaml.SafeDumper):
    """``SafeDumper`` that writes ``_Flow`` mappings in flow style: one tensor or op per line."""


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)


def _dump_yaml(doc: dict[str, Any]) -> str:
    flow = dict(doc)
    flow["tensors"] = {k: _Flow(v) for k, v in doc["tensors"].items()}
    flow["ops"] = [_Flow(o) for o in doc["ops"]]
    # The huge width stops PyYAML folding long lines.
    return yaml.dump(flow, Dumper=_Dumper, sort_keys=False, default_flow_style=None, allow_unicode=True, width=1 << 30)


def _dump_json(doc: dict[str, Any]) -> str:
    """JSON with one tensor and one op per line: compact, and diffs stay readable."""

    one = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode  # one encoder, not one per entry

    lines = ["{", f'  "name": {one(doc["name"])},']
    tensors = [f"    {one(k)}: {one(v)}" for k, v in doc["tensors"].items()]
    lines += ['  "tensors": {', ",\n".join(tensors), "  },"] if tensors else ['  "tensors": {},']
    ops = [f"    {one(o)}" for o in doc["ops"]]
    tail = "," if "outputs" in doc else ""
    lines += ['  "ops": [', ",\n".join(ops), f"  ]{tail}"] if ops else [f'  "ops": []{tail}']
    if "outputs" in doc:
        lines.append(f'  "outputs": {one(doc["outputs"])}')
    lines.append("}")
    return "\n".join(lines) + "\n"

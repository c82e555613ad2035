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

Top-level keys: ``name`` (default: the file's stem), ``layout`` (``rows``, the
default, or ``columns``), ``tensors`` (a mapping, in tensor order), ``ops`` (a list,
in the as-given order) and ``outputs`` (default none).  Tensor fields: ``bytes`` (an integer or a size such as
``64MiB``), ``shape`` and ``dtype`` (when both are given with ``bytes`` they must agree), ``kind``
(``input``, ``param``, ``activation``, ``grad``, ``optimizer_state``, ``output``,
``workspace``; default ``activation``), ``alias_of`` and ``grad_of``.  A tensor
without ``bytes`` takes ``prod(shape) * width(dtype)``, except a view
(``alias_of``), which takes 0: a view allocates nothing, its storage is its base's,
and 0 is what a view's ``nbytes`` reads back as.  Op fields: ``name``, ``type``,
``inputs``, ``outputs``, ``cost`` (a non-negative number, default 0), ``device``,
``backward_of``, ``module``, ``stage``, ``recompute_of`` (``backward_of`` and
``recompute_of`` name ops of the graph).  ``null`` means absent.

The same fields may come as columns, one list per field (``layout: columns``; see
``mpplan.capture.graph_columns``): ``tensors`` maps ``name`` and each tensor field to a
list with one entry per tensor, ``ops`` maps each op field to a list with one entry per
op.  A 100k-op file parses in half the time that way, and is checked a column at a time;
every error is worded as the rows word it, naming the same tensor or op and field.

``load_graph`` also reads networkx node-link JSON (see ``mpplan.capture.nodelink``):
the content decides, not the extension.  Files are read by ``mpplan.reading``:
``safe_load``'s types, and no alias bombs, duplicate keys or runaway nesting.
Every error is a ``GraphFileError`` of one line, ``<file>: <dotted.field>: <what>``;
graph-validation errors come back the same way, prefixed with the file.

``save_graph`` writes YAML or JSON by extension, atomically, and only what reads
back as the very same graph: ``load_graph(save_graph(g, p)) == g``.  JSON is written
in columns (what loads fastest), YAML in rows (what people write and read); its
``layout`` argument picks either.  For graphs of 100k ops prefer JSON: PyYAML's
pure-Python ``safe_load`` is slow at that size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import yaml

from mpplan.capture.graph_columns import columns_of_rows, graph_from_columns
from mpplan.capture.graph_fields import LAYOUTS, OP_OPTIONAL, derived_bytes, graph_from_doc, show
from mpplan.capture.nodelink import graph_from_node_link
from mpplan.durable import write_text
from mpplan.errors import GraphError, GraphFileError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.reading import load_json, load_yaml, read_document
from mpplan.units import MAX_BYTES

#: Content formats ``load_graph`` accepts; ``auto`` decides from the content.
FORMATS = ("auto", "mpplan", "node-link")

_SYNTAX = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}


def load_graph(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    size_attr: str | None = None,
    cost_attr: str | None = None,
) -> Graph:
    """Read a validated ``Graph`` from a ``.yaml``, ``.yml`` or ``.json`` file.

    The extension picks the syntax; ``format`` picks the content: ``mpplan`` (a
    mapping with ``ops``/``tensors``, in rows or in columns), ``node-link`` (networkx node-link: ``nodes``
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
        graph = _graph_of(doc, path.stem)
        # The document (300k small dicts and lists for 100k ops) is dropped before validating, so
        # the topology reuses its memory: on the 100k-op file, 122k page faults (not 148k), 349 MB peak (not 448).
        del doc
        graph.validate()
        total = sum(t.nbytes for t in graph.tensors)
        if total > MAX_BYTES:
            raise GraphFileError(f"tensors: {total} bytes in all, more than 2**62")
        return graph
    except (GraphFileError, GraphError) as exc:
        raise GraphFileError(f"{path}: {exc}") from None


def save_graph(graph: Graph, path: str | os.PathLike[str], *, layout: str | None = None) -> Path:
    """Write ``graph`` as YAML or JSON (by extension), atomically; return the path.

    ``layout`` is ``rows`` (one tensor or op a line: what a person reads and diffs, and
    what mpplan before the columnar layout reads) or ``columns`` (one field a line: what
    loads fastest); by default JSON gets columns and YAML rows.  The graph is validated
    first, and the document is read back in memory before anything touches the disk,
    so a file is only written when ``load_graph`` will return an equal graph.  The file
    appears whole or not at all (temp file + rename).
    """
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    path = Path(path)
    syntax = _syntax(path)
    graph.validate()
    doc = graph_to_dict(graph)
    if (layout or ("columns" if syntax == "json" else "rows")) == "columns":
        doc = columns_of_rows(doc)
    try:
        again = _graph_of(doc, graph.name)  # equal to a valid graph, so valid itself
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
    """Build and validate a ``Graph`` from an mpplan graph document (parsed YAML/JSON), in either layout.

    Raises ``GraphFileError("<dotted.field>: <what>")`` for a malformed document and
    ``GraphError`` when the graph it describes is invalid.
    """
    return _graph_of(doc, default_name).validate()


# --- reading -------------------------------------------------------------------------


def _graph_of(doc: object, default_name: str) -> Graph:
    """The graph of an mpplan document, not yet validated: its ``layout`` key picks the reader."""
    if isinstance(doc, dict) and doc.get("layout") == "columns":
        return graph_from_columns(doc, default_name)
    return graph_from_doc(doc, default_name)


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
    got = "an empty document" if doc is None else show(doc)
    raise GraphFileError(f"not a graph file: expected a mapping with ops and tensors, got {got}")


# --- writing -------------------------------------------------------------------------


def _tensor_doc(t: Tensor) -> dict[str, Any]:
    if t.alias_of is not None:
        needs_bytes = t.nbytes != 0
    else:
        needs_bytes = derived_bytes(t.shape, t.dtype) != t.nbytes
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
    for key in OP_OPTIONAL:
        value = getattr(o, key)
        if value is not None:
            doc[key] = value
    return doc


class _Flow(dict[str, Any]):
    """A mapping the YAML writer puts on one line: ``{bytes: 64, kind: input}``."""


class _FlowList(list[Any]):
    """A list the YAML writer puts on one line: a column, ``[x, w, h]``."""


class _Dumper(yaml.SafeDumper):
    """``SafeDumper`` that writes ``_Flow`` and ``_FlowList`` in flow style: one tensor, op or column per line."""


_Dumper.add_representer(
    _Flow, lambda dumper, data: dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)
)
_Dumper.add_representer(
    _FlowList, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
)


def _dump_yaml(doc: dict[str, Any]) -> str:
    flow = dict(doc)
    if doc.get("layout") == "columns":
        flow["tensors"] = {k: _FlowList(v) for k, v in doc["tensors"].items()}
        flow["ops"] = {k: _FlowList(v) for k, v in doc["ops"].items()}
    else:
        flow["tensors"] = {k: _Flow(v) for k, v in doc["tensors"].items()}
        flow["ops"] = [_Flow(o) for o in doc["ops"]]
    # The huge width stops PyYAML folding long lines.
    return yaml.dump(flow, Dumper=_Dumper, sort_keys=False, default_flow_style=None, allow_unicode=True, width=1 << 30)


def _dump_json(doc: dict[str, Any]) -> str:
    """JSON with one tensor and one op (rows) or one column (columns) per line: compact; rows also diff
    line by line, while one edit in columns rewrites its column's line."""

    one = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode  # one encoder, not one per entry

    lines = ["{"]
    for n, (key, value) in enumerate(doc.items()):
        comma = "," if n < len(doc) - 1 else ""
        if key not in ("tensors", "ops") or not value:
            lines.append(f"  {one(key)}: {one(value)}{comma}")
        elif isinstance(value, dict):  # rows' tensors, or a table of columns: an item a line
            items = ",\n".join(f"    {one(k)}: {one(v)}" for k, v in value.items())
            lines += [f"  {one(key)}: {{", items, f"  }}{comma}"]
        else:  # rows' ops: an op a line
            lines += [f"  {one(key)}: [", ",\n".join(f"    {one(v)}" for v in value), f"  ]{comma}"]
    lines.append("}")
    return "\n".join(lines) + "\n"

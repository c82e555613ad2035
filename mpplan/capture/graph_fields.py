"""The fields of a graph document: each tensor's and op's, checked one by one, into the IR.

``graph_from_doc`` turns a parsed mpplan graph document of the row layout into a ``Graph``
(not yet validated), raising ``GraphFileError("<dotted.field>: <what>")`` at the first bad
field.  The usual fields are checked inline (``tensor_from_row``, ``op_from_row``); anything
unusual falls back to the field checkers (``_checked_tensor``, ``_checked_op``), which give the
same first error (tests/test_graph_file_fast.py holds the two paths to that).  The columnar
layout (``graph_columns``) shares the top level (``graph_name``) and, off its plain case, the
row functions, so both layouts word every error alike."""

from __future__ import annotations

import math
from typing import Any

from mpplan.capture.bulk import new_op, new_tensor
from mpplan.errors import GraphFileError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.units import DTYPE_BYTES, MAX_BYTES, dtype_bytes, parse_size

_TOP_KEYS = ("name", "layout", "tensors", "ops", "outputs")
#: The two layouts of a graph document: ``rows`` (the default) and ``columns`` (``graph_columns``).
LAYOUTS = ("rows", "columns")
TENSOR_KEYS = ("bytes", "shape", "dtype", "kind", "alias_of", "grad_of")
OP_KEYS = ("name", "type", "inputs", "outputs", "cost", "device", "backward_of", "module", "stage", "recompute_of")
OP_OPTIONAL = ("device", "backward_of", "module", "stage", "recompute_of")
_TOP_KEY_SET = frozenset(_TOP_KEYS)
_TENSOR_KEY_SET = frozenset(TENSOR_KEYS)
_OP_KEY_SET = frozenset(OP_KEYS)
KINDS = {k.value: k for k in Kind}
#: Element width of each dtype name a graph file may use (``torch.float32`` as well as ``float32``).
WIDTHS = {**DTYPE_BYTES, **{f"torch.{name}": width for name, width in DTYPE_BYTES.items()}}


def graph_from_doc(doc: object, default_name: str) -> Graph:
    """The graph a row-layout document describes, checked field by field but not yet validated."""
    name = graph_name(doc, default_name)
    assert isinstance(doc, dict)  # graph_name refuses anything else
    specs = doc["tensors"]
    if specs is None:
        specs = {}
    if not isinstance(specs, dict):
        raise GraphFileError(f"tensors: expected a mapping of tensor name to fields, got {show(specs)}")
    tensors = []
    for tname, spec in specs.items():
        if not isinstance(tname, str):
            raise GraphFileError(f"tensors: tensor names must be strings, got {show(tname)}")
        tensors.append(tensor_from_row(tname, spec))
    op_specs = doc["ops"]
    if op_specs is None:
        op_specs = []
    if not isinstance(op_specs, list):
        raise GraphFileError(f"ops: expected a list of ops, got {show(op_specs)}")
    ops = [op_from_row(spec, i) for i, spec in enumerate(op_specs)]
    outputs = name_list(doc.get("outputs"), "", "outputs")
    return Graph(name, tuple(tensors), tuple(ops), outputs)


def graph_name(doc: object, default_name: str) -> str:
    """The graph's name, once the top level of a document (either layout) is checked: a mapping of
    the known keys, ``tensors`` and ``ops`` present, ``layout`` one of ``LAYOUTS`` when given."""
    if not isinstance(doc, dict):
        got = "an empty document" if doc is None else show(doc)
        raise GraphFileError(f"expected a mapping with keys {', '.join(_TOP_KEYS)}, got {got}")
    _check_keys(doc, _TOP_KEY_SET, _TOP_KEYS, "")
    layout = doc.get("layout")
    if layout is not None and layout not in LAYOUTS:
        raise GraphFileError(f"layout: expected {' or '.join(LAYOUTS)}, got {show(layout)}")
    for key in ("tensors", "ops"):
        if key not in doc:
            raise GraphFileError(f"{key}: missing; a graph file lists its tensors and its ops")
    name = doc.get("name")
    if name is None:
        return default_name
    if not isinstance(name, str) or not name:
        raise GraphFileError(f"name: expected a non-empty string, got {show(name)}")
    return name


def tensor_from_row(name: str, spec: object) -> Tensor:
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
            and (dtype is None or (type(dtype) is str and dtype in WIDTHS))
            and (kind is None or (type(kind) is str and kind in KINDS))
            and (alias_of is None or type(alias_of) is str)
            and (grad_of is None or type(grad_of) is str)
        ):
            return _tensor_of(name, nbytes, None if shape is None else tuple(shape), dtype,
                              None if dtype is None else WIDTHS[dtype], KINDS[kind or "activation"],
                              alias_of, grad_of)
    return _checked_tensor(name, spec, f"tensors.{name}")


def _checked_tensor(name: str, spec: object, where: str) -> Tensor:
    if not isinstance(spec, dict):
        raise GraphFileError(f"{where}: expected a mapping of fields ({', '.join(TENSOR_KEYS)}), got {show(spec)}")
    _check_keys(spec, _TENSOR_KEY_SET, TENSOR_KEYS, where)
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
        raise GraphFileError(f"tensors.{name}: shape {show(list(shape or ()))} makes more than 2**62 bytes")
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
    return new_tensor(name, nbytes, kind, shape, dtype, alias_of, grad_of)


def op_from_row(spec: object, i: int) -> Op:
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
            return new_op(name, type_, () if inputs is None else tuple(inputs),
                          () if outputs is None else tuple(outputs), 0.0 if cost is None else float(cost), *optional)
    return _checked_op(spec, f"ops[{i}]")


def _checked_op(spec: object, where: str) -> Op:
    if not isinstance(spec, dict):
        raise GraphFileError(f"{where}: expected a mapping of op fields (name, type, inputs, ...), got {show(spec)}")
    _check_keys(spec, _OP_KEY_SET, OP_KEYS, where)
    get = spec.get
    for key in ("name", "type"):
        if get(key) is None:
            raise GraphFileError(f"{where}.{key}: missing; every op needs a name and a type")
    return Op(
        name=_string(spec["name"], where, "name"),
        type=_string(spec["type"], where, "type"),
        inputs=name_list(get("inputs"), where, "inputs"),
        outputs=name_list(get("outputs"), where, "outputs"),
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
        raise GraphFileError(f"{_field(where, key)}: expected a string, got {show(value)}")
    return value


def _optional_str(value: object, where: str, key: str) -> str | None:
    return None if value is None else _string(value, where, key)


def name_list(value: object, where: str, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if type(value) is list and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise GraphFileError(f"{_field(where, key)}: expected a list of tensor names, got {show(value)}")


def _size(value: object, where: str, key: str) -> int | None:
    if value is None:
        return None
    if type(value) is int and 0 <= value <= MAX_BYTES:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise GraphFileError(
            f"{_field(where, key)}: expected a size in bytes (an integer or a string such as 64MiB), got {show(value)}"
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
    raise GraphFileError(f"{_field(where, key)}: expected a list of non-negative integers, got {show(value)}")


def _dtype(value: object, where: str, key: str) -> tuple[str | None, int | None]:
    """The dtype as written and its element width (both None when absent)."""
    if value is None:
        return None, None
    if not isinstance(value, str):
        raise GraphFileError(f"{_field(where, key)}: expected a dtype name such as float32, got {show(value)}")
    try:
        return value, dtype_bytes(value)
    except ValueError as exc:
        raise GraphFileError(f"{_field(where, key)}: {exc}") from None


def _kind(value: object, where: str, key: str) -> Kind:
    if value is None:
        return Kind.ACTIVATION
    if not isinstance(value, str) or value not in KINDS:
        raise GraphFileError(f"{_field(where, key)}: unknown kind {show(value)}; expected one of {', '.join(KINDS)}")
    return KINDS[value]


def _cost(value: object, where: str, key: str) -> float:
    if value is None:
        return 0.0
    try:  # a 400-digit integer does not convert to a float
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise GraphFileError(f"{_field(where, key)}: expected a non-negative number, got {show(value)}")
    return number


def derived_bytes(shape: tuple[int, ...] | None, dtype: str | None) -> int | None:
    """``prod(shape) * width(dtype)``, or None when either is missing or the dtype unknown."""
    if shape is None or dtype is None:
        return None
    try:
        return math.prod(shape) * dtype_bytes(dtype)
    except ValueError:
        return None


def show(value: object, limit: int = 60) -> str:
    """A short one-line repr for error messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

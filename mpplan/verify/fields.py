"""The types of the graph's and the plan's fields, for the verifier: ``check_unseen`` up front, ``check_fields`` to
name a fault.

``verify`` trusts nothing it is handed.  The loaders (graph files, ``plan.json``) check each
field's type, but a ``Graph`` or ``Plan`` built in Python passes through none of them.  A wrong
type either makes a check after this one raise a bare ``TypeError``, ``KeyError``,
``AttributeError`` or ``ValueError`` (or the graph hash, which encodes every field), or passes
it unseen.  So, as elsewhere in the verifier, the common case costs little and a fault is worded
when met:

* ``check_unseen``, before anything reads the fields: what no later check would notice, each in C
  over one column: a tensor's size (an integer, not below zero: a negative or fractional size adds up
  like any other), its kind (a ``Kind``: a plain string equals one but is no ``Kind.PARAM``), and
  every container (a string where a tuple of names belongs is read as its characters).  About 6% of
  the rest of ``verify`` on a 34k-op training graph, where the full check below would cost half of it.
* ``check_fields``, when a check has raised a bare error: every field of every record, the first
  of another type named (the caller re-raises the error when none is, as the bug it then is).

Each names the tensor, op or plan field (in ``plan.json``'s words: ``buffers.h.offset``,
``devices[0].capacity_bytes``) in a ``VerificationError``.  Types are exact: a ``bool`` is no
integer, a ``str`` no ``Kind``.  Fields that hold the same types are read together, a column at a
time in C (``_FieldGroup``); only a column that fails is walked in Python, to name the record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Block, Buffer, Copy, DevicePlan, Plan
from mpplan.plan_records import RematRecord

__all__ = ["check_fields", "check_unseen"]

_NONE: type = type(None)
_STR: frozenset[type] = frozenset({str})
_OPTIONAL_STR: frozenset[type] = frozenset({str, _NONE})
_INT: frozenset[type] = frozenset({int})
_SEQUENCE: frozenset[type] = frozenset({tuple, list})
_KINDS = ", ".join(kind.value for kind in Kind)


@dataclass(frozen=True, slots=True)
class _FieldGroup:
    """Fields of one record type that hold the same types: ``types`` (exact), said as ``what``."""

    fields: tuple[str, ...]
    types: frozenset[type]
    what: str

    def check(self, records: Sequence[Any], label: Callable[[int], str]) -> None:
        """Each record's fields of this group are of ``types``; else fail naming ``label(i)`` of the first at fault."""
        get = attrgetter(*self.fields)
        values = map(get, records) if len(self.fields) == 1 else chain.from_iterable(map(get, records))
        if self.types.issuperset(map(type, values)):  # the common case, in C
            return
        for i, record in enumerate(records):
            for name in self.fields:
                value = getattr(record, name)
                if type(value) not in self.types:
                    _fail(f"{label(i)}: {name}: expected {self.what}, got {_short(value)}")


#: What ``check_unseen`` reads: a tensor's size and kind, an op's lists of tensors.
_UNSEEN_TENSOR_FIELDS = (
    _FieldGroup(("nbytes",), _INT, "a non-negative integer"),
    _FieldGroup(("kind",), frozenset({Kind}), f"a Kind ({_KINDS})"),
)
_OP_TENSORS = _FieldGroup(("inputs", "outputs"), _SEQUENCE, "a tuple of tensor names")
_TENSOR_FIELDS = (
    _FieldGroup(("name",), _STR, "a string"),
    *_UNSEEN_TENSOR_FIELDS,
    _FieldGroup(("dtype", "alias_of", "grad_of"), _OPTIONAL_STR, "a string or None"),
    _FieldGroup(("shape",), _SEQUENCE | {_NONE}, "a tuple of integers or None"),
)
_OP_FIELDS = (
    _FieldGroup(("name", "type"), _STR, "a string"),
    _OP_TENSORS,
    _FieldGroup(("cost",), frozenset({int, float}), "a number"),
    _FieldGroup(("device", "backward_of", "module", "stage", "recompute_of"), _OPTIONAL_STR, "a string or None"),
)
_DEVICE_FIELDS = (
    _FieldGroup(("name",), _STR, "a string"),
    _FieldGroup(("capacity_bytes", "static_bytes", "arena_bytes", "peak_bytes", "lower_bound_bytes", "scratch_bytes"),
                _INT, "an integer"),
)
_BUFFER_FIELDS = (_FieldGroup(("device",), _STR, "a string"), _FieldGroup(("offset", "bytes"), _INT, "an integer"))
_COPY_FIELDS = (_FieldGroup(("name", "tensor", "src", "dst"), _STR, "a string"), _FieldGroup(("bytes",), _INT,
                                                                                           "an integer"))
_REMAT_FIELDS = (
    _FieldGroup(("tensor", "op", "recompute_op", "recompute_tensor"), _STR, "a string"),
    _FieldGroup(("bytes",), _INT, "an integer"),
    _FieldGroup(("from_op",), _OPTIONAL_STR, "a string or None"),
)
_BLOCK_FIELDS = (
    _FieldGroup(("device",), _STR, "a string"),
    _FieldGroup(("offset", "bytes", "first", "last"), _INT, "an integer"),
    _FieldGroup(("adopts",), _OPTIONAL_STR, "a string or None"),
)


#: The plan's lists of records: (field, record type).
_PLAN_LISTS = (("devices", DevicePlan), ("copies", Copy), ("remat", RematRecord), ("blocks", Block))


def check_unseen(graph: Graph, plan: Plan) -> None:
    """Fail naming the first field of a type that no later check of the verifier would notice: a tensor's
    size and kind, and the type of every container of the graph and the plan."""
    tensors = _records(graph.tensors, Tensor, "graph.tensors")
    ops = _records(graph.ops, Op, "graph.ops")
    _sequence(graph.outputs, "graph.outputs", "tensor names")
    tensor_label = _labeller(tensors, "tensor", "graph.tensors")
    for group in _UNSEEN_TENSOR_FIELDS:
        group.check(tensors, tensor_label)
    _non_negative(tensors, tensor_label)
    _OP_TENSORS.check(ops, _labeller(ops, "op", "graph.ops"))
    for field, cls in _PLAN_LISTS:
        _records(getattr(plan, field), cls, field)
    _sequence(plan.schedule, "schedule", "op names")
    for field in ("placement", "buffers", "scratch"):
        if not isinstance(getattr(plan, field), Mapping):
            _fail(f"{field}: expected a mapping, got {_short(getattr(plan, field))}")


def check_fields(graph: Graph, plan: Plan) -> None:
    """Fail naming the first field of ``graph`` or ``plan`` whose value is not of its type (or a negative size)."""
    _check_graph(graph)
    _check_plan(plan)


def _check_graph(graph: Graph) -> None:
    tensors = _records(graph.tensors, Tensor, "graph.tensors")
    ops = _records(graph.ops, Op, "graph.ops")
    _names(_sequence(graph.outputs, "graph.outputs", "tensor names"), "graph.outputs", "a tensor name")
    tensor_label = _labeller(tensors, "tensor", "graph.tensors")
    for group in _TENSOR_FIELDS:
        group.check(tensors, tensor_label)
    _non_negative(tensors, tensor_label)
    shapes = [s for s in map(attrgetter("shape"), tensors) if s is not None]
    if not _INT.issuperset(map(type, chain.from_iterable(shapes))):
        i = next(i for i, t in enumerate(tensors) if t.shape is not None and not _INT.issuperset(map(type, t.shape)))
        _fail(f"{tensor_label(i)}: shape: expected a tuple of integers or None, got {_short(tensors[i].shape)}")
    op_label = _labeller(ops, "op", "graph.ops")
    for group in _OP_FIELDS:
        group.check(ops, op_label)
    for role in ("inputs", "outputs"):
        listed = list(map(attrgetter(role), ops))
        if not _STR.issuperset(map(type, chain.from_iterable(listed))):
            i = next(i for i, names in enumerate(listed) if not _STR.issuperset(map(type, names)))
            _fail(f"{op_label(i)}: {role}: expected a tuple of tensor names, got {_short(listed[i])}")


def _check_plan(plan: Plan) -> None:
    if type(plan.graph_hash) is not str:
        _fail(f"graph.hash: expected a string, got {_short(plan.graph_hash)}")
    for name in ("max_peak_bytes", "cross_device_bytes"):
        value = getattr(plan, name)
        if type(value) is not int:
            _fail(f"predicted.{name}: expected an integer, got {_short(value)}")
    for (field, cls), groups in zip(_PLAN_LISTS, (_DEVICE_FIELDS, _COPY_FIELDS, _REMAT_FIELDS, _BLOCK_FIELDS)):
        records = _records(getattr(plan, field), cls, field)
        for group in groups:
            group.check(records, _indexed(field))
    _names(_sequence(plan.schedule, "schedule", "op names"), "schedule", "an op name")
    _mapping(plan.placement, "placement", _STR, "a device name (a string)")
    _mapping(plan.scratch, "scratch", _INT, "an integer")
    buffers = _mapping(plan.buffers, "buffers", frozenset({Buffer}), "a Buffer")
    keys = list(buffers)
    for group in _BUFFER_FIELDS:
        group.check(list(buffers.values()), lambda i: f"buffers.{keys[i]}")


def _non_negative(tensors: Sequence[Tensor], label: Callable[[int], str]) -> None:
    """No tensor's size (an integer each, checked before) is below zero."""
    nbytes = list(map(attrgetter("nbytes"), tensors))
    if nbytes and min(nbytes) < 0:
        i = next(i for i, n in enumerate(nbytes) if n < 0)
        _fail(f"{label(i)}: nbytes: expected a non-negative integer, got {nbytes[i]}")


def _records(records: Any, cls: type, where: str) -> Sequence[Any]:
    """``records``, a tuple or list of ``cls`` records."""
    _sequence(records, where, f"{cls.__name__} records")
    if not frozenset({cls}).issuperset(map(type, records)):
        i = next(i for i, r in enumerate(records) if type(r) is not cls)
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        _fail(f"{where}[{i}]: expected {article} {cls.__name__}, got {_short(records[i])}")
    return records


def _sequence(value: Any, where: str, what: str) -> Sequence[Any]:
    """``value``, a tuple or list (a string is a sequence too, of characters: refused)."""
    if type(value) not in _SEQUENCE:
        _fail(f"{where}: expected a tuple of {what}, got {_short(value)}")
    return value


def _names(values: Sequence[Any], where: str, what: str) -> None:
    if not _STR.issuperset(map(type, values)):
        i = next(i for i, v in enumerate(values) if type(v) is not str)
        _fail(f"{where}[{i}]: expected {what} (a string), got {_short(values[i])}")


def _mapping(value: Any, where: str, types: frozenset[type], what: str) -> Mapping[str, Any]:
    """``value``, a mapping of strings to values of ``types`` (exactly), said as ``what``."""
    if not isinstance(value, Mapping):
        _fail(f"{where}: expected a mapping, got {_short(value)}")
    if not _STR.issuperset(map(type, value)):
        key = next(k for k in value if type(k) is not str)
        _fail(f"{where}: expected string keys, got {_short(key)}")
    if not types.issuperset(map(type, value.values())):
        key = next(k for k, v in value.items() if type(v) not in types)
        _fail(f"{where}.{key}: expected {what}, got {_short(value[key])}")
    return value


def _indexed(where: str) -> Callable[[int], str]:
    """``devices[i]``: a record of a plan list, as ``plan.json`` names it."""
    return lambda i: f"{where}[{i}]"


def _labeller(records: Sequence[Any], noun: str, where: str) -> Callable[[int], str]:
    """``tensor 'x'`` for record ``i`` when its name is a string, else ``graph.tensors[i]``."""
    def label(i: int) -> str:
        name = records[i].name
        return f"{noun} {name!r}" if type(name) is str else f"{where}[{i}]"
    return label


def _short(value: Any) -> str:
    """``repr`` cut to 40 characters: one readable error line whatever the field holds."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def _fail(message: str) -> None:
    raise VerificationError(message)

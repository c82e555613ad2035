"""The columnar layout of a graph document: one list per field, checked a column at a time.

A document with ``layout: columns`` holds the fields of the row layout (``graph_file``),
each table as a mapping of field name to a list with one entry per tensor (per op), in
tensor (op) order::

    {"name": "tiny", "layout": "columns",
     "tensors": {"name": ["x", "w", "h", "hv"], "bytes": [64, null, 64, null],
                 "shape": [null, [4, 4], null, null], "dtype": [null, "float32", null, null],
                 "kind": ["input", "param", null, null], "alias_of": [null, null, null, "h"]},
     "ops": {"name": ["fc", "relu"], "type": ["Linear", "Relu"], "inputs": [["x", "w"], ["h"]],
             "outputs": [["h"], ["h"]], "cost": [2.0, null]},
     "outputs": ["h"]}

``tensors.name``, ``ops.name`` and ``ops.type`` are required; another column left out is
a column of nulls, and null means absent, as in the rows.  Why: a JSON parser makes a few
long lists here where the rows make a small dict per tensor and op (the 100k-op file: 2 of
them, not 208k), and a column is checked by passes that run in C (``set(map(type, ...))``,
``min``, ``max``), not entry by entry.  A table off that plain case (a size written
``64MiB``, a bad value) goes through the row functions of ``graph_fields`` entry by entry,
each entry rebuilt as its row: every value the rows accept is accepted here, and every error
is the rows' own message, naming the same tensor (``tensors.<name>.<field>``) or op
(``ops[<i>].<field>``).  What only columns can get wrong (a missing or unknown column, a
column that is not a list, null included, columns of unequal length) is one line naming the
column.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any

from mpplan.capture.graph_fields import (
    KINDS,
    OP_KEYS,
    TENSOR_KEYS,
    WIDTHS,
    graph_name,
    name_list,
    op_from_row,
    show,
    tensor_from_row,
)
from mpplan.errors import GraphFileError
from mpplan.from_columns import from_columns
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.units import MAX_BYTES

#: The columns of each table, in the order the writer puts them and errors list them.
TENSOR_COLUMNS = ("name", *TENSOR_KEYS)
OP_COLUMNS = OP_KEYS
_REQUIRED = {"tensors": ("name",), "ops": ("name", "type")}
_NONE: type = type(None)
_STR: frozenset[type] = frozenset({str})
_INT: frozenset[type] = frozenset({int})
_STR_OR_NONE: frozenset[type] = frozenset({str, _NONE})
_INT_OR_NONE: frozenset[type] = frozenset({int, _NONE})
_LIST_OR_NONE: frozenset[type] = frozenset({list, _NONE})
_NUMBER_OR_NONE: frozenset[type] = frozenset({int, float, _NONE})
#: Width of each dtype and kind of each name, and what a null (absent) entry takes.
_WIDTH: dict[str | None, int | None] = {None: None, **{name: width for name, width in WIDTHS.items()}}
_KIND: dict[str | None, Kind] = {None: Kind.ACTIVATION, **{name: kind for name, kind in KINDS.items()}}


def graph_from_columns(doc: dict[str, Any], default_name: str) -> Graph:
    """The graph a columnar document describes, checked but not yet validated (``GraphFileError``)."""
    name = graph_name(doc, default_name)
    tensors = _tensors(_table(doc["tensors"], "tensors", TENSOR_COLUMNS))
    ops = _ops(_table(doc["ops"], "ops", OP_COLUMNS))
    return Graph(name, tuple(tensors), tuple(ops), name_list(doc.get("outputs"), "", "outputs"))


def columns_of_rows(doc: dict[str, Any]) -> dict[str, Any]:
    """The columnar document of a row-layout one (``graph_file.graph_to_dict``'s).

    Each entry's fields go to their columns, null where the row leaves a field out; a column
    null throughout is left out, but for the required ones.
    """
    tensor_rows = [{"name": name, **fields} for name, fields in doc["tensors"].items()]
    columns = {"name": doc["name"], "layout": "columns", "tensors": _columns(tensor_rows, "tensors", TENSOR_COLUMNS),
               "ops": _columns(doc["ops"], "ops", OP_COLUMNS)}
    if "outputs" in doc:
        columns["outputs"] = doc["outputs"]
    return columns


def _columns(rows: list[dict[str, Any]], table: str, order: tuple[str, ...]) -> dict[str, list[Any]]:
    columns = {key: [row.get(key) for row in rows] for key in order}
    return {key: column for key, column in columns.items()
            if key in _REQUIRED[table] or any(value is not None for value in column)}


# --- the shape of a table ------------------------------------------------------------


def _table(value: object, table: str, order: tuple[str, ...]) -> dict[str, list[Any]]:
    """``tensors`` or ``ops`` as a mapping of known columns, each a list, the required ones present, all one length."""
    if not isinstance(value, dict):
        raise GraphFileError(f"{table}: expected a mapping of field name to a list (the columnar layout), "
                             f"got {show(value)}")
    unknown = [key for key in value if key not in order]
    if unknown:
        raise GraphFileError(f"{table}.{unknown[0]}: unknown column; expected one of {', '.join(order)}")
    for key in _REQUIRED[table]:
        if key not in value:
            raise GraphFileError(f"{table}.{key}: missing column; the columnar layout needs "
                                 f"{' and '.join(_REQUIRED[table])}")
    for key, column in value.items():
        if not isinstance(column, list):
            raise GraphFileError(f"{table}.{key}: expected a list, one entry per {table[:-1]}, got {show(column)}")
    count = len(value["name"])
    for key, column in value.items():
        if len(column) != count:
            raise GraphFileError(f"{table}.{key}: {len(column)} entries, but {table}.name has {count}; every column "
                                 f"has one entry per {table[:-1]}")
    return value


def _column(columns: dict[str, list[Any]], key: str) -> list[Any]:
    """A column, or nulls for one left out."""
    found = columns.get(key)
    return [None] * len(columns["name"]) if found is None else found


def _only(values: Any, types: frozenset[type]) -> bool:
    """Whether every value is exactly of one of ``types`` (a bool is no int): one pass in C."""
    return types.issuperset(map(type, values))


# --- tensors -------------------------------------------------------------------------


def _tensors(columns: dict[str, list[Any]]) -> list[Tensor]:
    """The tensors of the table, from whole columns when every value is of the plain case, else row by row."""
    names, nbytes, shapes, dtypes, kinds, aliases, grads = (_column(columns, key) for key in TENSOR_COLUMNS)
    if not (_only(names, _STR) and _only(nbytes, _INT_OR_NONE) and _only(shapes, _LIST_OR_NONE)
            and _only(dtypes, _STR_OR_NONE) and _only(kinds, _STR_OR_NONE) and _only(aliases, _STR_OR_NONE)
            and _only(grads, _STR_OR_NONE) and _WIDTH.keys() >= set(dtypes) and _KIND.keys() >= set(kinds)):
        return _tensors_by_row(columns)
    given = list(filter(None, nbytes))  # without nulls (and zeros, which are in range)
    dims = list(chain.from_iterable(filter(None, shapes)))
    if (given and (min(given) < 0 or max(given) > MAX_BYTES)) or not _only(dims, _INT) or (dims and min(dims) < 0):
        return _tensors_by_row(columns)
    widths = list(map(_WIDTH.__getitem__, dtypes))
    derived = [None if s is None or w is None else math.prod(s) * w for s, w in zip(shapes, widths)]
    # bytes as given, else 0 for a view, else derived from shape and dtype (None: neither, an error)
    sizes = [b if b is not None else 0 if a is not None else d for b, a, d in zip(nbytes, aliases, derived)]
    disagree = [b is not None and d is not None and b != d for b, d in zip(nbytes, derived)]
    if None in sizes or any(disagree) or max(filter(None, derived), default=0) > MAX_BYTES:
        return _tensors_by_row(columns)
    shapes = [None if s is None else tuple(s) for s in shapes]
    return from_columns(Tensor, names, sizes, list(map(_KIND.__getitem__, kinds)), shapes, dtypes, aliases, grads)


def _tensors_by_row(columns: dict[str, list[Any]]) -> list[Tensor]:
    """Each tensor through the row layout's function, its entries of every column as its row's fields."""
    fields = [key for key in columns if key != "name"]
    tensors = []
    for i, name in enumerate(columns["name"]):
        if not isinstance(name, str):
            raise GraphFileError(f"tensors: tensor names must be strings, got {show(name)}")
        tensors.append(tensor_from_row(name, {key: columns[key][i] for key in fields}))
    return tensors


# --- ops -----------------------------------------------------------------------------


def _ops(columns: dict[str, list[Any]]) -> list[Op]:
    """The ops of the table, from whole columns when every value is of the plain case, else row by row."""
    names, types, inputs, outputs, costs, *optional = (_column(columns, key) for key in OP_COLUMNS)
    if not (_only(names, _STR) and _only(types, _STR) and _only(inputs, _LIST_OR_NONE)
            and _only(outputs, _LIST_OR_NONE) and _only(costs, _NUMBER_OR_NONE)
            and all(_only(column, _STR_OR_NONE) for column in optional)
            and _only(chain.from_iterable(filter(None, chain(inputs, outputs))), _STR)):
        return _ops_by_row(columns)
    try:  # a 400-digit integer does not convert to a float
        floats = [0.0 if c is None else float(c) for c in costs]
    except OverflowError:
        return _ops_by_row(columns)
    if floats and not (all(map(math.isfinite, floats)) and min(floats) >= 0):  # finite first: min of a NaN is anything
        return _ops_by_row(columns)
    inputs = [() if names_ is None else tuple(names_) for names_ in inputs]
    outputs = [() if names_ is None else tuple(names_) for names_ in outputs]
    return from_columns(Op, names, types, inputs, outputs, floats, *optional)


def _ops_by_row(columns: dict[str, list[Any]]) -> list[Op]:
    """Each op through the row layout's function, its entries of every column as its row's fields."""
    return [op_from_row({key: column[i] for key, column in columns.items()}, i) for i in range(len(columns["name"]))]

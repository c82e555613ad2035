"""``json.dumps(data, indent=1)``, byte for byte, faster (plan.json of a 100k-op graph: 0.49 s -> 0.32 s).

With ``indent`` set, the standard library encodes in pure Python through a chain of
generators; its C encoder serves only the one-line form.  ``dumps_indented`` walks the
containers itself and hands each container of scalars only (most of a plan) to that C
encoder in one call, its item separator carrying the newline and indentation; a mapping of
uniform records is written column by column (``records_text``), and a ``Table`` (a plan's
buffers, which ``save_plan`` hands over as columns) straight from its columns.  Anything else
(a non-string key beside nested values, a subclass of dict or list, a scalar of another type,
a cycle) is left to ``json.dumps`` for the whole document, so results and errors stay exactly
the standard ones.

>>> data = {"a": [1, 2.5, None], "b": {}, "c": [{"d": "é"}]}
>>> dumps_indented(data) == json.dumps(data, indent=1)
True
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from operator import itemgetter
from typing import Any

_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR_ONLY = frozenset({str})
_DICT_ONLY = frozenset({dict})


class _Unusual(Exception):
    """A value outside the plain types: the standard encoder takes the whole document."""


def dumps_indented(data: Any) -> str:
    """Exactly ``json.dumps(data, indent=1)``, a ``Table`` written as its mapping (``Table.as_dict``)."""
    pieces: list[str] = []
    try:
        _encode(data, pieces, "\n", {})
    except (_Unusual, RecursionError):
        return json.dumps(data, indent=1, default=_plain)
    return "".join(pieces)


def _flat_encoder(item_separator: str) -> Callable[[Any], str]:
    """The standard C encoder's one-shot form, as ``json.dumps`` sets it up, made once for many calls."""
    if c_make_encoder is None:  # a Python without the C accelerator
        return json.JSONEncoder(separators=(item_separator, ": ")).encode
    encoder = c_make_encoder(
        None, _no_default, encode_basestring_ascii, None, ": ", item_separator, False, False, True
    )
    return lambda value: "".join(encoder(value, 0))


def _plain(value: Any) -> Any:
    """The standard encoder's ``default``: a ``Table`` as its mapping; anything else is the standard error."""
    if type(value) is Table:
        return value.as_dict()
    return _no_default(value)


def _no_default(value: Any) -> Any:
    """The standard encoder's error for a value JSON has no form for (the flat encoder only meets scalars)."""
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _encode(value: Any, pieces: list[str], newline: str, flat: dict[str, Callable[[Any], str]]) -> None:
    """Append ``value`` as json writes it at the indentation ``newline`` ends with.

    A container of scalars only (most of a plan) goes to the standard C encoder in one call, with
    the item separator carrying the newline and indentation; ``flat`` keeps one such encoder per depth.
    """
    kind = type(value)
    if kind is Table:
        text = _table_text(value.keys, value.fields, value.columns, newline)
        if text is None:
            _encode(value.as_dict(), pieces, newline, flat)
        else:
            pieces.append(text)
        return
    if kind is not dict and kind is not list and kind is not tuple:
        if kind not in _SCALARS:
            raise _Unusual
        pieces.append(json.dumps(value))
        return
    if not value:
        pieces.append("{}" if kind is dict else "[]")
        return
    inner = newline + " "
    items = value.values() if kind is dict else value
    if _SCALARS.issuperset(map(type, items)):
        encode = flat.get(inner)
        if encode is None:
            encode = flat[inner] = _flat_encoder("," + inner)
        text = encode(value)
        pieces.append(text[0] + inner + text[1:-1] + newline + text[-1])
        return
    table = records_text(value, newline) if kind is dict else None
    if table is not None:
        pieces.append(table)
        return
    # Items that are themselves non-empty dicts of scalars are written here, each in one C
    # call, without a recursive call per item.
    deeper = inner + " "
    encode = flat.get(deeper)
    if encode is None:
        encode = flat[deeper] = _flat_encoder("," + deeper)
    if kind is dict:
        separator = "{" + inner
        for key, item in value.items():
            if type(key) is not str:
                raise _Unusual
            if type(item) is dict and item and _SCALARS.issuperset(map(type, item.values())):
                text = encode(item)
                pieces.append(f"{separator}{encode_basestring_ascii(key)}: {{{deeper}{text[1:-1]}{inner}}}")
            else:
                pieces.append(separator + encode_basestring_ascii(key) + ": ")
                _encode(item, pieces, inner, flat)
            separator = "," + inner
        pieces.append(newline + "}")
    else:
        separator = "[" + inner
        for item in value:
            if type(item) is dict and item and _SCALARS.issuperset(map(type, item.values())):
                pieces.append(f"{separator}{{{deeper}{encode(item)[1:-1]}{inner}}}")
            else:
                pieces.append(separator)
                _encode(item, pieces, inner, flat)
            separator = "," + inner
        pieces.append(newline + "]")


#: How a column of exactly one of these types is written: as ``json.dumps`` writes each value.
_COLUMN_TEXT: dict[type, Callable[[Any], str]] = {str: encode_basestring_ascii, int: int.__repr__}


def records_text(value: dict[Any, Any], newline: str = "\n") -> str | None:
    """``value`` as ``_encode`` writes it at indentation ``newline``, when it maps strings to records:
    non-empty dicts with the same keys in the same order, each key's values all strings or all
    integers (a plan's ``buffers``: ``{tensor: {device, offset, bytes}}``, 140k of them at 100k ops).
    None for anything else.

    Such a mapping is a table: each column is encoded in one pass (``map`` over a C function),
    and one format string, the record's layout, puts every row together, with no Python step
    and no encoder call per record (the 100k-op plan's buffers: 0.32 s with a C call per record, 0.23 s so).

    >>> print(records_text({"x": {"device": "gpu0", "bytes": 64}}))
    {
     "x": {
      "device": "gpu0",
      "bytes": 64
     }
    }
    >>> records_text({"x": {"bytes": 64}, "y": {"bytes": "64"}}) is None  # a column of two types
    True
    """
    records = list(value.values())
    if not (_DICT_ONLY.issuperset(map(type, records)) and records and len(set(map(tuple, records))) == 1):
        return None
    fields = tuple(records[0])
    return _table_text(list(value), fields, [list(map(itemgetter(field), records)) for field in fields], newline)


@dataclass(frozen=True, slots=True)
class Table:
    """A mapping of records given by columns: ``keys[i]`` maps to ``{fields[f]: columns[f][i]}``.

    ``dumps_indented`` writes it exactly as it writes that mapping (``as_dict``), but takes the
    columns as they are: a caller holding its records as objects (a plan's buffers) builds no
    dict per record, and the writer checks no record's keys (100k-op plan.json: 0.15 s less).
    Keys and fields are distinct, and there is one column per field and one cell per key in each
    column (``ValueError`` otherwise): a mapping would keep one of two equal keys where the column
    path writes both, and ``zip`` would cut a ragged table short, so the two ways would write
    different documents, or drop records.
    The few fields, and the length of each column, are checked whenever a table is made.  Keys
    given as a sequence, which can repeat one, are checked too; keys given as a set (a
    mapping's ``keys()``, as ``Table.of`` gives them) cannot repeat, and are not: a set of 100k
    keys on every ``save_plan`` cost 12-16 ms.
    """

    keys: Sequence[Any] | AbstractSet[Any]
    fields: tuple[Any, ...]
    columns: tuple[Sequence[Any], ...]

    def __post_init__(self) -> None:
        if len(self.columns) != len(self.fields):
            raise ValueError(f"Table: expected a column per field ({len(self.fields)}), got {len(self.columns)}")
        rows = len(self.keys)
        for field, column in zip(self.fields, self.columns):
            if len(column) != rows:
                raise ValueError(f"Table: column {field!r}: expected a cell per key ({rows}), got {len(column)}")
        names: list[tuple[str, Sequence[Any]]] = [("field", self.fields)]
        if not isinstance(self.keys, AbstractSet):
            names.append(("key", self.keys))
        for what, each in names:
            if len(set(each)) != len(each):
                twice = next(name for name, count in Counter(each).items() if count > 1)
                raise ValueError(f"Table: expected distinct {what}s, got {twice!r} more than once")

    @classmethod
    def of(cls, records: Mapping[Any, Any], fields: tuple[Any, ...],
           getter: Callable[[Any], Callable[[Any], Any]]) -> Table:
        """The table of ``records`` (key -> record), ``getter(field)`` reading a field of a record
        (``operator.attrgetter`` for objects, ``itemgetter`` for dicts); ``ValueError`` when a field repeats.
        Its keys are ``records.keys()``: a view of the mapping, so ``records`` must not change while it is used."""
        values = records.values()
        return cls(records.keys(), fields, tuple(list(map(getter(field), values)) for field in fields))

    def as_dict(self) -> dict[Any, dict[Any, Any]]:
        """The mapping this table stands for."""
        rows = zip(*self.columns) if self.columns else [()] * len(self.keys)
        return {key: dict(zip(self.fields, row)) for key, row in zip(self.keys, rows)}


def _table_text(keys: Collection[Any], fields: tuple[Any, ...], columns: Sequence[Sequence[Any]],
                newline: str) -> str | None:
    """``records_text`` of the table ``keys``, ``fields``, ``columns`` (see ``Table``); None unless its
    keys and fields are strings, it has a record and a field, and each column is of one type of ``_COLUMN_TEXT``."""
    if not (keys and fields and _STR_ONLY.issuperset(map(type, keys)) and _STR_ONLY.issuperset(map(type, fields))):
        return None
    texts = []
    for column in columns:
        types = set(map(type, column))
        if len(types) != 1 or next(iter(types)) not in _COLUMN_TEXT:  # columns are as long as keys: ``Table``
            return None
        texts.append(map(_COLUMN_TEXT[next(iter(types))], column))
    inner = newline + " "
    deeper = inner + " "
    # the record's layout, with the literal text's braces doubled for ``str.format``
    layout = ("," + deeper).join(_literal(encode_basestring_ascii(f)) + ": {}" for f in fields)
    row = "{}: {{" + _literal(deeper) + layout + _literal(inner) + "}}"
    rows = map(row.format, map(encode_basestring_ascii, keys), *texts)
    return "{" + inner + ("," + inner).join(rows) + newline + "}"


def _literal(text: str) -> str:
    """``text`` as literal text in a ``str.format`` string."""
    return text.replace("{", "{{").replace("}", "}}")

"""json_text.dumps_indented: byte for byte what ``json.dumps(data, indent=1)`` writes, errors included."""

from __future__ import annotations

import enum
import json
import math
import re
from operator import itemgetter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.json_text import Table, dumps_indented, records_text

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
KEYS = st.text(max_size=6) | st.integers(-5, 5) | st.floats(allow_nan=False) | st.booleans() | st.none()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.tuples(inner, inner) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(VALUES)
def test_same_text_as_json_dumps(value: object) -> None:
    assert dumps_indented(value) == json.dumps(value, indent=1)


# Text that the records' format strings must keep literal: braces, quotes, escapes, newlines, non-ASCII.
TRICKY = st.text(st.sampled_from(['"', "{", "}", ":", " ", ",", "\n", "\\", "a", "é", "\x00"]), max_size=6)
COLUMNS = st.lists(st.tuples(TRICKY, st.sampled_from(["str", "int"])), min_size=1, max_size=4,
                   unique_by=lambda column: column[0])


@st.composite
def tables(draw: st.DrawFn) -> dict[str, dict[str, object]]:
    """A mapping of records with the same fields, each field's values all strings or all integers."""
    columns = draw(COLUMNS)
    keys = draw(st.lists(TRICKY, min_size=1, max_size=5, unique=True))
    value = {"str": TRICKY, "int": st.integers()}
    return {key: {field: draw(value[kind]) for field, kind in columns} for key in keys}


@settings(max_examples=300, deadline=None)
@given(tables(), st.integers(0, 2))
def test_tables_of_records_are_written_by_column(table: dict[str, dict[str, object]], depth: int) -> None:
    """A plan's buffers take the table path (``records_text``), and come out as json.dumps writes them."""
    assert records_text(table) == json.dumps(table, indent=1)
    value: object = table
    for _ in range(depth):
        value = {"buffers": value, "other": [1]}
    assert dumps_indented(value) == json.dumps(value, indent=1)


@pytest.mark.parametrize("value", [
    {"a": {"x": 1}, "b": {"y": 1}},  # other fields
    {"a": {"x": 1, "y": 2}, "b": {"y": 2, "x": 1}},  # the same fields in another order
    {"a": {"x": 1}, "b": {"x": "1"}},  # a column of two types
    {"a": {"x": True}},  # bool, float and None are left to the encoders
    {"a": {"x": 1.5}},
    {"a": {"x": None}},
    {"a": {}},
    {"a": {"x": [1]}},
    {1: {"x": 1}},
    {},
])
def test_other_mappings_are_not_tables(value: dict[object, object]) -> None:
    assert records_text(value) is None
    assert dumps_indented({"v": value}) == json.dumps({"v": value}, indent=1)


class Colour(enum.IntEnum):
    RED = 1


@pytest.mark.parametrize("value", [
    {"a": [1, 2.5, None, True, "é\n"], "b": {}, "c": [], "d": [[], {}, [[1]]]},
    [math.nan, math.inf, -math.inf, -0.0, 10**30],
    {"colour": Colour.RED, "nested": {"x": [Colour.RED]}},  # a subclass: the standard encoder's own rendering
    {1: "int key", None: [1], 2.5: {"k": False}},
])
def test_edge_cases(value: object) -> None:
    assert dumps_indented(value) == json.dumps(value, indent=1)


def test_errors_are_the_standard_ones() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_indented({"a": [1, {2, 3}]})
    loop: list[object] = []
    loop.append([loop])
    with pytest.raises(ValueError, match="Circular reference"):
        dumps_indented({"a": loop})


def _table_of(records: dict[str, dict[str, object]]) -> Table:
    """The ``Table`` of a mapping of records with the same fields (its columns as lists)."""
    return Table.of(records, tuple(next(iter(records.values()), {})), itemgetter)


@settings(max_examples=300, deadline=None)
@given(tables(), st.integers(0, 2))
def test_a_table_is_written_as_its_mapping(table: dict[str, dict[str, object]], depth: int) -> None:
    """A ``Table`` (a plan's buffers by column) comes out as json.dumps writes the mapping it stands for."""
    assert _table_of(table).as_dict() == table
    value: object = _table_of(table)
    plain: object = table
    for _ in range(depth):
        value, plain = {"buffers": value, "other": [1]}, {"buffers": plain, "other": [1]}
    assert dumps_indented(value) == json.dumps(plain, indent=1)


@pytest.mark.parametrize("records", [
    {"a": {"x": 1}, "b": {"x": "1"}},  # a column of two types
    {"a": {"x": True}},  # bool, float and None are left to the encoders
    {"a": {"x": 1.5}},
    {"a": {"x": [1]}},
    {"a": {}},  # no field
    {},  # no record
    {1: {"x": 1}},  # a key that is no string
])
def test_tables_off_the_column_path_are_written_as_their_mapping(records: dict[object, dict[str, object]]) -> None:
    table = _table_of(records)  # type: ignore[arg-type]  # keys of other types too
    assert dumps_indented({"v": table}) == json.dumps({"v": records}, indent=1)
    # beside a value only the standard encoder writes (an IntEnum), or one it refuses (a set)
    assert dumps_indented({"v": table, "c": Colour.RED}) == json.dumps({"v": records, "c": Colour.RED}, indent=1)
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps_indented({"v": table, "s": {1}})


@pytest.mark.parametrize(("keys", "fields", "columns", "message"), [
    (["a", "b", "a"], ("x",), ([1, 2, 3],), "distinct keys, got 'a'"),  # as_dict would keep one "a", the columns both
    (["a"], ("x", "x"), ([1], [2]), "distinct fields, got 'x'"),
    ({"a": 1}.keys(), ("x", "x"), ([1], [2]), "distinct fields, got 'x'"),  # keys that cannot repeat: fields checked
])
def test_a_table_refuses_repeated_keys_and_fields(keys: list[str], fields: tuple[str, ...],
                                                  columns: tuple[list[int], ...], message: str) -> None:
    """A mapping cannot hold a key twice, where the column path would write it twice: a ``Table``
    that stands for no mapping is refused when made, before either path could write it."""
    with pytest.raises(ValueError, match=f"expected {message} more than once"):
        Table(keys, fields, columns)


@pytest.mark.parametrize(("keys", "fields", "columns", "message"), [
    (["a", "b"], ("x", "y"), ([1, 2],), "expected a column per field (2), got 1"),  # each row one cell short
    (["a", "b"], ("x",), ([1, 2], [3, 4]), "expected a column per field (1), got 2"),  # each row one cell too many
    (["a", "b"], ("x",), ([1],), "column 'x': expected a cell per key (2), got 1"),  # as_dict would drop "b"
    (["a", "b"], ("x",), ([1, 2, 3],), "column 'x': expected a cell per key (2), got 3"),
    ({"a": 1, "b": 2}.keys(), ("x", "y"), ([1, 2], [3]), "column 'y': expected a cell per key (2), got 1"),
    ([], ("x",), (), "expected a column per field (1), got 0"),
])
def test_a_ragged_table_is_refused_when_made(keys: list[str], fields: tuple[str, ...],
                                             columns: tuple[list[int], ...], message: str) -> None:
    """A row with too many or too few cells stands for no mapping: ``as_dict`` would cut it short (``zip``)
    and the column path fail or drop it, so a ``Table`` refuses it when made, naming the column."""
    with pytest.raises(ValueError, match=re.escape(f"Table: {message}")):
        Table(keys, fields, columns)


def test_a_table_of_a_mapping_checks_its_fields_not_its_keys() -> None:
    """``Table.of`` hands over the mapping's keys, which cannot repeat, as they are (no copy, no check
    of every key: ``save_plan``'s 140k buffers), and its fields are checked as any table's are."""
    records = {"a": {"x": 1}, "b": {"x": 2}}
    table = Table.of(records, ("x",), itemgetter)
    assert isinstance(table.keys, type({}.keys())) and table.as_dict() == records
    with pytest.raises(ValueError, match="expected distinct fields, got 'x' more than once"):
        Table.of(records, ("x", "x"), itemgetter)

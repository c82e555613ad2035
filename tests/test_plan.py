"""plan.json's writer: any JSON value reads back equal, in the same layout every time."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.plan import json_lines, write_json_atomic

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                           max_size=4), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_JSON)
def test_json_lines_reads_back_equal(value) -> None:
    text = json_lines(value)
    assert json.loads(text) == value and text.endswith("\n")
    assert json_lines(json.loads(text)) == text  # deterministic: the same value, the same bytes


def test_a_plans_entries_are_one_per_line(tmp_path) -> None:
    data = {"schedule": [f"op{i}" for i in range(5)], "buffers": {f"t{i}": {"offset": i} for i in range(3)}}
    path = write_json_atomic(data, tmp_path / "plan.json")
    lines = path.read_text().splitlines()
    assert len(lines) == 2 + (5 + 2) + (3 + 2) and '  "t1": {"offset": 1},' in lines
    assert json.loads(path.read_text()) == data and not list(tmp_path.glob(".plan.json.*"))

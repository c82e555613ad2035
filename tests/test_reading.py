"""mpplan.reading against PyYAML and json: the same values for every sane document, refusals exactly at the limits."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.reading import MAX_ALIAS_NODES, MAX_DEPTH, DocumentError, load_json, load_yaml, read_text

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(documents)
def test_sane_documents_read_as_pyyaml_and_json_read_them(doc):
    text = yaml.safe_dump(doc)
    assert load_yaml(text) == yaml.safe_load(text)
    assert load_json(json.dumps(doc)) == json.loads(json.dumps(doc))


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), scalars, min_size=1, max_size=5), st.data())
def test_a_key_given_twice_is_refused_in_yaml_and_json(mapping, data):
    key = data.draw(st.sampled_from(sorted(mapping)))
    again = {"again": mapping[key]}
    yaml_text = yaml.safe_dump(mapping) + yaml.safe_dump({key: again})
    with pytest.raises(DocumentError, match="given twice"):
        load_yaml(yaml_text)
    json_text = json.dumps(mapping)[:-1] + ", " + json.dumps(key) + ": 1}"
    with pytest.raises(DocumentError, match="given twice"):
        load_json(json_text)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3 * MAX_DEPTH), st.booleans())
def test_nesting_is_refused_exactly_past_the_limit(depth, mapping):
    yaml_text = ("{a: " * depth + "1" + "}" * depth) if mapping else ("[" * depth + "]" * depth)
    json_text = ('{"a": ' * depth + "1" + "}" * depth) if mapping else ("[" * depth + "]" * depth)
    for load, text in ((load_yaml, yaml_text), (load_json, json_text)):
        if depth <= MAX_DEPTH:
            load(text)
        else:
            with pytest.raises(DocumentError, match="nested deeper"):
                load(text)


def _depth(value) -> int:
    """The oracle: how many containers deep ``value`` nests (the root container is level 1)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


tricky_text = st.text(alphabet='[]{}"\\ax\u00e9\n', max_size=6)  # brackets, quotes and escapes inside strings
tricky = st.recursive(
    st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(tricky, st.integers(0, MAX_DEPTH), st.booleans())
def test_json_depth_is_counted_on_containers_never_on_brackets_inside_strings(doc, extra, ensure_ascii):
    wrapped = doc
    for _ in range(extra):
        wrapped = [wrapped, "]]}"]
    text = json.dumps(wrapped, ensure_ascii=ensure_ascii)
    if _depth(wrapped) <= MAX_DEPTH:
        assert load_json(text) == wrapped
    else:
        with pytest.raises(DocumentError, match="nested deeper"):
            load_json(text)


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_json_far_too_deep_gives_the_one_line_error_not_a_recursion_error(depth):
    for text in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
        with pytest.raises(DocumentError, match=f"nested deeper than {MAX_DEPTH} levels"):
            load_json(text)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(1, 9))
def test_aliases_are_counted_never_expanded_and_refused_exactly_past_the_limit(width, levels):
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    text = "\n".join(lines) + "\n"
    distinct = 1 + (levels + 1) * (width + 1)  # the root, and per level its list and its items (or aliases)
    expanded = 1 + sum((width ** (i + 2) - 1) // (width - 1) for i in range(levels + 1))
    if expanded - distinct > MAX_ALIAS_NODES:
        with pytest.raises(DocumentError, match="alias"):
            load_yaml(text)
    else:
        assert load_yaml(text) == yaml.safe_load(text)


def test_recursive_aliases_and_huge_integers_are_refused():
    with pytest.raises(DocumentError, match="contains it"):
        load_yaml("a: &x [1, *x]")
    with pytest.raises(DocumentError, match="4300 digits"):
        load_yaml("a: " + "7" * 5000)
    with pytest.raises(DocumentError, match="4300 digits"):
        load_json("[" + "7" * 5000 + "]")


def test_read_text_refuses_what_is_not_a_utf8_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_text(tmp_path / "missing.yaml")
    with pytest.raises(DocumentError, match="Is a directory"):
        read_text(tmp_path)
    (tmp_path / "l.yaml").write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(DocumentError, match=r"not UTF-8 text \(byte 0xe9 at offset 3\)"):
        read_text(tmp_path / "l.yaml")
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert load_yaml(read_text(tmp_path / "bom.yaml")) == {"a": 1}


def test_read_document_names_the_path_in_the_callers_error(tmp_path):
    from mpplan.errors import ConfigError, PlanError
    from mpplan.reading import load_json, load_yaml, read_document

    good = tmp_path / "a.json"
    good.write_text('{"a": 1}')
    assert read_document(good, load_json, PlanError) == {"a": 1}
    assert read_document(good, str, PlanError) == '{"a": 1}'
    with pytest.raises(PlanError, match=r"^.*missing\.json: file not found$"):
        read_document(tmp_path / "missing.json", load_json, PlanError)
    bad = tmp_path / "b.yaml"
    bad.write_text("a: 1\na: 2\n")
    with pytest.raises(ConfigError) as caught:
        read_document(bad, load_yaml, ConfigError)
    assert str(caught.value) == f"{bad}: line 2, column 1: key 'a' is given twice in one mapping"
    with pytest.raises(ConfigError, match="cannot read: Is a directory"):
        read_document(tmp_path, load_yaml, ConfigError)


def _pairs_text(value) -> str:
    """JSON text of ``value``, where a mapping is written from a list of (key, value) pairs, repeats kept."""
    if isinstance(value, tuple):
        return "{" + ", ".join(f"{json.dumps(k)}: {_pairs_text(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(_pairs_text, value)) + "]"
    return json.dumps(value)


pair_keys = st.text(alphabet='ab:"\\{', max_size=3)  # colons, quotes and escapes inside keys too
pair_docs = st.recursive(
    st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.lists(st.tuples(pair_keys, inner), max_size=3).map(tuple),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(pair_docs)
def test_json_without_the_hook_reads_and_refuses_what_the_checking_parse_does(doc):
    """``load_json`` parses without the duplicate-key hook when the key count shows no repeat: same
    value, and a key given twice at any depth (even one holding colons or escapes) is still refused."""
    from mpplan.reading import _checked_json

    text = _pairs_text(doc)
    try:
        expected = _checked_json(text)
    except DocumentError as exc:
        with pytest.raises(DocumentError, match="given twice"):
            load_json(text)
        assert "given twice" in str(exc)
        return
    if _depth(expected) <= MAX_DEPTH:
        assert load_json(text) == expected

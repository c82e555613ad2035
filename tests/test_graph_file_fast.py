"""The graph-file reader's inline plain case agrees with its field-by-field checkers on any field values."""

from __future__ import annotations

from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.capture import graph_fields
from mpplan.errors import GraphFileError

#: Values of the kinds a parsed YAML/JSON document holds, plain and odd (bools, negatives, floats, huge ints).
_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(-3, 2**63),
    st.floats(-2, 2),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([-0.5, -0.0, 2**62, 2**62 + 1, 1e308, 10**400]),
    st.sampled_from(["", "x", "float32", "torch.float16", "int7", "param", "grad", "activation", "64MiB"]),
    st.lists(st.one_of(st.integers(-2, 9), st.booleans(), st.sampled_from(["a", "b"]), st.floats(0, 2)), max_size=3),
    st.dictionaries(st.sampled_from(["a"]), st.integers(), max_size=1),
)
_TENSOR_SPEC = st.dictionaries(st.sampled_from([*graph_fields.TENSOR_KEYS, "size"]), _VALUE, max_size=5)
_OP_SPEC = st.dictionaries(st.sampled_from([*graph_fields.OP_KEYS, "device_id"]), _VALUE, max_size=8)
#: Specs that take the plain case: the usual fields with their usual types.
_PLAIN_TENSOR = st.fixed_dictionaries(
    {"shape": st.lists(st.integers(0, 64), max_size=3), "dtype": st.sampled_from(["float32", "torch.int64"])},
    optional={"kind": st.sampled_from(["param", "grad"]), "grad_of": st.just("w"), "alias_of": st.just("h"),
              "bytes": st.integers(0, 2**20)},
)
_PLAIN_OP = st.fixed_dictionaries(
    {"name": st.just("f"), "type": st.just("mm")},
    optional={"inputs": st.lists(st.sampled_from(["a", "b"])), "outputs": st.lists(st.sampled_from(["c"])),
              "cost": st.one_of(st.floats(0, 1e9), st.integers(0, 10**30)), "module": st.just("m.0"),
              "backward_of": st.none(), "device": st.just("gpu0")},
)


def _outcome(build: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", build()
    except GraphFileError as exc:
        return "error", str(exc)


@settings(max_examples=400, deadline=None)
@given(spec=st.one_of(_TENSOR_SPEC, _PLAIN_TENSOR, _VALUE))
def test_tensor_plain_case_matches_checkers(spec: object) -> None:
    fast = _outcome(lambda: graph_fields.tensor_from_row("t", spec))
    assert fast == _outcome(lambda: graph_fields._checked_tensor("t", spec, "tensors.t"))


@settings(max_examples=400, deadline=None)
@given(spec=st.one_of(_OP_SPEC, _PLAIN_OP, _VALUE))
def test_op_plain_case_matches_checkers(spec: object) -> None:
    fast = _outcome(lambda: graph_fields.op_from_row(spec, 3))
    assert fast == _outcome(lambda: graph_fields._checked_op(spec, "ops[3]"))


#: Values at the edges of the plain case, each set in turn as every field of a plain spec.
_EDGES = [None, True, False, 0, 1, -1, 2**62, 2**62 + 1, 10**400, 0.0, -0.0, 2.5, -0.5, float("inf"), float("nan"),
          "", "x", "float32", "torch.float32", "torch.torch.float32", "param", "grad", [], [0], [-1], [True], [1.0],
          ["a"], [1], {"a": 1}]


def test_one_field_off_the_plain_case() -> None:
    """Every field of a plain tensor and a plain op (and an unknown key) set to every edge value."""
    plain_tensors = [{"shape": [2, 3], "dtype": "float32"}, {"bytes": 64, "kind": "param"}, {"alias_of": "h"}]
    for base in plain_tensors:
        for key in (*graph_fields.TENSOR_KEYS, "size"):
            for value in _EDGES:
                spec = {**base, key: value}
                assert _outcome(lambda: graph_fields.tensor_from_row("t", spec)) == _outcome(
                    lambda: graph_fields._checked_tensor("t", spec, "tensors.t")), spec
    plain_ops = [{"name": "f", "type": "mm"}, {"name": "f", "type": "mm", "inputs": ["a"], "outputs": ["b"], "cost": 2}]
    for base in plain_ops:
        for key in (*graph_fields.OP_KEYS, "device_id"):
            for value in _EDGES:
                spec = {**base, key: value}
                assert _outcome(lambda: graph_fields.op_from_row(spec, 3)) == _outcome(
                    lambda: graph_fields._checked_op(spec, "ops[3]")), spec

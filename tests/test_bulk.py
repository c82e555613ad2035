"""``Tensor`` and ``Op`` made in bulk (``mpplan.capture.bulk``) are the dataclasses' own, field for field."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpplan.capture.bulk import new_op, new_tensor
from mpplan.graph import Kind, Op, Tensor

_NAME = st.text(max_size=4)
_OPTIONAL = st.none() | _NAME
_NAMES = st.lists(_NAME, max_size=3).map(tuple)


def _same(made: object, built: object) -> None:
    assert type(made) is type(built)
    assert made == built and hash(made) == hash(built) and repr(made) == repr(built)
    assert dataclasses.astuple(made) == dataclasses.astuple(built)  # type: ignore[call-overload]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.name = "other"  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(st.tuples(_NAME, st.integers(0, 2**62), st.sampled_from(list(Kind)),
                 st.none() | st.lists(st.integers(0, 9)).map(tuple), _OPTIONAL, _OPTIONAL, _OPTIONAL))
def test_new_tensor_is_the_dataclass(fields: tuple[object, ...]) -> None:
    _same(new_tensor(*fields), Tensor(*fields))  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.tuples(_NAME, _NAME, _NAMES, _NAMES, st.floats(0, 1e9), _OPTIONAL, _OPTIONAL, _OPTIONAL, _OPTIONAL,
                 _OPTIONAL))
def test_new_op_is_the_dataclass(fields: tuple[object, ...]) -> None:
    _same(new_op(*fields), Op(*fields))  # type: ignore[arg-type]


def test_a_layout_that_differs_is_refused() -> None:
    """The guard the module relies on: CPython refuses ``__class__`` assignment across slot layouts."""

    class Fewer:
        __slots__ = Tensor.__slots__[:-1]

    with pytest.raises(TypeError):
        Fewer().__class__ = Tensor  # type: ignore[assignment]

"""Many records of one frozen, slotted dataclass at once, from one column per field.

A 100k-op plan makes 140k ``LiveRange`` and 140k ``Buffer`` records.  Their dataclass
``__init__`` sets each field through ``object.__setattr__`` (the price of ``frozen``) and
runs ``__post_init__``, one Python call per record: about a third of what making them
costs (the buffers: 0.32 -> 0.21 CPU s).  ``from_columns`` makes the bare instances and fills each
field's slot over a whole column by ``map``, in C, and runs no ``__post_init__``:
for a caller whose values are valid by construction (a pass's own results) or checked
first (a graph file's columns, ``capture.graph_columns``), never for unchecked input.  The records are equal to, and
behave as, those the constructor makes.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, slots=True)
... class Span:
...     first: int
...     last: int
>>> from_columns(Span, [0, 2], [1, 5])
[Span(first=0, last=1), Span(first=2, last=5)]
"""

from __future__ import annotations

import dataclasses
from collections import deque
from itertools import repeat
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


def from_columns(cls: type[T], *columns: Sequence[Any]) -> list[T]:
    """Records of ``cls`` whose i-th field takes ``columns[i]``'s values, in the columns' order.

    ``cls`` must be a frozen dataclass with ``slots=True``, and every column as long
    as the first, one per field (checked: a missing column would leave a slot unset).
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if len(columns) != len(fields) or "__slots__" not in vars(cls):
        raise TypeError(f"from_columns: expected a slotted dataclass and one column per field of {cls.__name__}")
    count = len(columns[0]) if columns else 0
    if any(len(column) != count for column in columns):
        raise ValueError(f"from_columns: the columns of {cls.__name__} differ in length")
    records: list[T] = list(map(object.__new__, repeat(cls, count)))
    for field, column in zip(fields, columns):
        deque(map(getattr(cls, field.name).__set__, records, column), maxlen=0)  # the slot's setter, in C
    return records

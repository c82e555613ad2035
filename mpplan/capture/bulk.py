"""``Tensor`` and ``Op`` made in bulk, as a graph file's loader makes a hundred thousand of them.

A frozen dataclass's ``__init__`` sets each field by ``object.__setattr__``, a generic
call that costs five times a plain attribute store.  Here a plain class with the same
slots takes the fields by plain stores, and its instance then becomes a ``Tensor``
(``Op``) by ``__class__`` assignment, which CPython allows between classes of one slot
layout (and refuses, with ``TypeError``, between any others, so a field added to the
IR and not here fails at the first call, not silently).  The result equals the
dataclass's own construction (tests/test_graph_file_fast.py holds the two to that).
Every field is given: neither class has defaults to fill or a ``__post_init__`` to run.
"""

from __future__ import annotations

from typing import cast

from mpplan.graph import Kind, Op, Tensor


class _TensorFields:
    __slots__ = Tensor.__slots__

    def __init__(self, name: str, nbytes: int, kind: Kind, shape: tuple[int, ...] | None, dtype: str | None,
                 alias_of: str | None, grad_of: str | None) -> None:
        self.name, self.nbytes, self.kind, self.shape = name, nbytes, kind, shape
        self.dtype, self.alias_of, self.grad_of = dtype, alias_of, grad_of


class _OpFields:
    __slots__ = Op.__slots__

    def __init__(self, name: str, type_: str, inputs: tuple[str, ...], outputs: tuple[str, ...], cost: float,
                 device: str | None, backward_of: str | None, module: str | None, stage: str | None,
                 recompute_of: str | None) -> None:
        self.name, self.type, self.inputs, self.outputs, self.cost = name, type_, inputs, outputs, cost
        self.device, self.backward_of, self.module, self.stage, self.recompute_of = (
            device, backward_of, module, stage, recompute_of)


def new_tensor(name: str, nbytes: int, kind: Kind, shape: tuple[int, ...] | None, dtype: str | None,
               alias_of: str | None, grad_of: str | None) -> Tensor:
    """``Tensor(name, nbytes, kind, shape, dtype, alias_of, grad_of)``, at a fraction of the cost."""
    made = _TensorFields(name, nbytes, kind, shape, dtype, alias_of, grad_of)
    made.__class__ = Tensor  # type: ignore[assignment]
    return cast(Tensor, made)


def new_op(name: str, type_: str, inputs: tuple[str, ...], outputs: tuple[str, ...], cost: float,
           device: str | None, backward_of: str | None, module: str | None, stage: str | None,
           recompute_of: str | None) -> Op:
    """``Op(name, type_, inputs, outputs, cost, device, backward_of, module, stage, recompute_of)``, cheaper."""
    made = _OpFields(name, type_, inputs, outputs, cost, device, backward_of, module, stage, recompute_of)
    made.__class__ = Op  # type: ignore[assignment]
    return cast(Op, made)

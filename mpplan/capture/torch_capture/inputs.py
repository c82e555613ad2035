"""The example inputs of a capture: their tensor leaves, named, and the structure rebuilt around new ones.

A tensor nested anywhere in the example inputs (lists, tuples, dicts) is one graph input, named by
its path: ``input0`` for the first positional argument, ``input_ids`` for a keyword, ``input0.1``
for the second element of a tuple argument.  Other leaves are constants passed as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from mpplan.errors import CaptureError

_CONSTANT_LEAVES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def input_leaves(example_inputs: Any) -> list[tuple[str, torch.Tensor]]:
    """Tensor leaves of the example inputs with their names, in flattening order."""
    leaves, _ = pytree.tree_flatten_with_path(example_inputs)
    named: list[tuple[str, torch.Tensor]] = []
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            named.append((_input_name(path), leaf))
        elif not isinstance(leaf, _CONSTANT_LEAVES):
            raise CaptureError(
                f"capture: example input {_input_name(path)!r} has unsupported type {type(leaf).__name__}; "
                "expected tensors, or ints, floats, bools, strings or None"
            )
    return named


def _input_name(path: Sequence[Any]) -> str:
    parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    if path and hasattr(path[0], "idx"):
        parts[0] = f"input{parts[0]}"
    return ".".join(parts) or "input"


def rebuild_inputs(example_inputs: Any, tensors: list[torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example_inputs`` with its tensor leaves replaced, as (args, kwargs)."""
    leaves, spec = pytree.tree_flatten(example_inputs)
    it = iter(tensors)
    rebuilt = pytree.tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    if isinstance(rebuilt, dict):
        return (), dict(rebuilt)
    return tuple(rebuilt), {}

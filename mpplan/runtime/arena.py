"""Planned memory: one ``uint8`` arena per device, typed views at planned offsets, out= variants.

In arena mode every dynamic storage of the plan is backed by a view of its device's
arena at ``plan.buffers[name].offset``, reinterpreted with the tensor's dtype, shape
and strides (those the traced fake value had, so later view ops see the layout the
graph was captured with).  An op writes its fresh outputs straight into those views
through its ``out=`` overload when ATen has a real one (``out_variant``), or through
an exact rewrite onto ops that have one (``exact_rewrite``: ``relu`` is
``clamp_min(x, 0)``, ``embedding`` an ``index_select``, ``ones_like`` a ``fill_``, ``clone`` a ``copy_``,
and on CPU ``embedding_dense_backward`` an ``index_add_`` and ``_safe_softmax`` a
``_softmax`` with its fully masked rows zeroed);
otherwise the executor computes the result and copies it in, and counts the copy's
source as transient memory (scratch, which ``scratch.plan_with_scratch`` counts in
the plan's peak).  An overload codegen generated (``OutVariant.generated``) is not a
real one: it computes into a temporary the meter cannot see and copies that in,
so the executor does the same itself, in the open.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mpplan.errors import PlanError

__all__ = [
    "Layout", "OutVariant", "Rewrite", "arena_view", "exact_rewrite", "layout_of", "out_variant", "packed_stride",
    "region_bytes",
]

#: Keyword arguments of factory functions that an ``out=`` overload takes from ``out`` instead.
_TENSOR_OPTIONS = frozenset({"dtype", "layout", "device", "pin_memory"})

#: Ops whose ``.Scalar`` overload ATen implements as the ``.Tensor`` one with the scalar
#: wrapped (``div(self, wrapped_scalar_tensor(other))``).  Their ``Scalar_out`` is generated
#: (a hidden temporary); ``.out`` given the Python number, which ``torch.ops`` wraps the
#: same way, computes the same bits straight into the arena.
_SCALAR_AS_TENSOR = frozenset({"add", "sub", "mul", "div"})

#: Ops whose ``out=`` overload is not used: ``cudnn_batch_norm.out`` returns a tensor whose PyObject
#: bookkeeping is broken (torch 2.11 on an H100: "has_pyobject INTERNAL ASSERT FAILED" in
#: ``pyobject_preservation.cpp`` when the result reaches Python, then a SIGSEGV; every zoo_resnet arena run
#: crashed there).  Their results are computed and copied in instead, counted as scratch.
_BROKEN_OUT = frozenset({"cudnn_batch_norm"})


@dataclass(frozen=True, slots=True)
class Layout:
    """How a tensor looks in memory: shape, strides (elements), storage offset and dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: torch.dtype

    @property
    def span_bytes(self) -> int:
        """Bytes from the first to one past the last element the layout addresses."""
        if any(s == 0 for s in self.shape):
            return 0
        last = sum((n - 1) * st for n, st in zip(self.shape, self.stride))
        return (self.storage_offset + last + 1) * self.dtype.itemsize


def layout_of(tensor: torch.Tensor) -> Layout:
    """The layout of a real or fake tensor."""
    return Layout(tuple(int(s) for s in tensor.shape), tuple(int(s) for s in tensor.stride()),
                  int(tensor.storage_offset()), tensor.dtype)


def arena_view(arena: torch.Tensor, offset: int, layout: Layout, *, where: str) -> torch.Tensor:
    """A tensor with ``layout`` whose storage is ``arena`` starting at byte ``offset``.

    ``where`` names the tensor for errors: an offset not aligned to the dtype, or a
    layout reaching past the arena, is a plan the executor cannot honour.
    """
    itemsize = layout.dtype.itemsize
    if offset % itemsize:
        raise PlanError(f"{where}: offset {offset} is not a multiple of the {layout.dtype} element size {itemsize}")
    if offset + layout.span_bytes > arena.numel():
        raise PlanError(
            f"{where}: offset {offset} + {layout.span_bytes} bytes runs past the {arena.numel()}-byte arena"
        )
    view = torch.empty((0,), dtype=layout.dtype, device=arena.device)
    view.set_(arena.untyped_storage(), offset // itemsize + layout.storage_offset, layout.shape, layout.stride)
    return view


def packed_stride(tensor: torch.Tensor) -> tuple[int, ...]:
    """Strides that lay ``tensor``'s elements in exactly ``numel`` slots, in the order of its own strides.

    A transpose keeps its strides; a slice with gaps between its rows closes them
    up but keeps its dimension order (``empty_like``'s ``preserve_format``), so the
    ops after a copy see the layout eager would have given them: a
    ``(B, H, T, D)`` view of a fused ``(B, T, 3C)`` projection stays ``T``-major,
    and the attention output made from it can still be ``view``-ed back.
    """
    return tuple(torch.empty_like(tensor, device="meta").stride())


def region_bytes(tensor: torch.Tensor, nbytes: int) -> torch.Tensor:
    """``nbytes`` raw bytes of ``tensor``'s storage starting at its first element, as ``uint8``."""
    start = tensor.storage_offset() * tensor.element_size()
    view = torch.empty((0,), dtype=torch.uint8, device=tensor.device)
    view.set_(tensor.untyped_storage(), start, (nbytes,), (1,))
    return view


@dataclass(frozen=True, slots=True)
class OutVariant:
    """The ``out=`` overload of a functional ATen op and the names of its out arguments, in return order."""

    overload: Any
    out_names: tuple[str, ...]
    arg_names: tuple[str, ...] = ()

    def call(self, args: Sequence[Any], kwargs: dict[str, Any], outs: Sequence[torch.Tensor]) -> Any:
        """Call the overload with the functional's ``args``/``kwargs``, writing into ``outs``.

        ``arg_names`` (the functional's argument names, in order) pass on by name the
        positional arguments the overload takes keyword-only (``add.Scalar``'s
        ``alpha`` is positional, ``add.out``'s is not).
        """
        positional = sum(1 for a in self.overload._schema.arguments if not a.kwarg_only)
        kept = dict(zip(self.arg_names[positional:], args[positional:]))
        kept.update((k, v) for k, v in kwargs.items() if k not in _TENSOR_OPTIONS or k in self._accepted)
        kept.update(zip(self.out_names, outs))
        return self.overload(*args[:positional], **kept)

    @property
    def _accepted(self) -> frozenset[str]:
        return frozenset(a.name for a in self.overload._schema.arguments)

    @property
    def generated(self) -> bool:
        """Whether codegen made the overload: it runs the functional op into a temporary, then copies into ``out``."""
        tag = getattr(torch.Tag, "generated", None)
        return tag is not None and tag in getattr(self.overload, "tags", ())


def out_variant(func: Any) -> OutVariant | None:
    """The ``out=`` overload computing the same thing as ``func``, if ATen has one.

    It must take exactly ``func``'s arguments (by name and type; factory options such
    as ``dtype`` and ``device`` may be left to ``out``) plus one keyword-only out
    tensor per return, and every return of ``func`` must be a plain ``Tensor``.
    """
    schema = getattr(func, "_schema", None)
    packet = getattr(func, "overloadpacket", None)
    if schema is None or packet is None or not schema.returns or packet.__name__ in _BROKEN_OUT:
        return None
    if any(str(r.type) != "Tensor" or r.alias_info is not None for r in schema.returns):
        return None
    scalar = _scalar_as_tensor(func, schema, packet)
    if scalar is not None:
        return scalar
    wanted = [_signature(a) for a in schema.arguments]
    wanted_core = [_signature(a) for a in schema.arguments if not (a.kwarg_only and a.name in _TENSOR_OPTIONS)]
    for name in packet.overloads():
        candidate = getattr(packet, name)
        arguments = candidate._schema.arguments
        outs = [a for a in arguments if _is_out(a)]
        if len(outs) != len(schema.returns) or candidate is func:
            continue
        rest = [_signature(a) for a in arguments if not _is_out(a)]
        if rest == wanted or rest == wanted_core:
            return OutVariant(candidate, tuple(a.name for a in outs), tuple(a.name for a in schema.arguments))
    return None


def _scalar_as_tensor(func: Any, schema: Any, packet: Any) -> OutVariant | None:
    """``X.out`` for ``X.Scalar`` of the ops in ``_SCALAR_AS_TENSOR``, when the two schemas line up."""
    if packet.__name__ not in _SCALAR_AS_TENSOR or func._overloadname != "Scalar" or "out" not in packet.overloads():
        return None
    candidate = packet.out
    outs = [a for a in candidate._schema.arguments if _is_out(a)]
    rest = [(a.name, str(a.type)) for a in candidate._schema.arguments if not _is_out(a)]
    # A Scalar's schema type prints as "number" (older torch: "Scalar").
    scalar_types = ("number", "Scalar")
    wanted = [(a.name, "Tensor" if a.name == "other" and str(a.type) in scalar_types else str(a.type))
              for a in schema.arguments]
    if len(outs) != 1 or rest != wanted:
        return None
    return OutVariant(candidate, (outs[0].name,), tuple(a.name for a in schema.arguments))


def _is_out(argument: Any) -> bool:
    return bool(argument.kwarg_only and argument.alias_info is not None and argument.alias_info.is_write)


def _signature(argument: Any) -> tuple[str, str, bool]:
    write = argument.alias_info is not None and argument.alias_info.is_write
    return argument.name, str(argument.type), write


#: Writes an op's single result into ``out`` given the op's args and kwargs; returns ``out``, or ``None``
#: when these arguments are outside what the rewrite reproduces bit for bit (the caller then computes
#: and copies in).
Rewrite = Callable[[Sequence[Any], dict[str, Any], torch.Tensor], "torch.Tensor | None"]


def exact_rewrite(func: Any, device_type: str = "cpu") -> Rewrite | None:
    """A way to compute ``func``'s one result straight into a planned tensor, bit for bit as ``func`` does.

    For ops whose ``out=`` overload is generated (a hidden temporary) but whose ATen
    implementation on ``device_type`` is itself another op that has a real one, or
    adds the same numbers in the same order: results are identical (the runtime
    tests compare them bit for bit).
    """
    if func in _CPU_ONLY and device_type != "cpu":
        return None
    return _REWRITES.get(func)


def _relu(args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor | None:
    # ATen's relu is at::clamp_min(self, 0) on CPU and CUDA alike; bool tensors are refused by both.
    (x,) = args
    if x.dtype == torch.bool or kwargs:
        return None
    return torch.ops.aten.clamp_min.out(x, 0, out=out)


def _ones_like(args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor | None:
    # ones_like is empty_like(...).fill_(1): the planned tensor already has the layout empty_like chose.
    (x,) = args
    if tuple(x.shape) != tuple(out.shape) or kwargs.get("dtype", out.dtype) != out.dtype:
        return None
    return out.fill_(1)


def _embedding(args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor | None:
    # ATen's embedding (dense, 2-d weight) is weight.index_select(0, indices.reshape(-1)).view(...).
    weight, indices = args[0], args[1]
    # A non-contiguous indices would be reshaped into a hidden copy: decline (then it is computed and copied in).
    if kwargs or weight.dim() != 2 or not out.is_contiguous() or not indices.is_contiguous():
        return None
    if any(bool(a) for a in args[3:5]):
        return None
    torch.ops.aten.index_select.out(weight, 0, indices.reshape(-1), out=out.view(-1, weight.size(1)))
    return out


def _embedding_backward(args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor | None:
    # The CPU kernel zeroes the weight's gradient and adds grad row i into row indices[i], for i in order,
    # skipping padding_idx: index_add_ does the same additions in the same order (a GPU's kernel does not).
    grad, indices, num_weights, padding_idx = args[:4]
    scale_by_freq = bool(args[4]) if len(args) > 4 else bool(kwargs.get("scale_grad_by_freq", False))
    if scale_by_freq or not grad.is_contiguous() or not indices.is_contiguous() or not out.is_contiguous():
        return None
    if tuple(out.shape) != (num_weights, grad.size(-1)):
        return None
    out.zero_()
    out.index_add_(0, indices.reshape(-1), grad.view(-1, grad.size(-1)))
    if 0 <= padding_idx < num_weights:
        out[padding_idx].zero_()
    return out


def _clone(args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor | None:
    # clone is empty_like(self, memory_format) then copy_: the planned tensor already has the layout
    # empty_like chose when the graph was traced, and copy_ moves the same bits.
    (x,) = args
    if tuple(x.shape) != tuple(out.shape) or x.dtype != out.dtype:
        return None
    return out.copy_(x)


def _safe_softmax(args: Sequence[Any], kwargs: dict[str, Any], out: torch.Tensor) -> torch.Tensor | None:
    # ATen's _safe_softmax is where(all(self == -inf, dim), 0, softmax(self, dim)): softmax of a float
    # tensor in its own dtype is _softmax(self, dim, false), which has a real out= overload.  A row is all
    # -inf exactly when its max is -inf (a NaN makes both false), so the rows to zero come from an
    # amax of one value per row instead of a boolean copy of the whole input.
    x, dim = args[0], args[1]
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    if (dtype is not None and dtype != x.dtype) or not x.is_floating_point() or x.dtype != out.dtype:
        return None
    if x.dim() == 0 or x.size(dim) == 0 or tuple(x.shape) != tuple(out.shape):
        return None
    torch.ops.aten._softmax.out(x, dim, False, out=out)
    return out.masked_fill_(x.amax(dim, keepdim=True).eq(float("-inf")), 0)


_REWRITES: dict[Any, Rewrite] = {
    torch.ops.aten.relu.default: _relu,
    torch.ops.aten.ones_like.default: _ones_like,
    torch.ops.aten.embedding.default: _embedding,
    torch.ops.aten.embedding_dense_backward.default: _embedding_backward,
    torch.ops.aten.clone.default: _clone,
    torch.ops.aten._safe_softmax.default: _safe_softmax,
}

#: Rewrites exact only against the CPU kernel.
_CPU_ONLY = frozenset({torch.ops.aten.embedding_dense_backward.default, torch.ops.aten._safe_softmax.default})

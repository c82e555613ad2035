"""Per-op recompute in eager autograd: the plan's recomputes, honoured inside a user's loop.

The plan says which forward ATen calls to recompute (``Plan.remat``: the op, and which
of its outputs).  The captured graph lists the forward's ATen calls in the order
eager PyTorch makes them, up to where a module reads its data (a traced forward
takes branches a real one skips): ``RecomputePolicy.aligned`` maps the graph's
forward ops onto the calls one real forward makes (``module_calls``), so the
*i*-th call is known to be the graph's op ``F`` or none.  While the wrapped forward
runs, ``RecomputeHooks``:

* counts ATen calls in a ``TorchDispatchMode``; for a call the plan recomputes it
  keeps a *recipe* (the ATen overload and its arguments, where an argument that is
  itself a recomputed result is kept as a reference to its recipe, not the tensor);
* installs ``saved_tensors_hooks``: when autograd saves a tensor whose storage a
  recipe makes, it stores a small handle instead of the tensor, so the forward's
  result dies after its last forward use, as the plan's ``F`` does;
* in backward, the first node that unpacks a handle reruns the recipe (under
  ``no_grad``) and the result is cached until every handle and every dependent
  recipe has read it: the plan's ``F@recompute``, right before its first late reader;
* where the plan cuts later (``from_op`` past the tensor's first backward reader,
  ``apply_cuts``), the handles share the original, kept for the backward nodes before
  the cut: the first ``early_nodes`` nodes that unpack it read it, and when the last
  of them ends the original is let go; the nodes after recompute.

Unlike ``torch.utils.checkpoint`` there are no regions: each recompute happens when
its reader needs it, which is the timing the planner modelled (``apply_memory``).
Correctness never depends on the matching: a recipe replays the very call that was
made, so a forward that does not match only costs the memory the plan promised
(``mismatch`` says where the counting stopped); a call that draws random numbers is
never replayed.  An argument modified in place between the forward and the
recompute raises, as autograd does for saved tensors.
"""

from __future__ import annotations

import contextvars
import difflib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from mpplan.capture.torch_capture import CapturedProgram
from mpplan.runtime.apply_cuts import Cut, cuts_of

__all__ = ["IGNORED", "RecomputeHooks", "RecomputePolicy", "module_calls"]

#: Calls left out of the matching: ``make_fx`` records a ``detach`` where an op saves
#: its output, and autograd ``detach``es every tensor it hands a pack hook; neither
#: makes memory, and neither happens in the other run.
IGNORED = "aten.detach.default"

#: Set while ``apply`` moves tensors between devices (``RecomputeHooks.paused``): those calls are
#: not the module's, so neither the hooks nor ``module_calls`` count them.
_PAUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("mpplan_recompute_paused", default=False)


@dataclass(frozen=True, slots=True)
class RecomputePolicy:
    """Which forward ATen calls to recompute, by position in the module's forward.

    ``forward_ops`` are the ATen overloads (``str(OpOverload)``) of the captured
    forward ops in order, ``detach`` left out (``IGNORED``); ``recompute`` maps a position to the IR op name and the
    positions, among the call's tensor results, that are recomputed; ``cuts`` where the
    recomputed results that a record gives a cut point are first read (``apply_cuts``).
    """

    forward_ops: tuple[str, ...]
    recompute: Mapping[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    cuts: tuple[Cut, ...] = ()

    @classmethod
    def from_records(cls, program: CapturedProgram, records: Any) -> RecomputePolicy:
        """The policy for ``Plan.remat`` records over ``program``, indexed by the traced forward's calls.

        The traced forward also holds the loss's calls, made after the module returns;
        ``aligned`` onto the module's real calls drops them (out of ``apply``'s reach).
        A record's cut point (``from_op``) may be any backward reader of its tensor: the
        nodes before it read the original, kept for them (``apply_cuts``); a cut ``apply``
        cannot honour raises ``PlanError`` naming the record.
        """
        graph = program.graph
        cuts = cuts_of(program, records)
        forward = [
            op for op in graph.ops if program.op_phases.get(op.name) == "forward" and op.type != IGNORED
        ]
        position = {op.name: i for i, op in enumerate(forward)}
        chosen: dict[int, list[int]] = {}
        for record in records:
            i = position.get(record["op"])
            if i is None:
                continue
            outputs = forward[i].outputs
            if record["tensor"] in outputs:
                chosen.setdefault(i, []).append(outputs.index(record["tensor"]))
        recompute = {i: (forward[i].name, tuple(sorted(set(p)))) for i, p in sorted(chosen.items())}
        honoured = {name for name, _ in recompute.values()}
        return cls(tuple(op.type for op in forward), MappingProxyType(recompute),
                   tuple(c for c in cuts if c.op in honoured))

    @property
    def ops(self) -> tuple[str, ...]:
        """The IR names of the recomputed forward ops."""
        return tuple(name for name, _ in self.recompute.values())

    @property
    def from_ops(self) -> dict[str, str]:
        """Recomputed IR tensor -> the op its recompute is first read by, where a cut says (``apply_memory``)."""
        return {c.tensor: c.from_op for c in self.cuts}

    def aligned(self, calls: Sequence[str]) -> RecomputePolicy:
        """This policy re-indexed onto ``calls``, the ATen calls the module really makes.

        A traced forward can differ from the real one where the module reads data:
        Hugging Face builds an attention mask under tracing that a real forward skips
        after ``mask.all()``.  The two sequences are aligned (``difflib``'s longest
        matching blocks); a recompute the real forward has no matching call for is
        dropped, so ``ops`` (and the prediction) lists only what can be honoured.
        """
        matcher = difflib.SequenceMatcher(a=self.forward_ops, b=list(calls), autojunk=False)
        where: dict[int, int] = {}
        for a, b, size in matcher.get_matching_blocks():
            where.update((a + k, b + k) for k in range(size))
        recompute = {where[i]: chosen for i, chosen in self.recompute.items() if i in where}
        honoured = {name for name, _ in recompute.values()}
        return RecomputePolicy(tuple(calls), MappingProxyType(dict(sorted(recompute.items()))),
                               tuple(c for c in self.cuts if c.op in honoured))


@dataclass(slots=True)
class _Recipe:
    """One recomputable ATen call: replayed on demand, result cached while readers remain."""

    func: Any
    args: Any
    versions: tuple[tuple[torch.Tensor, int], ...]
    pending: int = 0
    value: tuple[torch.Tensor, ...] | None = None

    def materialise(self) -> tuple[torch.Tensor, ...]:
        if self.value is None:
            for tensor, version in self.versions:
                if tensor._version != version:
                    raise RuntimeError(
                        f"apply: an input of {self.func} was modified in place after the forward; "
                        "it cannot be recomputed (don't modify that tensor in place, or plan without recomputing it)"
                    )
            args, kwargs = pytree.tree_map(_resolve, self.args)
            with torch.no_grad():
                out = self.func(*args, **kwargs)
            self.value = tuple(t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
        return self.value

    def release(self) -> None:
        """One reader done; the last one drops the cached result."""
        self.pending -= 1
        if self.pending <= 0:
            self.value = None


@dataclass(frozen=True, slots=True)
class _Ref:
    """A recomputed result as its recipe, output position and view geometry (a view of it, possibly)."""

    recipe: _Recipe
    output: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def get(self) -> torch.Tensor:
        base = self.recipe.materialise()[self.output]
        if base.size() == self.size and base.stride() == self.stride and base.storage_offset() == self.offset:
            return base
        return base.as_strided(self.size, self.stride, self.offset)


@dataclass(slots=True)
class _Kept:
    """The original of a recomputed result, kept for the first ``nodes`` backward nodes that unpack it.

    ``tensors`` are what autograd handed the pack hook (views of the one storage), one
    slot per saved handle; ``None`` once the last of those nodes has ended.  A node is
    known by the engine's current node (``torch._C._current_autograd_node``): a
    node may unpack the tensor more than once (``mul(x, x)``), and it ends when its
    post-hook runs.  Outside backward (a ``grad_fn._saved_*`` read) the original is
    returned and nothing is counted.
    """

    nodes: int
    tensors: list[torch.Tensor] | None = field(default_factory=list)
    started: int = 0
    ended: int = 0
    current: int | None = None

    def hold(self, tensor: torch.Tensor) -> int:
        assert self.tensors is not None, "a tensor saved after its original was let go"
        self.tensors.append(tensor)
        return len(self.tensors) - 1

    def read(self, slot: int) -> torch.Tensor | None:
        """The original for the node now running, or ``None`` where that node reads the recompute."""
        if self.tensors is None:
            return None
        node = torch._C._current_autograd_node()
        if node is None or id(node) == self.current:
            return self.tensors[slot]
        if self.started == self.nodes:
            return None  # every node before the cut has started: this one is after it
        self.started += 1
        self.current = id(node)
        node.register_hook(self._ended)  # the hook holds this record, never the node: no cycle through it
        return self.tensors[slot]

    def _ended(self, _grad_inputs: Any, _grad_outputs: Any) -> None:
        self.ended += 1
        self.current = None
        if self.ended == self.nodes:
            self.tensors = None


@dataclass(frozen=True, slots=True)
class _Saved:
    """A handle to a recomputed result whose cut is late: the original in ``kept`` until its nodes are done."""

    ref: _Ref
    kept: _Kept
    slot: int


def _resolve(value: Any) -> Any:
    if isinstance(value, _Ref):
        tensor = value.get()
        value.recipe.release()
        return tensor
    return value


class RecomputeHooks:
    """The hooks that honour a ``RecomputePolicy`` during one module's forwards (module docstring).

    ``calls`` counts the ATen calls of the last forward; ``recomputed`` how many
    recipes were replayed since construction; ``mismatch`` the first position where
    the last forward's calls stopped matching the policy's (``None`` while they match).
    """

    def __init__(self, policy: RecomputePolicy) -> None:
        self.policy = policy
        self.calls = 0
        self.recomputed = 0
        self.mismatch: str | None = None
        self._paused = False
        self._made: dict[StorageWeakRef, tuple[_Recipe, int, torch.dtype, _Kept | None]] = {}
        self._early = {(c.op, c.output): c.early_nodes for c in policy.cuts if c.early_nodes}

    @contextmanager
    def forward(self) -> Iterator[None]:
        """Honour the policy for the forward run inside this context."""
        self.calls = 0
        self.mismatch = None
        self._made = {}
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack), _CallMode(self):
                yield
        finally:
            self._made = {}  # recipes now live only as long as autograd's handles to them

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Calls made inside are not the module's own (``apply``'s device moves): not counted."""
        saved, self._paused = self._paused, True
        token = _PAUSED.set(True)
        try:
            yield
        finally:
            self._paused = saved
            _PAUSED.reset(token)

    def _record(self, index: int, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        """Note the call at ``index``: check it against the graph, keep a recipe when it is recomputed."""
        if self.mismatch is not None:
            return
        expected = self.policy.forward_ops[index] if index < len(self.policy.forward_ops) else None
        if str(func) != expected:
            self.mismatch = f"call {index}: the module ran {func}, the policy expects {expected}"
            return
        self._forget_written(func, args, kwargs)
        chosen = self.policy.recompute.get(index)
        if chosen is None or not torch.is_grad_enabled() or _random(func, args, kwargs):
            return  # a random call replayed would draw new numbers: never recomputed, whatever the plan says
        results = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        recipe = _Recipe(func, None, ())
        refs: list[tuple[torch.Tensor, int]] = []

        def keep(value: Any) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            ref = self._ref_of(value)
            if ref is not None:
                ref.recipe.pending += 1
                return ref
            refs.append((value, value._version))
            return value

        recipe.args = pytree.tree_map(keep, (args, kwargs))
        recipe.versions = tuple(refs)
        for position in chosen[1]:
            if position < len(results):
                tensor = results[position]
                early = self._early.get((chosen[0], position))
                kept = _Kept(early) if early else None
                self._made[StorageWeakRef(tensor.untyped_storage())] = (recipe, position, tensor.dtype, kept)

    def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        """A result written in place after it was made can no longer be recomputed from its recipe."""
        schema = getattr(func, "_schema", None)
        if schema is None or not self._made:
            return
        for arg, value in zip(schema.arguments, (*args, *(kwargs.get(a.name) for a in schema.arguments[len(args):]))):
            if arg.alias_info is not None and arg.alias_info.is_write:
                for t in pytree.tree_leaves(value):
                    if isinstance(t, torch.Tensor):
                        self._made.pop(StorageWeakRef(t.untyped_storage()), None)

    def _ref_of(self, tensor: torch.Tensor) -> _Ref | None:
        found = self._entry(tensor)
        return None if found is None else found[0]

    def _entry(self, tensor: torch.Tensor) -> tuple[_Ref, _Kept | None] | None:
        """The recipe reference of ``tensor`` and the original kept for the nodes before its cut, if recomputed."""
        if tensor.device.type == "meta":
            return None
        entry = self._made.get(StorageWeakRef(tensor.untyped_storage()))
        if entry is None or entry[2] != tensor.dtype:
            return None
        recipe, position, _, kept = entry
        ref = _Ref(recipe, position, tuple(tensor.size()), tuple(tensor.stride()), int(tensor.storage_offset()))
        return ref, kept

    def _pack(self, tensor: torch.Tensor) -> Any:
        found = self._entry(tensor)
        if found is None:
            return tensor
        ref, kept = found
        ref.recipe.pending += 1
        return ref if kept is None else _Saved(ref, kept, kept.hold(tensor))

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _Saved):
            original = packed.kept.read(packed.slot)
            if original is not None:
                packed.ref.recipe.release()
                return original
            packed = packed.ref
        if not isinstance(packed, _Ref):
            return packed
        if packed.recipe.value is None:
            self.recomputed += 1
        return _resolve(packed)


def _random(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether this call draws random numbers: a seeded kernel, but attention with ``dropout_p`` 0."""
    if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
        return False
    schema = getattr(func, "_schema", None)
    if schema is None:
        return True
    names = [a.name for a in schema.arguments]
    if "dropout_p" in names:
        i = names.index("dropout_p")
        p = args[i] if i < len(args) else kwargs.get("dropout_p", schema.arguments[i].default_value)
        return bool(p)
    return True


def module_calls(module: torch.nn.Module, example_inputs: Any) -> tuple[str, ...]:
    """The ATen calls (but ``detach``) one real forward of ``module`` makes, for ``RecomputePolicy.aligned``.

    Run under ``no_grad`` with the RNG state forked, so nothing is saved and the
    caller's random stream is untouched.  ``module`` may be a ``PlannedModule``: its
    device moves are not counted.
    """
    from mpplan.runtime.eager import call_module

    recorder = _Recorder()
    devices = sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices), torch.no_grad(), recorder:
        call_module(module, example_inputs)
    return tuple(recorder.calls)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if str(func) != IGNORED and not _PAUSED.get():
            self.calls.append(str(func))
        return out


class _CallMode(TorchDispatchMode):
    """Count the forward's ATen calls (but ``detach``) and hand each to ``RecomputeHooks._record``."""

    def __init__(self, hooks: RecomputeHooks) -> None:
        super().__init__()
        self.hooks = hooks

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.hooks._paused or str(func) == IGNORED:
            return out
        index = self.hooks.calls
        self.hooks.calls += 1
        self.hooks._record(index, func, args, kwargs, out)
        return out

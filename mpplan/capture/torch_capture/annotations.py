"""Marks that tracing leaves on fx nodes, read by the lowering into ``Op`` fields.

While ``make_fx`` traces, ``torch.fx.traceback.annotate`` scopes put three keys in each new
node's ``node.meta["custom"]``: the phase (forward, backward or optimizer), the module whose
``forward`` ran the op, and in backward the sequence number of the autograd node being run.
The lowering turns them into the IR's fields:

* ``Op.module`` is the dotted path of the innermost submodule whose ``forward`` ran
  the op (``None`` at the root); backward ops inherit their forward op's module and
  optimizer ops the module owning their parameter.
* ``Op.backward_of`` links a backward op to the forward op it differentiates through
  autograd's sequence number: the forward fx node records the number of the autograd
  node it created, and hooks on every autograd node of the loss's graph mark the ops
  run while that node's backward executes.  Ops the engine runs between nodes (the
  seed ``ones_like``, gradient accumulation, clones of shared gradients) take the
  link of their first consumer that has one, else of their inputs' producers.

The hooks are registered for one trace and removed after it, even when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx.traceback as fx_traceback

# Keys of the annotations in fx ``node.meta["custom"]``, and the phases.
PHASE = "mpplan_phase"
MODULE = "mpplan_module"
GRAD_FN = "mpplan_grad_fn"
FORWARD, BACKWARD, OPTIMIZER = "forward", "backward", "optimizer"


def owner(fqn: str) -> str | None:
    """The module path owning parameter ``fqn`` (``None`` for the root)."""
    return fqn.rpartition(".")[0] or None


@contextmanager
def module_annotations(module: torch.nn.Module, on_leave: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Annotate every node traced inside a submodule's forward with the submodule's path.

    ``on_leave`` is called as each submodule's forward returns (a progress bar's tick).
    """
    open_scopes: list[Any] = []
    handles = []

    def enter(path: str) -> Callable[..., None]:
        def pre_hook(_module: torch.nn.Module, _args: Any) -> None:
            scope = fx_traceback.annotate({MODULE: path})
            scope.__enter__()
            open_scopes.append(scope)

        return pre_hook

    def leave(_module: torch.nn.Module, _args: Any, _output: Any) -> None:
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)
        on_leave()

    try:
        for path, sub in module.named_modules():
            if path:
                handles.append(sub.register_forward_pre_hook(enter(path)))
                handles.append(sub.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def backward_annotations(loss: torch.Tensor) -> Iterator[None]:
    """Mark the ops each autograd node runs in backward with that node's sequence number."""
    open_scopes: list[Any] = []
    handles = []

    def pre_hook(seq: int) -> Callable[..., None]:
        def hook(_grad_outputs: Any) -> None:
            scope = fx_traceback.annotate({GRAD_FN: seq})
            scope.__enter__()
            open_scopes.append(scope)

        return hook

    def post_hook(_grad_inputs: Any, _grad_outputs: Any) -> None:
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)

    seen: set[torch.autograd.graph.Node] = set()
    stack = [loss.grad_fn] if loss.grad_fn is not None else []
    try:
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            handles.append(node.register_prehook(pre_hook(node._sequence_nr())))
            handles.append(node.register_hook(post_hook))
            stack.extend(fn for fn, _ in node.next_functions if fn is not None and fn not in seen)
        yield
    finally:
        for h in handles:
            h.remove()

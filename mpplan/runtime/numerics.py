"""Numerics: planned execution against eager PyTorch, and finding the first op that went wrong.

``compare`` holds the planned run's first step (outputs or loss, gradients,
parameters and buffers after the update) against eager's.  The tolerance is
``torch.allclose``'s ``|a - b| <= atol + rtol * |b|`` with, by dtype:

* float64: rtol 1e-7, atol 1e-9;
* float32: rtol 1e-4, atol 1e-5 (eager autograd may sum shared gradients in a
  different order, and the captured Adam is torch's *capturable* formulation, not
  the single-tensor one eager runs, so bits may differ in the last places);
* float16/bfloat16: rtol 1e-2, atol 1e-2;
* integers and bools: exact.

On CPU most cases come out bitwise equal; ``Numerics.bitwise`` says so.

When the check fails, ``first_bad_op`` runs the same schedule twice in lock step
-- as planned, and as an op-by-op reference on the same devices without arena --
and compares every op's inputs (before it runs) and results (after) bit for bit
on CPU.  On a GPU some kernels are not deterministic run to run (atomics in
memory-efficient attention's and embedding's backward, scatter-add), so two runs
of the same op may differ in the last bits; there the comparison allows the
dtype's tolerance, which a tensor overwritten by another is far outside.  A wrong
offset shows up as the first op reading a tensor that something else has
overwritten.  Random ops draw from separate, identically seeded generator states
in the two runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mpplan.runtime.eager import Snapshot
from mpplan.runtime.executor import Executor
from mpplan.runtime.measure import Numerics

__all__ = ["compare", "first_bad_op", "tolerance"]


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) the numerics check allows for ``dtype``."""
    if dtype == torch.float64:
        return 1e-7, 1e-9
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    if dtype.is_floating_point or dtype.is_complex:
        return 1e-4, 1e-5
    return 0.0, 0.0


@dataclass(frozen=True, slots=True)
class _Diff:
    key: str
    max_abs: float
    close: bool
    equal: bool
    note: str | None = None


def compare(planned: Snapshot, eager: Snapshot) -> Numerics:
    """Compare two first-step snapshots; ``first_bad_op`` is left for ``first_bad_op`` to fill."""
    diffs: list[_Diff] = []
    if len(planned.outputs) != len(eager.outputs):
        diffs.append(_Diff("outputs", math.inf, False, False,
                           f"planned run returned {len(planned.outputs)} outputs, eager {len(eager.outputs)}"))
    for i, (a, b) in enumerate(zip(planned.outputs, eager.outputs)):
        diffs.append(_diff(f"output[{i}]", a, b))
    for section, mine, theirs in (("grad", planned.grads, eager.grads), ("state", planned.state, eager.state)):
        for key in sorted(set(mine) | set(theirs)):
            if key not in mine or key not in theirs:
                where = "planned run" if key not in mine else "eager run"
                diffs.append(_Diff(f"{section}[{key}]", math.inf, False, False, f"missing from the {where}"))
                continue
            diffs.append(_diff(f"{section}[{key}]", mine[key], theirs[key]))
    rtol, atol = tolerance(_main_dtype(planned))
    worst = max(diffs, key=lambda d: d.max_abs, default=None)
    bad = next((d for d in diffs if not d.close), None)
    return Numerics(
        ok=bad is None,
        max_abs_diff=0.0 if worst is None else worst.max_abs,
        first_bad_op=None,
        bitwise=all(d.equal for d in diffs),
        compared=len(diffs),
        rtol=rtol,
        atol=atol,
        worst=None if worst is None else worst.key,
        detail=None if bad is None else (bad.note or f"{bad.key} differs from eager by up to {bad.max_abs:g}"),
    )


def first_bad_op(planned: Executor, reference: Executor, seed: int) -> tuple[str | None, str]:
    """Run ``planned`` and ``reference`` (same schedule, same start state) in lock step for one step.

    Returns the first op whose inputs or results differ bit for bit, with a sentence
    saying which tensor; ``(None, ...)`` when the two runs agree throughout.
    """
    rng_a, rng_b = _RngState.seeded(seed), _RngState.seeded(seed)
    gen_a, gen_b = planned.iter_step(observe=True), reference.iter_step(observe=True)
    while True:
        try:
            with rng_a:
                trace_a = next(gen_a)
            with rng_b:
                trace_b = next(gen_b)
        except StopIteration:
            return None, "the planned run matches the op-by-op reference run bit for bit"
        step = trace_a.step
        for what, mine, theirs in (("input", trace_a.reads, trace_b.reads), ("result", trace_a.writes, trace_b.writes)):
            for name in mine:
                if name in theirs and not _lockstep_equal(mine[name], theirs[name]):
                    tensor = _describe(planned, name)
                    if what == "input":
                        why = (f"op {step.op!r} on {step.device} reads {tensor}, which differs from the reference run: "
                               "its memory was overwritten after it was produced (overlapping buffers?)")
                    else:
                        why = f"op {step.op!r} on {step.device} computed {tensor} differently from the reference run"
                    return step.op, why


def _describe(executor: Executor, node: str) -> str:
    """The IR tensor an fx value holds, with its storage root when it is a view: ``'view_9' (a view of 'addmm_2')``."""
    graph = executor.program.graph
    tensor = executor.program.node_tensors.get(node, node)
    if tensor not in graph.topology.tensor_index:
        return repr(tensor)
    root = graph.tensors[graph.topology.storage_of[graph.topology.tensor_index[tensor]]].name
    return repr(tensor) if root == tensor else f"{tensor!r} (a view of {root!r})"


class _RngState:
    """A private copy of the CPU and CUDA generator states, swapped in while a run's op executes."""

    def __init__(self, cpu: torch.Tensor, cuda: list[torch.Tensor]) -> None:
        self.cpu, self.cuda = cpu, cuda
        self._saved: tuple[torch.Tensor, list[torch.Tensor]] | None = None

    @classmethod
    def seeded(cls, seed: int) -> _RngState:
        saved = _RngState._capture()
        torch.manual_seed(seed)
        state = cls(*_RngState._capture())
        _RngState._restore(*saved)
        return state

    @staticmethod
    def _capture() -> tuple[torch.Tensor, list[torch.Tensor]]:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        return torch.get_rng_state(), cuda

    @staticmethod
    def _restore(cpu: torch.Tensor, cuda: list[torch.Tensor]) -> None:
        torch.set_rng_state(cpu)
        if cuda:
            torch.cuda.set_rng_state_all(cuda)

    def __enter__(self) -> None:
        self._saved = _RngState._capture()
        _RngState._restore(self.cpu, self.cuda)

    def __exit__(self, *exc: object) -> None:
        self.cpu, self.cuda = _RngState._capture()
        assert self._saved is not None
        _RngState._restore(*self._saved)


def _diff(key: str, a: torch.Tensor | None, b: torch.Tensor | None) -> _Diff:
    if a is None or b is None:
        same = a is None and b is None
        return _Diff(key, 0.0 if same else math.inf, same, same, None if same else "one side is None")
    if a.shape != b.shape or a.dtype != b.dtype:
        return _Diff(key, math.inf, False, False, f"{key}: planned {tuple(a.shape)} {a.dtype}, eager {tuple(b.shape)} {b.dtype}")
    a, b = a.detach().cpu(), b.detach().cpu()
    equal = _bit_equal(a, b)
    if not (a.is_floating_point() or a.is_complex()):
        return _Diff(key, 0.0 if equal else float((a.long() - b.long()).abs().max()), equal, equal)
    rtol, atol = tolerance(a.dtype)
    finite = torch.isfinite(a) & torch.isfinite(b)
    nan_mismatch = bool(((~torch.isfinite(a)) | (~torch.isfinite(b))).any()) and not torch.equal(
        a[~finite].nan_to_num(), b[~finite].nan_to_num()
    )
    delta = (a.double() - b.double()).abs()
    max_abs = float(delta[finite].max()) if bool(finite.any()) else 0.0
    if nan_mismatch:
        max_abs = math.inf
    close = not nan_mismatch and bool(torch.allclose(a[finite].double(), b[finite].double(), rtol=rtol, atol=atol))
    return _Diff(key, max_abs, close, equal)


def _lockstep_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit on CPU; within the dtype's tolerance when either ran on a GPU (see the module docstring)."""
    if a.device.type == "cpu" and b.device.type == "cpu":
        return _bit_equal(a, b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    rtol, atol = tolerance(a.dtype)
    return bool(torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _main_dtype(snapshot: Snapshot) -> torch.dtype:
    for value in (*snapshot.outputs, *snapshot.grads.values(), *snapshot.state.values()):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
    return torch.float32


"""Numerics: planned execution against eager PyTorch, and finding the first op that went wrong.

``compare`` holds the planned run's first step (outputs or loss, gradients,
parameters and buffers after the update) against eager's.  The tolerance is
``torch.allclose``'s ``|a - b| <= atol + rtol * |b|`` with, by dtype:

* float64: rtol 1e-7, atol 1e-9;
* float32: rtol 1e-4, atol 1e-5 (eager autograd may sum shared gradients in a
  different order, and the captured Adam is torch's *capturable* formulation, not
  the single-tensor one eager runs, so bits may differ in the last places);
* float16/bfloat16: rtol 1e-2, atol 1e-2;
* integers and bools: exact;

plus, when further eager steps from the same seed are given (``eager_again``), the
noise eager shows against itself: ``NOISE_FACTOR`` times the largest difference
of any of them from the first eager run on that tensor (``evaluate`` runs up to
``EAGER_NOISE_RUNS`` while the runs differ and the check fails).  On a GPU, kernels that are not
deterministic (atomics in embedding's and attention's backward, cuDNN's
convolution backward) make two eager runs differ, and Adam's normalised update
magnifies that where the second moment is small; such a difference is noise, not
a bug.  On CPU the two eager runs agree bit for bit and the noise is 0.

When the check fails, ``first_bad_op`` runs the same schedule in lock step three
times -- as planned, and twice as an op-by-op reference on the same devices
without arena -- and compares every op's inputs (before it runs) and results
(after).  Two references measure, tensor by tensor, what the kernels do not
reproduce themselves (bits of a non-deterministic kernel, the uninitialised
padding of memory-efficient attention's log-sum-exp): where the references differ
by ``n`` (kernels that are not deterministic), the planned run may differ from
them by the dtype's tolerance plus ``NOISE_FACTOR * n``; where they agree bit for
bit (always on CPU), it must too (on a GPU: within the dtype's tolerance) -- unless what the op read
differed between the references: then two of its results agreeing bit for bit is rounding's luck, not
determinism, and the dtype's tolerance applies (a result computed in an arena at another alignment may
round differently in the last place), there and wherever that result is read.  The blame follows the data:

* an op reading a tensor that was right when it was made but differs now: its
  memory was overwritten after it was produced (overlapping buffers?), and the
  message names the tensor and its storage root -- the victim;
* an op whose results differ while its inputs agree is a suspect; it is blamed
  when an op reading those results computes differently too (the difference
  spreads), or, failing that, at the end as the first suspect.  A result that
  differs where no later result depends on it (padding) never outranks an
  overwritten input.

Random ops draw from separate, identically seeded generator states in the runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mpplan.runtime.eager import Snapshot
from mpplan.runtime.executor import Executor
from mpplan.runtime.measure import Numerics

__all__ = ["EAGER_NOISE_RUNS", "NOISE_FACTOR", "compare", "first_bad_op", "grounded_in_noise", "tolerance"]

#: Eager steps from the same seed that may measure eager's run-to-run noise when the numerics disagree.  One
#: pair of runs is one sample of a non-deterministic kernel's spread (cuDNN's convolution backward, atomics):
#: on an H200 a no-arena zoo_resnet run, the executor's own kernels, failed once in eight against a pair that
#: happened to agree closely.  More are run only while the runs differ at all.
EAGER_NOISE_RUNS = 3

#: How many times the measured run-to-run difference a comparison allows on top of the dtype's tolerance.
NOISE_FACTOR = 4.0


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


def compare(planned: Snapshot, eager: Snapshot, eager_again: Snapshot | Sequence[Snapshot] | None = None) -> Numerics:
    """Compare two first-step snapshots; ``first_bad_op`` is left for ``first_bad_op`` to fill.

    ``eager_again``, one or more further eager steps from the same seed, grounds the
    tolerance in eager's own run-to-run noise (see the module docstring): per tensor,
    the largest difference of any of them from ``eager``.  ``Numerics.noise`` is the
    largest of those over all tensors.
    """
    agains = () if eager_again is None else (eager_again,) if isinstance(eager_again, Snapshot) else tuple(eager_again)
    diffs: list[_Diff] = []
    noise = 0.0
    if len(planned.outputs) != len(eager.outputs):
        diffs.append(_Diff("outputs", math.inf, False, False,
                           f"planned run returned {len(planned.outputs)} outputs, eager {len(eager.outputs)}"))
    for i, (a, b) in enumerate(zip(planned.outputs, eager.outputs)):
        n = max((_noise(b, run.outputs[i] if i < len(run.outputs) else None) for run in agains), default=0.0)
        noise = max(noise, n)
        diffs.append(_diff(f"output[{i}]", a, b, n))
    sections = (("grad", planned.grads, eager.grads), ("state", planned.state, eager.state))
    for section, mine, theirs in sections:
        others = [run.grads if section == "grad" else run.state for run in agains]
        for key in sorted(set(mine) | set(theirs)):
            if key not in mine or key not in theirs:
                where = "planned run" if key not in mine else "eager run"
                diffs.append(_Diff(f"{section}[{key}]", math.inf, False, False, f"missing from the {where}"))
                continue
            n = max((_noise(theirs[key], other.get(key)) for other in others), default=0.0)
            noise = max(noise, n)
            diffs.append(_diff(f"{section}[{key}]", mine[key], theirs[key], n))
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
        detail=None if bad is None else (bad.note or f"{bad.key} differs from eager by up to {bad.max_abs:g}"
                                         + (f", beyond eager's own run-to-run noise {noise:g}" if noise else "")),
        noise=None if not agains else noise,
    )


def grounded_in_noise(planned: Snapshot, eager: Snapshot, eager_again: Callable[[], Snapshot],
                      runs: int = EAGER_NOISE_RUNS) -> Numerics:
    """``compare`` with the tolerance grounded in eager's own run-to-run noise: up to ``runs`` more eager
    steps from the same seed (``eager_again``), while the comparison fails and they differ at all (never
    more than one on a CPU, where eager repeats itself bit for bit)."""
    agains = [eager_again()]
    numerics = compare(planned, eager, agains)
    while not numerics.ok and numerics.noise and len(agains) < runs:
        agains.append(eager_again())
        numerics = compare(planned, eager, agains)
    return numerics


def first_bad_op(planned: Executor, references: tuple[Executor, Executor], seed: int) -> tuple[str | None, str]:
    """Run ``planned`` and two ``references`` (same schedule, same start state) in lock step for one step.

    Returns the op to blame and a sentence saying why (see the module docstring);
    ``(None, ...)`` when the planned run agrees with the references throughout.
    """
    runs = (planned, *references)
    rngs = [_RngState.seeded(seed) for _ in runs]
    gens = [run.iter_step(observe=True) for run in runs]
    suspects: dict[str, str] = {}  # tensor (fx value) -> the op that computed it differently
    rounded: set[str] = set()  # results of ops whose inputs differed: held to the dtype's tolerance where read
    first_suspect: tuple[str, str] | None = None
    while True:
        traces = []
        try:
            for rng, gen in zip(rngs, gens):
                with rng:
                    traces.append(next(gen))
        except StopIteration:
            break
        mine, ref, again = traces
        step = mine.step
        spread_from: str | None = None
        read_noise = False  # whether the references read different values: their results may then differ too
        for name in mine.reads:
            if name not in ref.reads:
                continue
            noise = _noise(ref.reads[name], again.reads.get(name))
            read_noise = read_noise or noise > 0.0 or name in rounded
            if _agrees(mine.reads[name], ref.reads[name], noise, name in rounded):
                continue
            if name not in suspects:
                return step.op, (
                    f"op {step.op!r} on {step.device} reads {_describe(planned, name)}, which differs from the "
                    "reference runs beyond their own noise: its memory was overwritten after it was produced "
                    "(overlapping buffers?)"
                )
            spread_from = spread_from or name
        for name in mine.writes:
            noise = _noise(ref.writes.get(name), again.writes.get(name))
            if read_noise:
                rounded.add(name)
            if name in ref.writes and not _agrees(mine.writes[name], ref.writes[name], noise, read_noise):
                if spread_from is not None:
                    culprit = suspects[spread_from]
                    return culprit, (
                        f"op {culprit!r} computed {_describe(planned, spread_from)} differently from the reference "
                        f"runs, and op {step.op!r}, which reads it, then computed {_describe(planned, name)} "
                        "differently too"
                    )
                suspects[name] = step.op
                if first_suspect is None:
                    first_suspect = (step.op, name)
    if first_suspect is not None:
        op, name = first_suspect
        return op, (f"op {op!r} computed {_describe(planned, name)} differently from the reference runs "
                    "(beyond their own noise); no later op's results were seen to differ because of it")
    return None, ("the planned run matches the op-by-op reference runs within their own noise: the difference "
                  "from eager lies between the captured program and the eager module, not in the plan")


def _agrees(mine: torch.Tensor, ref: torch.Tensor, noise: float, read_noise: bool = False) -> bool:
    """Whether ``mine`` matches reference ``ref`` within the dtype's tolerance (0 on CPU) plus ``noise``, the
    references' difference on it.  ``read_noise``: the references' op read different values, so a result
    they agree on bit for bit may still differ in a third run by rounding; the dtype's tolerance applies."""
    if mine.shape != ref.shape or mine.dtype != ref.dtype:
        return False
    on_cpu = mine.device.type == "cpu" and ref.device.type == "cpu"
    if on_cpu and noise == 0.0 and not read_noise:
        return _bit_equal(mine, ref)
    a, b = mine.detach().cpu(), ref.detach().cpu()
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    # References that differ at all come from kernels that are not deterministic: the dtype's tolerance
    # applies as on a GPU (Adam's normalised update magnifies noise where a gradient is small).
    rtol, atol = tolerance(a.dtype)
    if math.isinf(noise):
        return True  # the references themselves disagree without bound (uninitialised memory): nothing to judge
    return _within(a, b, rtol, atol + NOISE_FACTOR * noise)


def _noise(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """The largest difference between two runs' values of one tensor: 0 when identical or only one is known.

    ``inf`` where they do not even agree on which elements are finite.
    """
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype:
        return 0.0
    a, b = a.detach().cpu(), b.detach().cpu()
    if _bit_equal(a, b):
        return 0.0
    if not (a.is_floating_point() or a.is_complex()):
        return math.inf
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(finite_a, finite_b):
        return math.inf
    both = finite_a & finite_b
    return float((a[both].double() - b[both].double()).abs().max()) if bool(both.any()) else 0.0


def _within(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> bool:
    """``allclose`` on the finite elements, and the same non-finite values elsewhere."""
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(a[~finite].nan_to_num(), b[~finite].nan_to_num()):
        return False
    return bool(torch.allclose(a[finite].double(), b[finite].double(), rtol=rtol, atol=atol))


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


def _diff(key: str, a: torch.Tensor | None, b: torch.Tensor | None, noise: float = 0.0) -> _Diff:
    if a is None or b is None:
        same = a is None and b is None
        return _Diff(key, 0.0 if same else math.inf, same, same, None if same else "one side is None")
    if a.shape != b.shape or a.dtype != b.dtype:
        found = f"{key}: planned {tuple(a.shape)} {a.dtype}, eager {tuple(b.shape)} {b.dtype}"
        return _Diff(key, math.inf, False, False, found)
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
    allowed = atol + NOISE_FACTOR * noise if math.isfinite(noise) else math.inf
    close = not nan_mismatch and (math.isinf(allowed) or bool(
        torch.allclose(a[finite].double(), b[finite].double(), rtol=rtol, atol=allowed)))
    return _Diff(key, max_abs, close, equal)


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


"""Remat in the user's own loop: mpplan ``apply`` against eager, HF gradient checkpointing and torch.compile.

Rerun: ``python scripts/bench_remat_peers.py`` (``--quick``: zoo_gpt only;
``--compile [CASE ...]``: also time the torch.compile rows, of every case or of those
named, minutes of compilation each).
Writes the ``remat_peers`` section of docs/benchmarks.md.

Every method trains the same seeded model with the user's loop:
``zero_grad(set_to_none=True)``, forward, ``default_loss`` (HF's own loss from
``labels``), ``backward``, ``torch.optim.Adam.step()``.  Per method: the peak over the
steps after the first (Adam makes its state in the first), measured on CPU by the
storage meter (every live tensor storage, the model, ``.grad`` and Adam's state
included) and on CUDA by ``max_memory_allocated``; the median step time; the ATen
calls one step makes (a ``TorchDispatchMode`` counts them, so a recompute shows as
extra calls; the profiler's ``record_function`` markers that ``optimizer.step()``
dispatches are not ATen calls and are not counted); and whether the losses and the final parameters match eager's.

The rows: eager; HF gradient checkpointing (``gradient_checkpointing_enable`` with
``use_reentrant=False``; for zoo_gpt, ``torch.utils.checkpoint`` around each block,
which is what HF does); torch.compile, default and at ``activation_memory_budget``
0.5 and 0.2; mpplan ``apply`` with a plan made by ``plan_for_apply`` for a budget of
each peer's measured peak (``grads: dynamic``; the remat pass's budget policy run on
the graph the user's loop runs, so ``apply``'s predicted peak fits), with the peak
``apply`` predicts beside the one measured.  Each mpplan row comes twice: with Adam
stepping at the end of the step, as the loop says, and with ``step in backward``
(``apply(..., step_in_backward=optimizer)``): the same optimizer updates each parameter
as soon as backward has made its gradient and the gradient is freed, so gradients and
the update's temporaries no longer pile up at the end and less recompute fits the
same budget.  ``least peak any recompute reaches``: each loop planned at its floor;
``no recompute, step in backward``: that loop as it comes.  On
CPU the storage meter cannot see inductor's buffers (its generated code allocates
outside the dispatcher), so the compile rows have no peak, and no mpplan row at
their peak.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from benchlib import human, log, stamp, table, torch_threads, write_section
from torch.utils._python_dispatch import TorchDispatchMode

from mpplan import zoo
from mpplan.capture.torch_capture import default_loss
from mpplan.config import Device
from mpplan.errors import InfeasibleError
from mpplan.planner import PlannerSettings
from mpplan.runtime import PlannedModule, apply, capture_for
from mpplan.runtime.apply_budget import plan_for_apply
from mpplan.runtime.devices import warm_up
from mpplan.runtime.recompute import module_calls
from mpplan.runtime.tracking import MeteringMode, StorageMeter
from mpplan.verify import verify

SECTION = "remat_peers"
STEPS = 3  # the first builds Adam's state; the peak and time are of the others
COMPILE_BUDGETS = (None, 0.5, 0.2)


@dataclass(frozen=True)
class Case:
    """A model to benchmark: how to build it, its inputs, and how HF-style checkpointing is switched on."""

    name: str
    label: str
    build: Callable[[], torch.nn.Module]
    inputs: Any
    checkpoint: Callable[[torch.nn.Module], torch.nn.Module]
    inputs_for: Callable[[int], Any]


@dataclass(frozen=True)
class Row:
    method: str
    peak: int | None
    step_s: float | None
    calls: float | None
    ok: str
    note: str = ""
    predicted: int | None = None


def _hf_checkpoint(model: torch.nn.Module) -> torch.nn.Module:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _block_checkpoint(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.utils.checkpoint`` around each block of the zoo GPT, as HF's checkpointing does per layer."""
    for block in model.blocks:
        forward = block.forward

        def checkpointed(x: torch.Tensor, _forward: Callable[..., torch.Tensor] = forward) -> torch.Tensor:
            return torch.utils.checkpoint.checkpoint(_forward, x, use_reentrant=False)

        block.forward = checkpointed
    return model


def cases(quick: bool, device: torch.device, gpt2_shape: tuple[int, int]) -> list[Case]:
    torch.manual_seed(0)
    found = [
        Case(
            "zoo_gpt",
            "zoo_gpt (configs/zoo_gpt.yaml: 4 layers, 128 wide, vocab 1024), batch 8 x 128",
            lambda: zoo.build("gpt", n_layers=4),
            zoo.example_inputs("gpt", batch=8, seq_len=128, vocab_size=1024),
            _block_checkpoint,
            lambda b: zoo.example_inputs("gpt", batch=b, seq_len=128, vocab_size=1024),
        )
    ]
    if not quick:
        batch, seq = gpt2_shape
        ids = torch.randint(0, 50257, (batch, seq))

        def gpt2_inputs(b: int, seq: int = seq) -> dict[str, torch.Tensor]:
            tokens = torch.randint(0, 50257, (b, seq))
            return {"input_ids": tokens, "labels": tokens}

        found.append(
            Case(
                "gpt2_small",
                f"GPT-2 small (GPT2LMHeadModel, default GPT2Config, random init), batch {batch} x {seq}, "
                "labels = inputs",
                lambda: zoo.build("gpt2", config_name="gpt2"),
                {"input_ids": ids, "labels": ids},
                _hf_checkpoint,
                gpt2_inputs,
            )
        )
    return found


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace != "profiler":  # optimizer.step()'s record_function markers
            self.calls += 1
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class Run:
    peak: int | None
    step_s: float
    calls: float | None
    losses: tuple[float, ...]
    state: dict[str, torch.Tensor]


def train(module: torch.nn.Module, inputs: Any, device: torch.device, *, meter: bool = True,
          step_in_backward: bool = False) -> Run:
    """``STEPS`` steps of the user's loop; peak, median time and calls of the steps after the first.

    ``step_in_backward``: ``module`` is a ``PlannedModule`` whose backward steps the loop's Adam.
    """
    inputs = _to(inputs, device)
    opt = torch.optim.Adam(module.parameters(), lr=1e-3)
    if step_in_backward:
        module.step_in_backward(opt)
    cuda = device.type == "cuda"
    storage = StorageMeter(str(device))
    storage.register([list(module.parameters()), list(module.buffers()), inputs], pinned=True)
    counter = _Calls()
    if cuda:
        warm_up(device)  # cuBLAS's workspaces would count in the first method's window and not the others'
    base = torch.cuda.memory_allocated(device) if cuda else 0
    times, losses = [], []
    for i in range(STEPS):
        if i == 1:
            storage.reset_peaks()
            counter.calls = 0
            if cuda:
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
        torch.manual_seed(1234 + i)
        start = time.perf_counter()
        if meter and not cuda:
            with MeteringMode(storage, device), counter:
                loss = _step(module, inputs, opt)
        else:  # on a GPU apply's first step probes its kernels' workspaces, which its prediction then holds
            probing = module.probing() if cuda and i == 0 and isinstance(module, PlannedModule) else nullcontext()
            with probing:
                loss = _step(module, inputs, opt)
        if cuda:
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
        losses.append(float(loss))
    storage.sample()
    if cuda:
        peak: int | None = torch.cuda.max_memory_allocated(device) - base
    else:
        peak = storage.peaks.get(str(device)) if meter else None
    state = {_plain(n): p.detach().to("cpu", copy=True) for n, p in module.named_parameters()}
    calls = counter.calls / (STEPS - 1) if meter and not cuda else None
    return Run(peak, statistics.median(times), calls, tuple(losses), state)


def _plain(name: str) -> str:
    """A parameter's name in the user's model (without a wrapper's ``module.`` or ``_orig_mod.``)."""
    for prefix in ("module.", "_orig_mod."):
        name = name.removeprefix(prefix)
    return name


def _step(module: torch.nn.Module, inputs: Any, opt: torch.optim.Optimizer) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    out = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    loss = default_loss(out)
    del out
    loss.backward()
    opt.step()
    return loss.detach()


def _to(inputs: Any, device: torch.device) -> Any:
    if isinstance(inputs, dict):
        return {k: v.to(device) for k, v in inputs.items()}
    return [v.to(device) for v in inputs]


def numerics(run: Run, eager: Run) -> str:
    """``ok`` when losses and final parameters match eager's (bit for bit: ``exact``), else the largest difference."""
    exact = run.losses == eager.losses and all(torch.equal(run.state[n], eager.state[n]) for n in eager.state)
    if exact:
        return "ok (exact)"
    diff = max(
        max(abs(a - b) for a, b in zip(run.losses, eager.losses)),
        max(float((run.state[n] - eager.state[n]).abs().max()) for n in eager.state),
    )
    return f"ok ({diff:.1e})" if diff <= 1e-4 else f"FAILED ({diff:.1e})"


def bench_case(case: Case, device: torch.device, compile_cases: list[str] | None) -> list[Row]:
    with_compile = compile_cases is not None and (not compile_cases or case.name in compile_cases)
    torch.manual_seed(0)
    model = case.build()
    fresh = lambda: copy.deepcopy(model).to(device)  # noqa: E731
    log(f"{case.name}: eager")
    eager = train(fresh(), case.inputs, device)
    rows = [Row("eager", eager.peak, eager.step_s, eager.calls, "reference")]
    log(f"{case.name}: HF gradient checkpointing")
    gc = train(case.checkpoint(fresh()), case.inputs, device)
    rows.append(
        Row("HF gradient checkpointing (use_reentrant=False)", gc.peak, gc.step_s, gc.calls, numerics(gc, eager))
    )
    peers = [("HF GC", gc.peak)]
    for budget in COMPILE_BUDGETS:
        name = "torch.compile" + ("" if budget is None else f", activation_memory_budget {budget}")
        if not with_compile:
            rows.append(Row(name, None, None, None, "-", "not run (pass --compile; minutes of compilation)"))
            continue
        log(f"{case.name}: {name}")
        run = _compiled(fresh(), case.inputs, device, budget)
        note = "" if device.type == "cuda" else (
            "peak: inductor's buffers bypass the storage meter; ATen calls: a dispatch mode makes the compiled "
            "step fall back to eager, so they cannot be counted the same way")
        rows.append(Row(name, run.peak, run.step_s, None, numerics(run, eager), note))
        if run.peak is not None:
            short = name.replace("torch.compile", "compile").replace("activation_memory_budget ", "amb ")
            peers.append((short, run.peak))
    log(f"{case.name}: capture")
    program = capture_for(model, case.inputs, device, mode="train", optimizer="adam", loss_fn=None)
    calls = module_calls(fresh(), _to(case.inputs, device))
    settings = PlannerSettings(placement="single", grads="dynamic", remat_time_limit_s=60.0)
    path = "foreach" if device.type == "cuda" else "single"
    for peer, peak in peers:
        assert peak is not None
        for in_backward in (False, True):
            name = f"mpplan apply, budget = {peer}'s peak ({human(peak)})" + (", step in backward" * in_backward)
            log(f"{case.name}: {name}")
            fitted, floor = _fit(program, settings, int(peak), calls, path, in_backward)
            rows.append(_mpplan_row(name, fitted.plan, case, fresh, device, eager, program, in_backward, floor))
    for in_backward in (False, True):  # the floor of each loop: what the step in backward lowers
        name = "mpplan apply, least peak any recompute reaches" + (", step in backward" * in_backward)
        log(f"{case.name}: {name}")
        fitted, _ = _fit(program, settings, 1, calls, path, in_backward)
        rows.append(_mpplan_row(name, fitted.plan, case, fresh, device, eager, program, in_backward, ""))
    name = "mpplan apply, no recompute, step in backward"
    log(f"{case.name}: {name}")
    fitted = plan_for_apply(program, [Device("dev", 1 << 40)], settings, None, calls=calls, optimizer_path=path,
                            step_in_backward=True)
    rows.append(_mpplan_row(name, fitted.plan, case, fresh, device, eager, program, True, ""))
    return rows


def _fit(program: Any, settings: PlannerSettings, budget: int, calls: Any, path: str,
         in_backward: bool) -> tuple[Any, str]:
    """``plan_for_apply`` at ``budget``; under what any recompute reaches, at that least peak (said in the note)."""
    device = [Device("dev", 1 << 40)]
    try:
        return plan_for_apply(program, device, settings, budget, calls=calls, optimizer_path=path,
                              step_in_backward=in_backward), ""
    except InfeasibleError as e:
        least = budget + e.missing_bytes
        for _ in range(3):  # the least peak of a refusal, planned again as a budget, may land a few bytes over
            try:
                fitted = plan_for_apply(program, device, settings, least, calls=calls, optimizer_path=path,
                                        step_in_backward=in_backward)
                break
            except InfeasibleError as again:
                least += again.missing_bytes
        else:
            raise e
        return fitted, f"budget {least - budget} bytes under the least peak any recompute reaches, planned at that; "


def _mpplan_row(name: str, planned: Any, case: Case, fresh: Callable[[], torch.nn.Module], device: torch.device,
                eager: Run, program: Any, in_backward: bool, note: str) -> Row:
    verify(program.graph, planned, check_capacity=False)
    wrapped = apply(fresh(), planned, case.inputs, optimizer="adam",
                    devices="virtual" if device.type == "cpu" else {"dev": str(device)})
    run = train(wrapped, case.inputs, device, step_in_backward=in_backward)
    predicted = wrapped.prediction().peak_bytes
    recomputes = len(wrapped.recompute_ops)
    note += f"{recomputes} ops recomputed" if recomputes else "no recompute"
    if in_backward:
        note += "; Adam steps per parameter in backward"
    if wrapped.hooks is not None and wrapped.hooks.mismatch:
        note += f"; MISMATCH {wrapped.hooks.mismatch}"
    return Row(name, run.peak, run.step_s, run.calls, numerics(run, eager), note, predicted)


def _compiled(module: torch.nn.Module, inputs: Any, device: torch.device, budget: float | None) -> Run:
    import torch._functorch.config as functorch_config

    saved = functorch_config.activation_memory_budget
    functorch_config.activation_memory_budget = 1.0 if budget is None else budget
    try:
        torch._dynamo.reset()
        return train(torch.compile(module), inputs, device, meter=False)
    finally:
        functorch_config.activation_memory_budget = saved


CAP = 8 << 30  # the per-process cap of the largest-batch columns (CUDA only)


def cuda_max_batch(case: Case, device: torch.device, limit: int = 256) -> list[tuple[str, int, float | None]]:
    """(method, largest batch that trains under ``CAP``, its tokens/s) for eager, HF GC and mpplan ``apply``.

    ``torch.cuda.set_per_process_memory_fraction`` makes the allocator refuse beyond
    the cap; eager and HF GC are probed by doubling then bisecting on OOM, mpplan by
    ``apply_budget.max_batch`` on the prediction (the cap less 3% for the allocator's
    rounding and the cuBLAS workspace), then trained to confirm.
    """
    import gc

    from mpplan.runtime.apply_budget import max_batch

    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, CAP / total), device)
    model = case.build()

    def tokens(inputs: Any) -> int:
        first = next(iter(inputs.values())) if isinstance(inputs, dict) else inputs[0]
        return int(first.numel())

    def attempt(make: Callable[[Any], torch.nn.Module], batch: int, in_backward: bool = False) -> float | None:
        inputs = case.inputs_for(batch)
        module = None
        try:
            module = make(inputs)
            run = train(module, inputs, device, meter=False, step_in_backward=in_backward)
            return tokens(inputs) / run.step_s
        except torch.OutOfMemoryError:
            return None
        finally:
            del module
            gc.collect()
            torch.cuda.empty_cache()

    def probe(make: Callable[[Any], torch.nn.Module]) -> tuple[int, float | None]:
        results: dict[int, float | None] = {}
        good, bad = 0, None
        batch = 1
        while batch <= limit and (rate := attempt(make, batch)) is not None:
            results[batch], good, batch = rate, batch, batch * 2
        bad = batch if batch <= limit else None
        while bad is not None and bad - good > 1:
            mid = (good + bad) // 2
            rate = attempt(make, mid)
            if rate is None:
                bad = mid
            else:
                results[mid], good = rate, mid
        return good, results.get(good)

    rows = []
    rows.append(("eager", *probe(lambda _: copy.deepcopy(model).to(device))))
    rows.append(("HF GC", *probe(lambda _: case.checkpoint(copy.deepcopy(model).to(device)))))
    programs: dict[int, Any] = {}

    def capture(batch: int) -> tuple[Any, int]:
        inputs = case.inputs_for(batch)
        program = capture_for(model, inputs, device, mode="train", optimizer="adam", loss_fn=None)
        programs[batch] = program
        return program, module_calls(copy.deepcopy(model).to(device), _to(inputs, device))

    settings = PlannerSettings(placement="single", grads="dynamic")
    for in_backward in (False, True):
        fit = max_batch(capture, [Device("dev", CAP)], settings, int(CAP * 0.97), optimizer_path="foreach",
                        limit=limit, step_in_backward=in_backward)
        planned = fit.result.plan
        rate = attempt(
            lambda inputs: apply(copy.deepcopy(model), planned, inputs, optimizer="adam", devices={"dev": str(device)}),
            fit.batch,
            in_backward,
        )
        name = "mpplan apply (max_batch" + (", step in backward)" if in_backward else ")")
        rows.append((name, fit.batch if rate is not None else 0, rate))
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    return rows


def render(case: Case, rows: list[Row]) -> str:
    eager = rows[0]
    body = []
    for r in rows:
        peak = human(r.peak) if r.peak is not None else "-"
        peak_ratio = f"{r.peak / eager.peak:.2f}" if r.peak is not None and eager.peak else "-"
        step = f"{r.step_s:.3f} s" if r.step_s is not None else "-"
        step_ratio = f"{r.step_s / eager.step_s:.2f}" if r.step_s is not None else "-"
        calls = f"{r.calls:.0f} ({r.calls / eager.calls:.2f})" if r.calls is not None and eager.calls else "-"
        predicted = "-"
        if r.predicted is not None and r.peak is not None:
            predicted = f"{human(r.predicted)} ({100 * (r.peak - r.predicted) / r.predicted:+.2f}%)"
        body.append([r.method, peak, peak_ratio, step, step_ratio, calls, r.ok, predicted, r.note])
    headers = ["method", "peak", "ratio to eager", "step", "ratio to eager", "ATen calls per step (ratio)",
               "numerics", "apply's predicted peak (measured vs it)", "note"]
    return f"### {case.label}\n\n" + table(headers, body)


def build(quick: bool, compile_cases: list[str] | None, device: torch.device, gpt2_shape: tuple[int, int]) -> str:
    command = "python scripts/bench_remat_peers.py" + (" --quick" if quick else "") + (
        "" if compile_cases is None else " ".join(["", "--compile", *compile_cases]))
    parts = [
        "## Remat in the user's loop: mpplan apply against HF gradient checkpointing and torch.compile",
        "",
        stamp(command),
        "",
        __doc__.split("\n\n", 2)[2].strip(),
        "",
    ]
    with torch_threads(1 if device.type == "cpu" else torch.get_num_threads()):
        for case in cases(quick, device, gpt2_shape):
            started = time.perf_counter()
            rows = bench_case(case, device, compile_cases)
            log(f"{case.name}: {time.perf_counter() - started:.0f}s")
            parts += [render(case, rows), ""]
            if device.type == "cuda":
                fits = cuda_max_batch(case, device)
                parts += [f"Largest batch under a {human(CAP)} cap, and its tokens/s:", "",
                          table(["method", "batch", "tokens/s"],
                                [[m, b, f"{r:.0f}" if r else "-"] for m, b, r in fits]), ""]
            else:
                parts += [f"Largest batch under a {human(CAP)} cap: CUDA only (the virtual device has no OOM); "
                          "`--device cuda` measures it.", ""]
    return "\n".join(parts)


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as ``cuda:0``: the allocator's per-process cap (``cuda_max_batch``) needs a device index."""
    return torch.device(device.type, 0) if device.type == "cuda" and device.index is None else device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="zoo_gpt only")
    parser.add_argument("--compile", nargs="*", metavar="CASE",
                        help="also run the torch.compile rows (of the cases named: zoo_gpt, gpt2_small; none: all)")
    parser.add_argument("--device", default="cpu", help="cpu (storage meter) or cuda (max_memory_allocated)")
    parser.add_argument("--gpt2-shape", default="2x256", help="GPT-2 small's batch x seq (8x512 on a GPU)")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    batch, seq = (int(v) for v in args.gpt2_shape.lower().split("x"))
    body = build(args.quick, args.compile, _indexed(torch.device(args.device)), (batch, seq))
    if args.no_write:
        print(body)
    else:
        write_section(SECTION, body)
        log(f"wrote the {SECTION} section of docs/benchmarks.md")


if __name__ == "__main__":
    main()

"""Placement: accelerate's ``infer_auto_device_map`` against mpplan's placement, inference on 4 and 8 devices.

Rerun: ``python scripts/bench_placement.py`` (``--quick``: 4 devices only).  Writes the
``placement`` section of docs/benchmarks.md.

Each model is built on the meta device from a transformers config (no download, no
weights) in float16 and captured on fake tensors.  accelerate places it the way its
docs do (``get_balanced_memory``, then ``infer_auto_device_map`` with the model's
no-split classes); both that map (``placement: manual``) and mpplan's own choice
(``placement: auto``) are then planned by the same planner on the same graph, so both
columns are predicted per-device peaks of one memory model: weights, activations,
cross-device copies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
from benchlib import human, log, rerun, section_main, stamp, table, timer

from mpplan.capture.torch_capture import capture
from mpplan.config import Device
from mpplan.graph import Graph
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan

DTYPE = torch.float16
HEADROOM = 1.3  # each device holds the weights' share times this


@dataclass(frozen=True)
class Model:
    """A model to place: its table label and a builder of (meta module, meta keyword inputs)."""

    label: str
    build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]


def tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.empty(batch, seq, dtype=torch.int64, device="meta")


def gpt2_medium() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from mpplan.zoo.gpt2 import gpt2

    return gpt2("gpt2-medium", device="meta").to(DTYPE), {"input_ids": tokens(1, 1024)}


def llama_7b() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, use_cache=False,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(DTYPE), {"input_ids": tokens(1, 2048)}


def t5_3b() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=32128, d_model=1024, d_kv=128, d_ff=16384, num_layers=24, num_decoder_layers=24, num_heads=32,
        use_cache=False,
    )
    with torch.device("meta"):
        model = T5ForConditionalGeneration(config).to(DTYPE)
    return model, {"input_ids": tokens(1, 512), "decoder_input_ids": tokens(1, 512)}


MODELS = (
    Model("GPT-2 medium (355M; 1x1024 tokens)", gpt2_medium),
    Model("7B decoder (LlamaConfig: 4096 hidden, 11008 MLP, 32 layers, 32 heads; 1x2048 tokens)", llama_7b),
    Model("T5-3B-like (d_model 1024, d_ff 16384, 24+24 layers, 32 heads; 1x512 -> 512 tokens)", t5_3b),
)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def accelerate_map(model: torch.nn.Module, capacity: int, count: int) -> dict[str, int | str]:
    """accelerate's device map for ``count`` GPUs of ``capacity`` bytes, balanced as its docs recommend."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    # accelerate warns once per device that no such GPU exists here: the map is computed all the same
    logging.getLogger("accelerate.utils.modeling").setLevel(logging.ERROR)
    no_split = getattr(model, "_no_split_modules", None) or []
    max_memory = {i: capacity for i in range(count)}
    balanced = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=DTYPE)
    return dict(infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split, dtype=DTYPE))


def row(label: str, devices: list[Device], method: str, planned: Plan, seconds: float) -> list[object]:
    peaks = [d.peak_bytes for d in planned.devices]
    used = len({planned.placement[op] for op in planned.schedule})
    spread = f"{max(peaks) / min(peaks):.2f}" if min(peaks) else "inf (an empty device)"
    fits = all(d.peak_bytes <= d.capacity_bytes for d in planned.devices)
    return [
        label, f"{len(devices)} x {human(devices[0].capacity)}", method,
        " / ".join(f"{p / 2**30:.2f}" for p in peaks), human(max(peaks)), spread, used,
        human(planned.cross_device_bytes), "yes" if fits else "**no**", f"{seconds:.1f}",
    ]


def compare(model: Model, module: torch.nn.Module, graph: Graph, count: int) -> list[list[object]]:
    """accelerate's map and mpplan's auto placement of one captured model on ``count`` devices."""
    capacity = int(weight_bytes(module) * HEADROOM / count)
    devices = [Device(f"cuda:{i}", capacity) for i in range(count)]
    with timer() as t_map:
        device_map = accelerate_map(module, capacity, count)
    offloaded = sorted(k for k, v in device_map.items() if not isinstance(v, int))
    if offloaded:
        raise RuntimeError(f"{model.label}: accelerate offloads {offloaded} on {count} devices: raise HEADROOM")
    manual = PlannerSettings(placement="manual", device_map={k: f"cuda:{v}" for k, v in device_map.items()})
    with timer() as t_manual:
        theirs = plan(graph, devices, manual)
    with timer() as t_auto:
        ours = plan(graph, devices, PlannerSettings(placement="auto"))
    log(f"  {count} devices: accelerate max {human(theirs.max_peak_bytes)}, mpplan max {human(ours.max_peak_bytes)}")
    return [
        row(model.label, devices, "accelerate", theirs, t_map[0] + t_manual[0]),
        row(model.label, devices, f"mpplan auto ({ours.settings['placement_chosen']})", ours, t_auto[0]),
    ]


def device_counts(quick: bool) -> tuple[int, ...]:
    return (4,) if quick else (4, 8)


def section(quick: bool) -> str:
    rows = []
    for model in MODELS:
        module, inputs = model.build()
        with timer() as t:
            graph = capture(module, inputs, mode="infer")
        log(f"placement: {model.label}: {len(graph.ops)} ops captured in {t[0]:.1f}s, {human(weight_bytes(module))}")
        for count in device_counts(quick):
            rows += compare(model, module, graph, count)
    return "\n\n".join(
        [
            "## Placement: accelerate's device_map against mpplan, inference",
            stamp(rerun("bench_placement.py", quick)),
            (
                "float16 models built on the meta device from their transformers configs, captured in "
                f"inference mode.  Each device holds the weights' share times {HEADROOM} (weights / n x "
                f"{HEADROOM}), so the model needs all of them.  `accelerate`: `get_balanced_memory` then "
                "`infer_auto_device_map` (the model's no-split classes), planned by mpplan as "
                "`placement: manual` with that `device_map`; `mpplan auto`: mpplan's own placement (the "
                "best of single, pipeline and shift; the one chosen in brackets).  Both are predicted by "
                "the same planner (schedule, liveness, offsets) on the same graph.  Per-device peaks in GiB; "
                "max/min: the largest device peak over the smallest; devices used: devices running at least "
                "one op; cross-device: bytes copied between devices per forward (tied weights used on two "
                "devices count too); s: seconds to place and plan."
            ),
            table(
                ["model", "devices", "placement", "per-device peak (GiB)", "max peak", "max/min", "devices used",
                 "cross-device", "fits", "s"],
                rows,
            ),
        ]
    )


def main() -> None:
    section_main("placement", section, __doc__)


if __name__ == "__main__":
    main()

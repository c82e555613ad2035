"""Placement: accelerate's ``infer_auto_device_map`` against mpplan's placement, and training plans over 2-4 devices.

Rerun: ``python scripts/bench_placement.py`` (``--quick``: 4 devices only, no GPT-2 small
training).  Writes the ``placement`` section of docs/benchmarks.md.

Each model is built on the meta device from a transformers config (no download, no
weights) and captured on fake tensors.  accelerate places it the way its
docs do (``get_balanced_memory``, then ``infer_auto_device_map`` with the model's
no-split classes); both that map (``placement: manual``) and mpplan's own choice
(``placement: auto``) are then planned by the same planner on the same graph, so both
columns are predicted per-device peaks of one memory model: weights, activations,
cross-device copies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from benchlib import SHARED_DATA, human, log, rerun, section_main, stamp, table, timer

from mpplan import sim
from mpplan.capture.torch_capture import capture
from mpplan.config import Device
from mpplan.graph import Graph
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan

HEADROOM = 1.3  # each device holds the weights' share times this
SHARE = 0.6  # training: each device holds this fraction of the single-device peak, so one cannot run the step


@dataclass(frozen=True)
class Model:
    """A model to place: its table label and a builder of (meta module, meta keyword inputs)."""

    label: str
    build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]
    capacity: int | None = None  # per device; None: the weights' share times HEADROOM


def tokens(batch: int, seq: int) -> torch.Tensor:
    return torch.empty(batch, seq, dtype=torch.int64, device="meta")


def gpt2_medium(seq: int) -> Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        from mpplan.zoo.gpt2 import gpt2

        return gpt2("gpt2-medium", device="meta"), {"input_ids": tokens(1, seq)}

    return build


def llama_7b() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, use_cache=False,
    )
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(torch.float16), {"input_ids": tokens(1, 2048)}


def t5_3b() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=32128, d_model=1024, d_kv=128, d_ff=16384, num_layers=24, num_decoder_layers=24, num_heads=32,
        use_cache=False,
    )
    with torch.device("meta"):
        model = T5ForConditionalGeneration(config).to(torch.float16)
    return model, {"input_ids": tokens(1, 512), "decoder_input_ids": tokens(1, 512)}


GIB = 1 << 30
LLAMA_7B = "7B decoder (LlamaConfig: 4096 hidden, 11008 MLP, 32 layers, 32 heads; fp16; 1x2048 tokens)"
MODELS = (
    Model("GPT-2 medium (355M; fp32; 1x1024 tokens)", gpt2_medium(1024)),
    Model("GPT-2 medium (355M; fp32; 1x128 tokens)", gpt2_medium(128)),
    Model(LLAMA_7B, llama_7b),
    Model(LLAMA_7B, llama_7b, capacity=24 * GIB),
    Model("T5-3B-like (d_model 1024, d_ff 16384, 24+24 layers, 32 heads; fp16; 1x512 -> 512 tokens)", t5_3b),
)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def dtype_of(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def accelerate_map(model: torch.nn.Module, capacity: int, count: int) -> dict[str, int | str]:
    """accelerate's device map for ``count`` GPUs of ``capacity`` bytes, balanced as its docs recommend."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    # accelerate warns once per device that no such GPU exists here: the map is computed all the same
    logging.getLogger("accelerate.utils.modeling").setLevel(logging.ERROR)
    no_split = getattr(model, "_no_split_modules", None) or []
    max_memory = {i: capacity for i in range(count)}
    dtype = dtype_of(model)
    balanced = get_balanced_memory(model, max_memory=max_memory, no_split_module_classes=no_split, dtype=dtype)
    return dict(infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split, dtype=dtype))


def spread(values: list[int]) -> str:
    """max/min of per-device bytes (an empty device makes it infinite)."""
    return f"{max(values) / min(values):.2f}" if min(values) else "inf (an empty device)"


def row(label: str, devices: list[Device], method: str, planned: Plan, seconds: float) -> list[object]:
    peaks = [d.peak_bytes for d in planned.devices]
    weights = [d.static_bytes for d in planned.devices]
    used = len({planned.placement[op] for op in planned.schedule})
    fits = all(d.peak_bytes <= d.capacity_bytes for d in planned.devices)
    return [
        label, f"{len(devices)} x {human(devices[0].capacity)}", method,
        " / ".join(f"{p / 2**30:.2f}" for p in peaks), human(max(peaks)), spread(peaks), spread(weights), used,
        human(planned.cross_device_bytes), "yes" if fits else "**no**", f"{seconds:.1f}",
    ]


def compare(model: Model, module: torch.nn.Module, graph: Graph, count: int) -> list[list[object]]:
    """accelerate's map and mpplan's auto placement of one captured model on ``count`` devices."""
    capacity = model.capacity or int(weight_bytes(module) * HEADROOM / count)
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


def device_counts(model: Model, quick: bool) -> tuple[int, ...]:
    if model.capacity:
        return (8,)
    return (4,) if quick else (4, 8)


def inference_rows(quick: bool) -> list[list[object]]:
    rows = []
    for model in MODELS:
        module, inputs = model.build()
        with timer() as t:
            graph = capture(module, inputs, mode="infer")
        log(f"placement: {model.label}: {len(graph.ops)} ops captured in {t[0]:.1f}s, {human(weight_bytes(module))}")
        for count in device_counts(model, quick):
            rows += compare(model, module, graph, count)
    return rows


def training_graphs(quick: bool) -> Iterator[tuple[str, Graph]]:
    """Captured training steps (Adam) at a batch one device of the table cannot hold."""
    from mpplan.zoo.transformer import example_inputs, gpt

    yield "zoo GPT (4 layers, d 128; train, adam, 32x128)", capture(
        gpt(n_layers=4, device="meta"), example_inputs(batch=32, seq_len=128, device="meta"), mode="train",
        optimizer="adam",
    )
    if not quick:
        from mpplan.zoo.gpt2 import gpt2

        yield "GPT-2 small (train, adam, 8x512)", capture(
            gpt2("gpt2", device="meta"), {"input_ids": tokens(8, 512)}, mode="train", optimizer="adam"
        )


def checkmate_graphs() -> Iterator[tuple[str, Graph]]:
    from mpplan.capture.graph_file import load_graph

    for path in sorted(SHARED_DATA.glob("*_train_nx.json")):
        yield path.stem, load_graph(path)


def spread_row(label: str, graph: Graph, share: float, count: int) -> list[object]:
    """mpplan auto on ``count`` devices each holding ``share`` of the single-device peak."""
    single = plan(graph, [Device("cuda:0", 1 << 62)]).max_peak_bytes
    largest_op = sim.max_op_working_set(graph)
    capacity = int(single * share)
    devices = [Device(f"cuda:{i}", capacity) for i in range(count)]
    with timer() as t:
        planned = plan(graph, devices, PlannerSettings(placement="auto"))
    peaks = [d.peak_bytes for d in planned.devices]
    fits = max(peaks) <= capacity
    log(f"  {label} on {count}: max {human(max(peaks))} of {human(capacity)}, {t[0]:.1f}s")
    return [
        label, human(single), human(largest_op), f"{count} x {human(capacity)}", planned.settings["placement_chosen"],
        " / ".join(human(p) for p in peaks), f"{max(peaks) / (sum(peaks) / len(peaks)):.3f}",
        human(planned.cross_device_bytes), "yes" if fits else "**no**", f"{t[0]:.1f}",
    ]


def training_rows(quick: bool) -> list[list[object]]:
    graphs = [*training_graphs(quick), *checkmate_graphs()]
    return [spread_row(label, graph, SHARE, count) for label, graph in graphs for count in (2, 4)]


def section(quick: bool) -> str:
    inference = inference_rows(quick)
    training = training_rows(quick)
    return "\n\n".join(
        [
            "## Placement: accelerate's device_map against mpplan, inference",
            stamp(rerun("bench_placement.py", quick)),
            (
                "Models built on the meta device from their transformers configs, captured in "
                f"inference mode.  Each device holds the weights' share times {HEADROOM} (weights / n x "
                f"{HEADROOM}), so the model needs all of them, except the 7B row on 8 x 24 GiB.  "
                "`accelerate`: `get_balanced_memory` then "
                "`infer_auto_device_map` (the model's no-split classes), planned by mpplan as "
                "`placement: manual` with that `device_map`; `mpplan auto`: mpplan's own placement (the "
                "best of single, pipeline and shift; the one chosen in brackets).  Both are predicted by "
                "the same planner (schedule, liveness, offsets) on the same graph.  Per-device peaks in GiB; "
                "max/min: the largest device peak over the smallest; weights max/min: the same for the "
                "weights (static bytes) each device holds; devices used: devices running at least "
                "one op; cross-device: bytes copied between devices per forward (tied weights used on two "
                "devices count too); s: seconds to place and plan."
            ),
            table(
                ["model", "devices", "placement", "per-device peak (GiB)", "max peak", "max/min", "weights max/min",
                 "devices used", "cross-device", "fits", "s"],
                inference,
            ),
            f"### Training over 2 and 4 devices of {SHARE} x the single-device peak",
            (
                "mpplan `placement: auto` (the best of single, pipeline and shift that fits) of captured "
                "training steps and of the Checkmate training graphs (node-link files of `../shared/data`).  "
                f"Each device holds {SHARE} x the single-device peak, so no one device can run the step; "
                "the same devices, two or four of them.  `largest op`: the most dynamic bytes one op touches "
                "(its inputs and outputs), which every placement that does not split ops must hold on one "
                "device: where it exceeds the capacity, no placement fits (VGG's first convolutions).  "
                "max/mean: the largest device peak over the mean; s: seconds to place and plan."
            ),
            table(
                ["graph", "one device", "largest op", "devices", "placement", "per-device peak", "max/mean",
                 "cross-device", "fits", "s"],
                training,
            ),
        ]
    )


def main() -> None:
    section_main("placement", section, __doc__)


if __name__ == "__main__":
    main()

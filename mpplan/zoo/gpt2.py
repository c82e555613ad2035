"""Hugging Face GPT-2 built from hard-coded configs: no download, no network.

``gpt2("gpt2-medium", n_layer=4)`` builds ``transformers.GPT2LMHeadModel`` from the
published architecture of the named checkpoint with any ``GPT2Config`` field
overridden; weights are freshly initialised (or absent with ``device="meta"``, the
way to capture the 1.5B ``gpt2-xl`` without allocating 6 GB).  The KV cache is off
by default (``use_cache=False``) since neither training nor a planned forward needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from mpplan.zoo import device_scope

__all__ = ["CONFIGS", "example_inputs", "gpt2"]

#: Architecture of each released GPT-2 checkpoint (the fields that differ from GPT2Config's defaults).
CONFIGS: Mapping[str, Mapping[str, int]] = MappingProxyType(
    {
        "gpt2": MappingProxyType({"n_layer": 12, "n_head": 12, "n_embd": 768}),
        "gpt2-medium": MappingProxyType({"n_layer": 24, "n_head": 16, "n_embd": 1024}),
        "gpt2-large": MappingProxyType({"n_layer": 36, "n_head": 20, "n_embd": 1280}),
        "gpt2-xl": MappingProxyType({"n_layer": 48, "n_head": 25, "n_embd": 1600}),
    }
)
_COMMON: Mapping[str, Any] = MappingProxyType({"vocab_size": 50257, "n_positions": 1024, "use_cache": False})


def gpt2(
    config_name: str = "gpt2", *, device: str | None = None, attn_implementation: str = "sdpa", **overrides: Any
) -> torch.nn.Module:
    """A ``GPT2LMHeadModel`` for ``config_name`` with ``overrides`` applied to its ``GPT2Config``.

    ``attn_implementation`` is ``"sdpa"`` or ``"eager"`` (which materialises the
    attention matrix).  Raises ``ImportError`` naming the fix when transformers is
    missing and ``ValueError`` for an unknown config name.
    """
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        raise ImportError("mpplan.zoo.gpt2 needs Hugging Face transformers: pip install 'mpplan[hf]'") from e
    if config_name not in CONFIGS:
        raise ValueError(f"gpt2: unknown config_name {config_name!r}; expected one of {', '.join(CONFIGS)}")
    fields: dict[str, Any] = {
        **_COMMON,
        **CONFIGS[config_name],
        **overrides,
        "attn_implementation": attn_implementation,
    }
    config = GPT2Config(**fields)
    with device_scope(device):
        return GPT2LMHeadModel(config)


def example_inputs(
    batch: int = 4, seq_len: int = 512, vocab_size: int = 50257, *, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Keyword inputs ``{"input_ids": (batch, seq_len) int64}`` for ``capture``."""
    return {"input_ids": torch.randint(0, vocab_size, (batch, seq_len), device=device)}

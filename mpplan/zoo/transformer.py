"""A small GPT-style decoder in plain PyTorch.

Token and position embeddings, ``n_layers`` pre-LayerNorm blocks of causal
self-attention and a 4x GELU MLP, a final LayerNorm and a language-model head whose
weight is tied to the token embedding unless ``tie_weights=False``.  Attention uses
``F.scaled_dot_product_attention(is_causal=True)`` or, with ``attention="math"``,
the explicit ``softmax(QK^T / sqrt(d)) V`` that materialises the score matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mpplan.zoo import device_scope

__all__ = ["GPT", "Block", "CausalSelfAttention", "example_inputs", "gpt"]

ATTENTION = ("sdpa", "math")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, d_model: int, n_heads: int, dropout: float, attention: str) -> None:
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.n_heads = n_heads
        self.dropout = dropout
        self.attention = attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for y in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            weights = F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), self.dropout, self.training)
            y = weights @ v
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, c))  # nn.Module calls are typed Any
        return out


class Block(nn.Module):
    """Pre-LayerNorm residual block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, dropout: float, attention: str) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, attention)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(),
            nn.Linear(mlp_ratio * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """A decoder-only language model returning logits of shape ``(batch, seq, vocab_size)``."""

    def __init__(
        self,
        vocab_size: int = 1024,
        max_seq_len: int = 128,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        mlp_ratio: int = 4,
        *,
        dropout: float = 0.0,
        tie_weights: bool = True,
        attention: str = "sdpa",
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"GPT: d_model must be divisible by n_heads, got d_model={d_model}, n_heads={n_heads}")
        if attention not in ATTENTION:
            raise ValueError(f"GPT: attention must be one of {', '.join(ATTENTION)}, got {attention!r}")
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, mlp_ratio, dropout, attention) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight
        self.max_seq_len = max_seq_len

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.max_seq_len:
            raise ValueError(f"GPT: sequence length {t} exceeds max_seq_len {self.max_seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


def gpt(
    vocab_size: int = 1024,
    max_seq_len: int = 128,
    d_model: int = 128,
    n_heads: int = 4,
    n_layers: int = 2,
    mlp_ratio: int = 4,
    *,
    dropout: float = 0.0,
    tie_weights: bool = True,
    attention: str = "sdpa",
    device: str | None = None,
) -> GPT:
    """Build a ``GPT`` on ``device`` (default: the ambient device); ``"meta"`` allocates nothing."""
    with device_scope(device):
        return GPT(
            vocab_size,
            max_seq_len,
            d_model,
            n_heads,
            n_layers,
            mlp_ratio,
            dropout=dropout,
            tie_weights=tie_weights,
            attention=attention,
        )


def example_inputs(
    batch: int = 8, seq_len: int = 128, vocab_size: int = 1024, *, device: str = "cpu"
) -> tuple[torch.Tensor]:
    """Random token ids of shape ``(batch, seq_len)`` below ``vocab_size``."""
    return (torch.randint(0, vocab_size, (batch, seq_len), device=device),)

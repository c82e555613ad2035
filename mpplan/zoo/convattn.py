"""A small conv + attention + skip-connection network: the held-out style of model.

Neither a pure CNN nor a pure transformer: a conv stem, then ``stages`` stages that
each run a residual conv block (two 3x3 conv-GroupNorm layers around an identity
skip), downsample by a strided conv that doubles the channels, and run multi-head
self-attention over the smaller feature map's pixels with its own skip
(``x + attn(norm(x))``); a long skip from the stem's output, pooled to the last
stage's size, is added before the head.  Attention runs after downsampling, as in
hybrid vision models, so its score matrices (pixels squared) stay comparable to the
convolutions' activations rather than dwarfing them.
Trained with Adam (``optimizer: adam`` in a config), it mixes what the planner sees
in CNNs (large early activations) with attention's score matrices and skips that
keep tensors alive across many ops, which is why the peak benchmark holds it out
against eager PyTorch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mpplan.zoo import device_scope

__all__ = ["ConvAttention", "ConvBlock", "PixelAttention", "convattn", "example_inputs"]


class ConvBlock(nn.Module):
    """``relu(x + gn(conv(relu(gn(conv(x))))))``: a residual pair of 3x3 convolutions."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(x + self.norm2(self.conv2(out)))


class PixelAttention(nn.Module):
    """Self-attention over the pixels of a feature map, with a pre-norm skip: ``x + proj(attn(norm(x)))``."""

    def __init__(self, channels: int, n_heads: int, groups: int) -> None:
        super().__init__()
        if channels % n_heads:
            raise ValueError(f"PixelAttention: expected channels divisible by n_heads, got {channels}, {n_heads}")
        self.norm = nn.GroupNorm(groups, channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)
        self.n_heads = n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.n_heads, c // self.n_heads, h * w).unbind(1)
        y = F.scaled_dot_product_attention(q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1))
        out: torch.Tensor = x + self.proj(y.transpose(-2, -1).reshape(b, c, h, w))  # nn.Module calls are typed Any
        return out


class ConvAttention(nn.Module):
    """Stem, ``stages`` x (conv block, strided downsampling, pixel attention), a long skip, pooling, ``fc``."""

    def __init__(
        self,
        stages: int = 2,
        width: int = 32,
        n_heads: int = 4,
        groups: int = 8,
        in_channels: int = 3,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        if stages < 1 or width < 1:
            raise ValueError(f"ConvAttention: expected stages >= 1 and width >= 1, got {stages}, {width}")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.GroupNorm(groups, width))
        blocks: list[nn.Module] = []
        channels = width
        for _ in range(stages):
            blocks.append(ConvBlock(channels, groups))
            blocks.append(nn.Conv2d(channels, 2 * channels, 3, stride=2, padding=1))
            channels *= 2
            blocks.append(PixelAttention(channels, n_heads, groups))
        self.blocks = nn.Sequential(*blocks)
        self.skip = nn.Conv2d(width, channels, 1)  # the long skip: stem features to the last stage's width
        self.fc = nn.Linear(channels, num_classes)
        self.downsample = 2**stages

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stem = F.relu(self.stem(x))
        out = self.blocks(stem)
        out = out + self.skip(F.avg_pool2d(stem, self.downsample))
        logits: torch.Tensor = self.fc(out.mean(dim=(2, 3)))
        return logits


def convattn(
    stages: int = 2,
    width: int = 32,
    n_heads: int = 4,
    groups: int = 8,
    in_channels: int = 3,
    num_classes: int = 10,
    *,
    device: str | None = None,
) -> ConvAttention:
    """Build a ``ConvAttention`` on ``device`` (default: the ambient device); ``"meta"`` allocates nothing."""
    with device_scope(device):
        return ConvAttention(stages, width, n_heads, groups, in_channels, num_classes)


def example_inputs(
    batch: int = 8, image_size: int = 16, in_channels: int = 3, *, device: str = "cpu"
) -> tuple[torch.Tensor]:
    """A ``(batch, in_channels, image_size, image_size)`` float32 image batch."""
    return (torch.randn(batch, in_channels, image_size, image_size, device=device),)

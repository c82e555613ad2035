"""A ResNet-style CNN: conv-bn-relu stem, residual basic blocks, global pooling, a linear head.

Depth and width are configurable: ``stages`` basic blocks per stage and ``width``
channels in the first stage, doubling (with stride 2) at each later stage, as in
ResNet-18/34 (``resnet(blocks=(2, 2, 2, 2), width=64)`` is ResNet-18's layout).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from mpplan.zoo import device_scope

__all__ = ["BasicBlock", "ResNet", "example_inputs", "resnet"]


def _conv_bn(cin: int, cout: int, kernel: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout)
    )


class BasicBlock(nn.Module):
    """Two 3x3 conv-bn layers with an identity (or 1x1 conv-bn projection) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = _conv_bn(cin, cout, 3, stride)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv_bn(cout, cout, 3, 1)
        self.shortcut = _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.conv1(x))
        out = self.conv2(out)
        y: torch.Tensor = self.relu(out + self.shortcut(x))  # nn.Module calls are typed Any
        return y


class ResNet(nn.Module):
    """Stem, ``len(blocks)`` stages of basic blocks, adaptive average pooling and ``fc``."""

    def __init__(
        self, blocks: Sequence[int] = (2, 2, 2), width: int = 16, in_channels: int = 3, num_classes: int = 10
    ) -> None:
        super().__init__()
        if not blocks or min(blocks) < 1 or width < 1:
            raise ValueError(
                f"ResNet: expected at least one stage of >= 1 blocks and width >= 1, got {blocks}, {width}"
            )
        self.stem = nn.Sequential(_conv_bn(in_channels, width, 3, 1), nn.ReLU(inplace=True))
        stages: list[nn.Module] = []
        cin = width
        for i, n in enumerate(blocks):
            cout = width * 2**i
            layers = [BasicBlock(cin if j == 0 else cout, cout, 2 if (i > 0 and j == 0) else 1) for j in range(n)]
            stages.append(nn.Sequential(*layers))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        self.in_channels = in_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        logits: torch.Tensor = self.fc(torch.flatten(self.pool(x), 1))
        return logits


def resnet(
    blocks: Sequence[int] = (2, 2, 2),
    width: int = 16,
    in_channels: int = 3,
    num_classes: int = 10,
    *,
    device: str | None = None,
) -> ResNet:
    """Build a ``ResNet`` on ``device`` (default: the ambient device); ``"meta"`` allocates nothing."""
    with device_scope(device):
        return ResNet(tuple(blocks), width, in_channels, num_classes)


def example_inputs(
    batch: int = 8, image_size: int = 32, in_channels: int = 3, *, device: str = "cpu"
) -> tuple[torch.Tensor]:
    """A ``(batch, in_channels, image_size, image_size)`` float32 image batch."""
    return (torch.randn(batch, in_channels, image_size, image_size, device=device),)

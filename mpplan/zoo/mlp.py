"""A plain multi-layer perceptron: small enough to check captured byte counts by hand.

``MLP(in_features, hidden, out_features, layers)`` is ``layers`` ``nn.Linear`` layers
with a ReLU between consecutive ones: ``in -> hidden -> ... -> hidden -> out``.  With
``layers=1`` it is a single ``Linear(in, out)``.
"""

from __future__ import annotations

import torch
from torch import nn

from mpplan.zoo import device_scope

__all__ = ["MLP", "example_inputs", "mlp"]


class MLP(nn.Module):
    """``layers`` Linear layers (``net.0``, ``net.2``, ...) with ReLUs between them."""

    def __init__(
        self, in_features: int, hidden: int, out_features: int, layers: int = 2, *, inplace_relu: bool = False
    ) -> None:
        super().__init__()
        if min(in_features, hidden, out_features, layers) < 1:
            raise ValueError(
                f"MLP: expected positive sizes and layers >= 1, got in_features={in_features}, hidden={hidden}, "
                f"out_features={out_features}, layers={layers}"
            )
        widths = [in_features] + [hidden] * (layers - 1) + [out_features]
        modules: list[nn.Module] = []
        for i in range(layers):
            if i:
                modules.append(nn.ReLU(inplace=inplace_relu))
            modules.append(nn.Linear(widths[i], widths[i + 1]))
        self.net = nn.Sequential(*modules)
        self.in_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.net(x)  # nn.Module calls are typed Any
        return y


def mlp(
    in_features: int = 64,
    hidden: int = 256,
    out_features: int = 10,
    layers: int = 3,
    *,
    inplace_relu: bool = False,
    device: str | None = None,
) -> MLP:
    """Build an ``MLP`` on ``device`` (default: the ambient device); ``"meta"`` allocates nothing."""
    with device_scope(device):
        return MLP(in_features, hidden, out_features, layers, inplace_relu=inplace_relu)


def example_inputs(batch: int = 8, in_features: int = 64, *, device: str = "cpu") -> tuple[torch.Tensor]:
    """A ``(batch, in_features)`` float32 input, as the positional-argument tuple ``capture`` takes."""
    return (torch.randn(batch, in_features, device=device),)

"""Layers the model-shaped generators share: each adds a module's forward ops to a ``Builder``.

Parameters are named ``<module>.weight`` and ``<module>.bias``, as in ``torch.nn``; FLOPs count
two per multiply-add, so costs follow the roofline model.
"""

from __future__ import annotations

import math

from mpplan.capture.synthetic.builder import Builder


def linear(b: Builder, name: str, x: str, fin: int, fout: int, *, bias: bool = True) -> str:
    """``torch.nn.Linear(fin, fout)`` on ``x``'s last dimension; its backward reads ``x`` and the weight."""
    shape = b.tensors[x].shape
    assert shape is not None
    rows = math.prod(shape[:-1])
    params = [b.param(f"{name}.weight", (fout, fin), module=name)]
    if bias:
        params.append(b.param(f"{name}.bias", (fout,), module=name))
    return b.compute(
        name,
        "Linear",
        [x, *params],
        (*shape[:-1], fout),
        module=name,
        flops=2 * rows * fin * fout,
        saved=[x, params[0]],
    )


def conv(b: Builder, name: str, x: str, cin: int, cout: int, k: int, stride: int, size: int) -> tuple[str, int]:
    """A ``k x k`` conv without bias, padded so the side becomes ``size // stride``; returns it and that side."""
    batch = b.tensors[x].shape[0]  # type: ignore[index]
    out = max(1, size // stride)
    weight = b.param(f"{name}.weight", (cout, cin, k, k), module=name)
    flops = 2 * batch * out * out * cout * cin * k * k
    return b.compute(name, "Conv2d", [x, weight], (batch, cout, out, out), module=name, flops=flops), out


def batchnorm(b: Builder, name: str, x: str, channels: int) -> str:
    """``BatchNorm2d`` (running stats not modelled); its backward reads ``x`` and the weight."""
    weight = b.param(f"{name}.weight", (channels,), module=name)
    bias = b.param(f"{name}.bias", (channels,), module=name)
    shape = b.tensors[x].shape
    return b.compute(name, "BatchNorm2d", [x, weight, bias], shape, module=name, saved=[x, weight])


def layernorm(b: Builder, name: str, x: str, hidden: int) -> str:
    """``LayerNorm`` over the last dimension; its backward reads ``x`` and the weight."""
    weight = b.param(f"{name}.weight", (hidden,), module=name)
    bias = b.param(f"{name}.bias", (hidden,), module=name)
    shape = b.tensors[x].shape
    return b.compute(name, "LayerNorm", [x, weight, bias], shape, module=name, saved=[x, weight])


def relu(b: Builder, name: str, x: str) -> str:
    """An in-place ReLU, as torchvision uses it."""
    return b.inplace(name, "ReLU", x, module=name)


def double_conv(b: Builder, prefix: str, x: str, cin: int, cout: int, size: int) -> str:
    """The U-Net's double conv: two 3x3 convs, each followed by an in-place ReLU."""
    h, _ = conv(b, f"{prefix}.conv1", x, cin, cout, 3, 1, size)
    h = relu(b, f"{prefix}.relu1", h)
    h, _ = conv(b, f"{prefix}.conv2", h, cout, cout, 3, 1, size)
    return relu(b, f"{prefix}.relu2", h)


def down(size: int) -> int:
    """The side after a stride-2 pool, at least 1."""
    return max(1, size // 2)

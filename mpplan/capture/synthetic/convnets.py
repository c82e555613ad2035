"""Convolutional families: a torchvision-style ResNet and a U-Net with long-lived skip activations."""

from __future__ import annotations

from mpplan.capture.synthetic.arguments import check_common, positive
from mpplan.capture.synthetic.builder import Builder
from mpplan.capture.synthetic.layers import batchnorm, conv, double_conv, down, linear, relu
from mpplan.graph import Graph


def residual_cnn(
    blocks: int,
    *,
    batch: int = 32,
    channels: int = 64,
    image: int = 224,
    classes: int = 1000,
    stages: int = 4,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """A ResNet of ``blocks`` basic blocks spread evenly over ``stages`` stages.

    Stem: 7x7 conv (stride 2), batch norm, in-place ReLU, 3x3 max pool (stride 2).
    Stage ``s`` works at ``channels * 2**s`` channels and half the previous
    resolution; its first block downsamples through a 1x1 conv shortcut.  Block:
    conv, bn, ReLU, conv, bn, add the shortcut, ReLU (both ReLUs in place).  Head:
    global average pool, a flatten view, a Linear to ``classes`` logits, and in
    train mode a cross-entropy loss.  Module paths follow torchvision
    (``layer2.0.conv1``, ``layer2.0.downsample.0``).
    """
    check_common("residual_cnn", dtype, train, optimizer, seed, name)
    positive(
        "residual_cnn", blocks=blocks, batch=batch, channels=channels, image=image, classes=classes, stages=stages
    )
    b = Builder(dtype, seed, train)
    size = image
    x = b.input("x", (batch, 3, size, size))
    h, size = conv(b, "conv1", x, 3, channels, 7, 2, size)
    h = batchnorm(b, "bn1", h, channels)
    h = relu(b, "relu", h)
    h = b.compute("maxpool", "MaxPool2d", [h], (batch, channels, down(size), down(size)), module="maxpool")
    size = down(size)
    cin = channels
    per_stage = [blocks // stages + (1 if s < blocks % stages else 0) for s in range(stages)]
    for s, count in enumerate(per_stage):
        cout = channels * 2**s
        for j in range(count):
            p = f"layer{s + 1}.{j}"
            stride = 2 if j == 0 and s > 0 else 1
            shortcut = h
            y, out_size = conv(b, f"{p}.conv1", h, cin, cout, 3, stride, size)
            y = relu(b, f"{p}.relu1", batchnorm(b, f"{p}.bn1", y, cout))
            y, _ = conv(b, f"{p}.conv2", y, cout, cout, 3, 1, out_size)
            y = batchnorm(b, f"{p}.bn2", y, cout)
            if stride != 1 or cin != cout:
                shortcut, _ = conv(b, f"{p}.downsample.0", h, cin, cout, 1, stride, size)
                shortcut = batchnorm(b, f"{p}.downsample.1", shortcut, cout)
            h = relu(b, f"{p}.relu2", b.add(f"{p}.add", y, shortcut, module=p))
            cin, size = cout, out_size
    pooled = b.compute("avgpool", "AdaptiveAvgPool2d", [h], (batch, cin, 1, 1), module="avgpool")
    (flat,) = b.view("flatten", "Flatten", pooled, [("flatten", (batch, cin))], module="flatten")
    logits = linear(b, "fc", flat, cin, classes)
    if train:
        b.loss("CrossEntropyLoss", [logits, b.input("labels", (batch,), "int64")])
    return b.graph(name or f"residual_cnn{blocks}", logits, optimizer=optimizer)

def unet(
    depth: int,
    *,
    batch: int = 4,
    channels: int = 64,
    image: int = 256,
    classes: int = 2,
    max_channels: int = 1024,
    dtype: str = "float32",
    train: bool = False,
    optimizer: str | None = None,
    seed: int | None = None,
    name: str | None = None,
) -> Graph:
    """A U-Net with ``depth`` down- and up-sampling levels.

    Level ``l`` works at ``min(channels * 2**l, max_channels)`` channels and
    ``image / 2**l`` pixels a side (at least 1).  Encoder level: two 3x3 conv +
    in-place ReLU (``down.<l>.conv1``, ...), then a 2x2 max pool; the bottleneck
    (``mid``) is a double conv; decoder level: a 2x2 transposed conv
    (``up.<l>.upconv``), a concat with the encoder's skip activation
    (``up.<l>.cat``), and a double conv.  Head: a 1x1 conv to ``classes`` and in
    train mode a per-pixel cross-entropy loss.
    """
    check_common("unet", dtype, train, optimizer, seed, name)
    positive(
        "unet", depth=depth, batch=batch, channels=channels, image=image, classes=classes, max_channels=max_channels
    )
    b = Builder(dtype, seed, train)

    def width(level: int) -> int:
        return min(channels << min(level, 32), max_channels)

    def side(level: int) -> int:
        return max(1, image >> min(level, 62))

    h = b.input("x", (batch, 3, image, image))
    cin = 3
    skips = []
    for level in range(depth + 1):
        p = "mid" if level == depth else f"down.{level}"
        h = double_conv(b, p, h, cin, width(level), side(level))
        cin = width(level)
        if level < depth:
            skips.append(h)
            shape = (batch, cin, side(level + 1), side(level + 1))
            h = b.compute(f"{p}.pool", "MaxPool2d", [h], shape, module=f"{p}.pool")
    for level in reversed(range(depth)):
        p = f"up.{level}"
        c, s = width(level), side(level)
        weight = b.param(f"{p}.upconv.weight", (cin, c, 2, 2), module=f"{p}.upconv")
        flops = 2 * batch * s * s * c * cin
        h = b.compute(
            f"{p}.upconv", "ConvTranspose2d", [h, weight], (batch, c, s, s), module=f"{p}.upconv", flops=flops
        )
        h = b.compute(f"{p}.cat", "Cat", [h, skips[level]], (batch, 2 * c, s, s), module=p, saved=[], grad_view=True)
        h = double_conv(b, p, h, 2 * c, c, s)
        cin = c
    logits, _ = conv(b, "head", h, cin, classes, 1, 1, image)
    if train:
        b.loss("CrossEntropyLoss", [logits, b.input("labels", (batch, image, image), "int64")])
    return b.graph(name or f"unet{depth}", logits, optimizer=optimizer)

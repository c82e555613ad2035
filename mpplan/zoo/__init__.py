"""Ready-made models for examples, tests and benchmarks, in plain PyTorch (GPT-2 via transformers).

Each zoo module has a factory and an ``example_inputs(batch=..., ...)`` builder, both
named by ``"module:attribute"`` strings a YAML config can hold::

    model:  {factory: "mpplan.zoo.mlp:mlp", kwargs: {hidden: 512}}
    inputs: {factory: "mpplan.zoo.mlp:example_inputs", kwargs: {batch: 32}}

``ZOO`` maps a short name to those two strings; ``build(name, **kwargs)`` and
``example_inputs(name, batch=..., **kwargs)`` resolve them.  Nothing is imported
until asked for, so listing the zoo never imports transformers.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["ZOO", "ZooEntry", "build", "device_scope", "example_inputs", "resolve"]


@dataclass(frozen=True, slots=True)
class ZooEntry:
    """A zoo model: its factory and example-input builder as ``"module:attribute"`` strings."""

    factory: str
    inputs: str
    description: str


ZOO: Mapping[str, ZooEntry] = MappingProxyType(
    {
        "mlp": ZooEntry("mpplan.zoo.mlp:mlp", "mpplan.zoo.mlp:example_inputs", "Linear+ReLU stack"),
        "resnet": ZooEntry("mpplan.zoo.cnn:resnet", "mpplan.zoo.cnn:example_inputs", "ResNet-style CNN"),
        "gpt": ZooEntry("mpplan.zoo.transformer:gpt", "mpplan.zoo.transformer:example_inputs", "small GPT decoder"),
        "convattn": ZooEntry(
            "mpplan.zoo.convattn:convattn", "mpplan.zoo.convattn:example_inputs", "conv + attention + skip network"
        ),
        "gpt2": ZooEntry("mpplan.zoo.gpt2:gpt2", "mpplan.zoo.gpt2:example_inputs", "Hugging Face GPT-2 (config only)"),
    }
)


def resolve(spec: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:attribute"``; ``ValueError`` saying what is wrong otherwise."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"expected 'package.module:attribute', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{spec!r}: cannot import module {module_name!r}: {e}") from e
    target: Callable[..., Any] | None = getattr(module, attribute, None)
    if not callable(target):
        raise ValueError(f"{spec!r}: module {module_name!r} has no callable {attribute!r}")  # noqa: TRY004
    return target


def _entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise ValueError(f"unknown zoo model {name!r}; expected one of {', '.join(ZOO)}")
    return ZOO[name]


def build(name: str, **kwargs: Any) -> Any:
    """Build zoo model ``name`` with ``kwargs`` passed to its factory."""
    return resolve(_entry(name).factory)(**kwargs)


def example_inputs(name: str, batch: int, **kwargs: Any) -> Any:
    """Example inputs of zoo model ``name`` for ``batch``; ``kwargs`` go to its builder."""
    return resolve(_entry(name).inputs)(batch=batch, **kwargs)


def device_scope(device: str | None) -> contextlib.AbstractContextManager[Any]:
    """Where a factory builds its model: ``device``, or the caller's ambient ``torch.device`` when ``None``.

    Factories never pin ``cpu`` themselves, so ``with torch.device("meta"): mlp()``
    allocates nothing.
    """
    if device is None:
        return contextlib.nullcontext()
    import torch

    return torch.device(device)

"""Graph builders: the one place a config's ``model`` section becomes a ``Graph``.

Torch is imported only for ``model.torch``, so graph files and synthetic graphs
plan without paying for it.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpplan.config import Config, TorchModel
from mpplan.errors import ConfigError, GraphFileError, MpplanError
from mpplan.graph import Graph
from mpplan.units import MAX_BYTES

if TYPE_CHECKING:  # torch is imported on first use, for model.torch only
    import torch

    from mpplan.capture.torch_capture import CapturedProgram

logger = logging.getLogger("mpplan")


def graph_from_config(config: Config, program: CapturedProgram | None = None) -> Graph:
    """Build the graph the config's ``model`` section names, and check the config's references into it.

    ``program``: the config's torch model already captured (``program_from_config``), whose graph it is.
    """
    graph = program.graph if program is not None else _build_graph(config)
    total = sum(t.nbytes for t in graph.tensors)
    if total > MAX_BYTES:  # beyond it, the planner's 64-bit arithmetic would overflow
        raise ConfigError(f"{config.source}: model: the graph's tensors hold {total} bytes, more than 2**62")
    _check_device_map(config, graph)
    return graph


def _check_device_map(config: Config, graph: Graph) -> None:
    """Every ``planner.device_map`` prefix must match some op's module: a typo must not silently place nothing."""
    modules = {op.module for op in graph.ops if op.module}
    for prefix in config.planner.device_map:
        if prefix and not any(m == prefix or m.startswith(prefix + ".") for m in modules):
            known = ", ".join(sorted({m.split(".")[0] for m in modules})[:8]) or "none: the graph names no modules"
            raise ConfigError(
                f"{config.source}: planner.device_map.{prefix}: matches no module of the graph; "
                f"top-level modules: {known}"
            )


def _build_graph(config: Config) -> Graph:
    model = config.model
    if model.graph is not None:
        from mpplan.capture.graph_file import load_graph

        spec = model.graph
        path = Path(config.source).parent / spec.path
        try:
            return load_graph(path, format=spec.format, size_attr=spec.size_attr, cost_attr=spec.cost_attr)
        except GraphFileError as exc:
            raise ConfigError(f"{config.source}: model.graph.path: {exc}") from None
    if model.synthetic is not None:
        from mpplan.capture.synthetic import synthetic_graph

        kwargs = dict(model.synthetic)
        kind = kwargs.pop("kind")
        try:
            return synthetic_graph(kind, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{config.source}: model.synthetic: {exc}") from None
    return program_from_config(config).graph


#: The torch device type whose kernels ``program_from_config`` traces (it captures on ``meta``, which runs the
#: CPU's): a plan of that program counts the arena blocks and scratch of virtual devices, whatever GPUs the
#: machine has (``runtime.scratch.plan_as_run``); a run on another type plans again for its own kernels.
TRACED_FOR = "cpu"


def program_from_config(config: Config) -> CapturedProgram:
    """The config's ``model.torch`` captured on ``meta`` (nothing allocated): its graph and the kernels of
    ``TRACED_FOR``."""
    from mpplan.capture.torch_capture import capture_program

    torch_spec = config.model.torch
    assert torch_spec is not None
    module, inputs = build_torch_model(config, device="meta")
    optimizer = None if torch_spec.optimizer == "none" else torch_spec.optimizer
    return capture_program(module, inputs, mode=torch_spec.mode, optimizer=optimizer)


def build_torch_model(config: Config, device: str = "cpu", seed: int = 0) -> tuple[Any, Any]:
    """Instantiate ``model.torch.factory`` and its example inputs on ``device``.

    On ``meta`` nothing is allocated, so models larger than host memory capture.
    """
    import torch

    spec = config.model.torch
    assert spec is not None
    factory = _import_factory(spec, config.source)
    dtype = getattr(torch, spec.dtype)
    try:
        with torch.device(device):
            module = factory(**spec.kwargs)
    except MpplanError:
        raise
    except Exception as exc:  # user code: report, do not crash; -v logs the traceback
        raise _user_code_error(config.source, f"{spec.factory} raised", exc) from None
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(
            f"{config.source}: model.torch.factory: {spec.factory} returned {type(module).__name__}, "
            "expected a torch.nn.Module"
        )
    module = module.to(dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    if isinstance(spec.inputs, dict):
        inputs: Any = {k: _make_input(v, config, device, generator, dtype) for k, v in spec.inputs.items()}
    else:
        inputs = tuple(_make_input(v, config, device, generator, dtype) for v in spec.inputs)
    return module, inputs


def _import_factory(spec: TorchModel, source: str) -> Callable[..., Any]:
    module_name, _, attr = spec.factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{source}: model.torch.factory: cannot import {module_name!r} ({exc})") from None
    except Exception as exc:  # a syntax error or a failure at import time, in user code
        raise _user_code_error(source, f"importing {module_name!r} for {spec.factory} raised", exc) from None
    factory: Callable[..., Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"{source}: model.torch.factory: {module_name!r} has no callable {attr!r}")
    return factory


def _user_code_error(source: str, what: str, exc: Exception) -> ConfigError:
    """One line naming the factory and the error; the traceback goes to the debug log (``mpplan -v``)."""
    logger.debug("traceback of the factory's error:", exc_info=exc)
    detail = " ".join(str(exc).split())
    if len(detail) > 300:
        detail = detail[:300] + "..."
    hint = "" if logger.isEnabledFor(logging.DEBUG) else " (mpplan -v shows the traceback)"
    return ConfigError(f"{source}: model.torch.factory: {what} {type(exc).__name__}: {detail}{hint}")


def _make_input(
    spec: dict[str, Any], config: Config, device: str, generator: torch.Generator, float_dtype: torch.dtype
) -> torch.Tensor:
    import torch

    shape = [config.workload[d] if isinstance(d, str) else d for d in spec["shape"]]
    dtype = getattr(torch, spec["dtype"]) if "dtype" in spec else float_dtype
    if device == "meta":
        return torch.empty(shape, dtype=dtype, device="meta")
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).to(device=device, dtype=dtype)
    return torch.randint(0, int(spec.get("high", 2)), shape, generator=generator).to(device=device, dtype=dtype)

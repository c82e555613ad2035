"""Loading a run config: YAML read through ``mpplan.reading``, ``--set`` overrides, the schema, cross-field checks.

Every error is one line, ``<file>: <dotted.key>: <what is wrong>``.  ``model.torch.factory``
imports and calls user code *by design* when the model is built (not here): run configs
you trust.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path
from typing import Any

from mpplan.budget import capacity_fraction, parse_budget
from mpplan.config.axes import (
    MAX_GRID,
    axis_generator,
    axis_values,
    check_batch_axis,
    check_generated_axis,
)
from mpplan.config.convert import parse_section, show_value
from mpplan.config.overrides import apply_override, format_override
from mpplan.config.schema import (
    MAX_DEVICES,
    MAX_INT,
    MAX_SYNTHETIC_UNITS,
    Config,
    Device,
    DeviceSpec,
    RematSection,
    SearchSection,
)
from mpplan.errors import ConfigError
from mpplan.reading import load_yaml, read_document
from mpplan.units import dtype_bytes

#: The synthetic generators' arguments that count units (at most ``MAX_SYNTHETIC_UNITS``).
_SYNTHETIC_COUNTS = ("n", "blocks", "layers", "depth")


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Read, override (``dotted.key=value``) and validate a YAML config."""
    path = Path(path)
    source = str(path)
    raw = read_document(path, load_yaml, ConfigError)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: (top level): expected a mapping, got {type(raw).__name__}")
    for item in overrides:
        raw = apply_override(raw, item, source)
    return parse_config(raw, source)


def parse_config(raw: dict[str, Any], source: str = "<config>") -> Config:
    """Validate a config mapping; errors name ``source`` and the dotted key."""
    config: Config = parse_section(Config, {k: v for k, v in raw.items()}, source, "")
    config = dataclasses.replace(config, source=source)
    _check_model(config, source)
    for i, dev in enumerate(config.devices):
        _check_device(dev, source, f"devices[{i}]")
    names = {d.name for d in resolve_devices(config)}
    for prefix, device in config.planner.device_map.items():
        if names and device not in names:
            raise ConfigError(
                f"{source}: planner.device_map.{prefix}: unknown device {device!r}; "
                f"devices are {', '.join(sorted(names)[:16])}{' ...' if len(names) > 16 else ''}"
            )
    _check_remat(config.planner.remat, source)
    if config.planner.alignment < 1:
        raise ConfigError(
            f"{source}: planner.alignment: must be a positive number of bytes, got {config.planner.alignment}"
        )
    for key, value in config.workload.items():
        if value <= 0:
            raise ConfigError(f"{source}: workload.{key}: must be positive, got {value}")
    _check_search(config.search, raw, source)
    return config


def resolve_devices(config: Config) -> tuple[Device, ...]:
    """Expand ``count`` entries into concrete devices, checking names are unique (in linear time)."""
    total = sum(1 if spec.count is None else spec.count for spec in config.devices)
    if total > MAX_DEVICES:
        raise ConfigError(
            f"{config.source}: devices: {total} devices, more than the {MAX_DEVICES} mpplan plans for at once"
        )
    devices: list[Device] = []
    seen: set[str] = set()
    for i, spec in enumerate(config.devices):
        if spec.count is not None:
            names = [f"{spec.kind}:{j}" for j in range(spec.count)]
        else:
            names = [spec.name or ""]
        for name in names:
            if name in seen:
                raise ConfigError(f"{config.source}: devices[{i}].name: device {name!r} named twice")
            seen.add(name)
            devices.append(Device(name=name, capacity=spec.capacity, reserve=spec.reserve))
    return tuple(devices)


def _check_search(search: SearchSection, raw: dict[str, Any], source: str) -> None:
    """Check the search settings, and that every value of every axis makes a valid config on its own."""
    numbers = (
        ("top_k", search.top_k, 0),
        ("actors", search.actors, 1),
        ("gpus_per_actor", search.gpus_per_actor, 0),
        ("retries", search.retries, 0),
        ("measure.steps", search.measure.steps, 1),
        ("measure.warmup", search.measure.warmup, 0),
    )
    for key, value, least in numbers:
        if value is not None and value < least:
            raise ConfigError(f"{source}: search.{key}: must be at least {least}, got {value}")
    for key in ("timeout_s", "startup_timeout_s"):
        if getattr(search, key) <= 0:
            raise ConfigError(f"{source}: search.{key}: must be positive, got {getattr(search, key)}")
    base = {k: v for k, v in raw.items() if k != "search"}
    grid = 1
    for key, spec in search.space.items():
        where = f"search.space.{key}"
        if not key or key.split(".")[0] == "search" or "=" in key:
            raise ConfigError(f"{source}: {where}: expected a dotted config key outside search, got {key!r}")
        if axis_generator(spec) is not None:
            grid *= check_generated_axis(key, spec, base, source, where)
            continue
        values = axis_values(spec, source, where)
        grid *= len(values)
        for value in values:
            try:
                parse_config(apply_override(base, format_override(key, value), source), source)
            except ConfigError as exc:
                detail = str(exc).removeprefix(f"{source}: ")
                raise ConfigError(
                    f"{source}: {where}: value {value!r} does not make a valid config: {detail}"
                ) from None
    if grid > MAX_GRID:
        raise ConfigError(f"{source}: search.space: {grid} combinations, more than {MAX_GRID}; narrow the axes")
    check_batch_axis(search, source)

def _check_model(config: Config, source: str) -> None:
    chosen = [name for name in ("torch", "graph", "synthetic") if getattr(config.model, name) is not None]
    if len(chosen) != 1:
        found = ", ".join(chosen) or "none"
        raise ConfigError(f"{source}: model: needs exactly one of torch, graph, synthetic; found {found}")
    if config.model.graph is not None:
        graph_path = Path(source).parent / config.model.graph.path
        if not graph_path.is_file():
            raise ConfigError(f"{source}: model.graph.path: file not found: {graph_path}")
    if config.model.torch is not None:
        torch_model = config.model.torch
        module, sep, attr = torch_model.factory.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(
                f"{source}: model.torch.factory: expected 'package.module:callable', got {torch_model.factory!r}"
            )
        try:
            dtype_bytes(torch_model.dtype)
        except ValueError as exc:
            raise ConfigError(f"{source}: model.torch.dtype: {exc}") from None
        _check_inputs(torch_model.inputs, config.workload, source)
    if config.model.synthetic is not None and "kind" not in config.model.synthetic:
        raise ConfigError(f"{source}: model.synthetic.kind: missing; name a generator such as chain or transformer")
    for key in _SYNTHETIC_COUNTS:  # the generators' size arguments: each unit is a few ops
        value = (config.model.synthetic or {}).get(key)
        if isinstance(value, int) and value > MAX_SYNTHETIC_UNITS:
            raise ConfigError(
                f"{source}: model.synthetic.{key}: at most {MAX_SYNTHETIC_UNITS} (graphs of a few hundred thousand "
                f"ops), got {show_value(value)}"
            )


def _check_remat(remat: RematSection, source: str) -> None:
    """A set budget is checked under every policy: a typo there would otherwise pass until the
    policy becomes ``budget`` (a search axis, or the user's next edit)."""
    if remat.policy == "budget" and remat.budget is None:
        raise ConfigError(f"{source}: planner.remat.budget: budget needs bytes (16GiB) or a fraction (0.8)")
    if remat.budget is not None:
        try:
            if capacity_fraction(remat.budget) is None:
                parse_budget(remat.budget)
        except ValueError as exc:
            raise ConfigError(f"{source}: planner.remat.budget: {exc}") from None
    if remat.time_limit_s <= 0:
        raise ConfigError(f"{source}: planner.remat.time_limit_s: must be positive")


def _check_inputs(inputs: Any, workload: dict[str, int], source: str) -> None:
    if isinstance(inputs, dict):
        items = [(f"model.torch.inputs.{k}", v) for k, v in inputs.items()]
    elif isinstance(inputs, list):
        items = [(f"model.torch.inputs[{i}]", v) for i, v in enumerate(inputs)]
    else:
        raise ConfigError(f"{source}: model.torch.inputs: expected a list or mapping of tensor specs")
    for where, spec in items:
        if not isinstance(spec, dict) or "shape" not in spec:
            raise ConfigError(f"{source}: {where}: expected {{shape: [...], dtype: ..., high: ...}}")
        unknown = set(spec) - {"shape", "dtype", "high"}
        if unknown:
            raise ConfigError(
                f"{source}: {where}.{sorted(unknown)[0]}: unknown key; expected one of shape, dtype, high"
            )
        if not isinstance(spec["shape"], list):
            raise ConfigError(f"{source}: {where}.shape: expected a list")
        for j, dim in enumerate(spec["shape"]):
            if isinstance(dim, str):
                if dim not in workload:
                    raise ConfigError(f"{source}: {where}.shape[{j}]: {dim!r} is not a workload key")
            elif not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
                raise ConfigError(f"{source}: {where}.shape[{j}]: expected a non-negative integer or workload key")
        try:
            width = dtype_bytes(str(spec.get("dtype", "float32")))
        except ValueError as exc:
            raise ConfigError(f"{source}: {where}.dtype: {exc}") from None
        dims = [workload[d] if isinstance(d, str) else d for d in spec["shape"]]
        if math.prod(dims) * width > MAX_INT:
            raise ConfigError(f"{source}: {where}.shape: {dims} makes a tensor of more than 2**62 bytes")


def _check_device(dev: DeviceSpec, source: str, where: str) -> None:
    if dev.count is None and not dev.name:
        raise ConfigError(f"{source}: {where}: needs a name, or a count")
    if dev.count is not None and dev.name:
        raise ConfigError(f"{source}: {where}: give either name or count, not both")
    if dev.count is not None and dev.count < 1:
        raise ConfigError(f"{source}: {where}.count: must be at least 1, got {dev.count}")
    if dev.capacity <= 0:
        raise ConfigError(f"{source}: {where}.capacity: must be positive")
    if dev.reserve >= dev.capacity:
        raise ConfigError(f"{source}: {where}.reserve: must be below the capacity")

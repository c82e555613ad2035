"""The YAML run configuration: one schema for every command, validated with precise errors.

The schema is the set of frozen dataclasses below; each field's ``metadata["doc"]``
documents it, and the configuration reference in ``docs/`` is generated from them,
so code and docs cannot drift.  Every error is one line,
``<file>: <dotted.key>: <what is wrong>``.

YAML is read with ``yaml.safe_load`` only.  ``model.torch.factory`` imports and
calls user code *by design*: run configs you trust.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mpplan.errors import ConfigError
from mpplan.units import dtype_bytes, parse_size

Size = typing.NewType("Size", int)
"""An ``int`` of bytes written as ``16GiB``, ``512MB`` or a plain integer."""


def _doc(text: str, default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    if default is dataclasses.MISSING and "default_factory" not in kwargs:
        return field(metadata={"doc": text}, **kwargs)
    return field(default=default, metadata={"doc": text}, **kwargs)


@dataclass(frozen=True)
class TorchModel:
    """A PyTorch module built by a factory and traced on fake tensors."""

    factory: str = _doc('"package.module:callable" returning an nn.Module (imports user code)')
    kwargs: dict[str, Any] = _doc("keyword arguments for the factory", default_factory=dict)
    inputs: Any = _doc(
        "example inputs: a list (positional) or mapping (keyword) of {shape, dtype, high}; "
        "shape entries may name workload keys",
        default_factory=list,
    )
    mode: Literal["infer", "train"] = _doc("capture the forward only, or forward + backward", default="train")
    optimizer: Literal["none", "sgd", "adam"] = _doc("optimizer update captured in train mode", default="none")
    dtype: str = _doc("parameter dtype", default="float32")


@dataclass(frozen=True)
class GraphModel:
    """A graph file: mpplan YAML/JSON or networkx node-link JSON."""

    path: str = _doc("graph file, relative to the config file")
    format: Literal["auto", "mpplan", "node-link"] = _doc("file format; auto reads the content", default="auto")
    size_attr: str | None = _doc("node-link: node attribute holding output bytes", default=None)
    cost_attr: str | None = _doc("node-link: node attribute holding op cost", default=None)


@dataclass(frozen=True)
class ModelSection:
    """Exactly one of ``torch``, ``graph`` or ``synthetic``."""

    torch: TorchModel | None = _doc("a PyTorch model", default=None)
    graph: GraphModel | None = _doc("a graph file", default=None)
    synthetic: dict[str, Any] | None = _doc("a generated graph: {kind, ...generator arguments}", default=None)


@dataclass(frozen=True)
class DeviceSpec:
    """One device, or ``count`` equal ones named ``<kind>:<i>``."""

    capacity: Size = _doc("memory capacity (16GiB, 512MB, bytes)")
    name: str | None = _doc("device name; required unless count is given", default=None)
    count: int | None = _doc("expand into this many equal devices", default=None)
    kind: str = _doc("device kind, used to name counted devices", default="cuda")
    reserve: Size = _doc("bytes held back for the CUDA context and allocator slack", default=0)


@dataclass(frozen=True)
class PlannerSection:
    """How plans are made."""

    schedule: Literal["auto", "as_given", "longest_path", "greedy_free", "least_peak", "dfs", "bfs", "exact"] = _doc(
        "op order heuristic", default="auto"
    )
    assign: Literal["auto", "greedy_by_size", "best_fit", "exact", "shared_greedy", "shared_dp"] = _doc(
        "offset assignment (or memonger-style shared objects)", default="auto"
    )
    alignment: int = _doc("every offset and buffer size is a multiple of this many bytes", default=64)
    parallel_safe: bool = _doc("share memory only between tensors ordered by the DAG itself", default=False)


@dataclass(frozen=True)
class OutputSection:
    """Where results go."""

    dir: str = _doc("output folder, relative to the working directory", default="runs/mpplan")


@dataclass(frozen=True)
class Config:
    """A whole run."""

    model: ModelSection = _doc("what to plan")
    devices: tuple[DeviceSpec, ...] = _doc("the devices to plan for", default=())
    workload: dict[str, int] = _doc("named sizes (batch, seq, ...) that input shapes refer to", default_factory=dict)
    planner: PlannerSection = _doc("planner settings", default_factory=PlannerSection)
    output: OutputSection = _doc("output settings", default_factory=OutputSection)
    source: str = field(default="<config>", metadata={"internal": True})


@dataclass(frozen=True, slots=True)
class Device:
    """A concrete device: its usable capacity is ``capacity - reserve``."""

    name: str
    capacity: int
    reserve: int = 0

    @property
    def usable(self) -> int:
        return self.capacity - self.reserve


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Read, override (``dotted.key=value``) and validate a YAML config."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ConfigError(f"{source}: file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ConfigError(f"{source}: {where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: (top level): expected a mapping, got {type(raw).__name__}")
    for item in overrides:
        raw = apply_override(raw, item, source)
    return parse_config(raw, source)


def parse_config(raw: dict[str, Any], source: str = "<config>") -> Config:
    """Validate a config mapping; errors name ``source`` and the dotted key."""
    config = _parse(Config, {k: v for k, v in raw.items()}, source, "")
    config = dataclasses.replace(config, source=source)
    _check_model(config, source)
    for i, dev in enumerate(config.devices):
        _check_device(dev, source, f"devices[{i}]")
    resolve_devices(config)
    if config.planner.alignment < 1:
        raise ConfigError(f"{source}: planner.alignment: must be a positive number of bytes, got {config.planner.alignment}")
    for key, value in config.workload.items():
        if value <= 0:
            raise ConfigError(f"{source}: workload.{key}: must be positive, got {value}")
    return config


def apply_override(raw: dict[str, Any], item: str, source: str) -> dict[str, Any]:
    """Return a copy of ``raw`` with ``dotted.key=value`` set (value parsed as YAML)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{source}: --set {item!r}: expected dotted.key=value")
    value = yaml.safe_load(text)
    root = _deep_copy(raw)
    node: Any = root
    parts = key.split(".")
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{source}: {'.'.join(parts[: depth + 1])}: no such list element")
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:
            raise ConfigError(f"{source}: {'.'.join(parts[:depth])}: is not a mapping, cannot set {key!r}")
        if last:
            node[index] = value
        else:
            if isinstance(node, dict) and not isinstance(node.get(index), (dict, list)):
                node[index] = {}
            node = node[index]
    return root


def resolve_devices(config: Config) -> tuple[Device, ...]:
    """Expand ``count`` entries into concrete devices, checking names are unique."""
    devices: list[Device] = []
    for i, spec in enumerate(config.devices):
        if spec.count is not None:
            names = [f"{spec.kind}:{j}" for j in range(spec.count)]
        else:
            names = [spec.name or ""]
        for name in names:
            if any(d.name == name for d in devices):
                raise ConfigError(f"{config.source}: devices[{i}].name: device {name!r} named twice")
            devices.append(Device(name=name, capacity=spec.capacity, reserve=spec.reserve))
    return tuple(devices)


def schema_fields(cls: type) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every key of the schema, for the docs."""
    rows: list[tuple[str, str, str, str]] = []
    _walk_schema(cls, "", rows)
    return rows


# --- internals ---------------------------------------------------------------------------------


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


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
            raise ConfigError(f"{source}: {where}.{sorted(unknown)[0]}: unknown key; expected one of shape, dtype, high")
        if not isinstance(spec["shape"], list):
            raise ConfigError(f"{source}: {where}.shape: expected a list")
        for j, dim in enumerate(spec["shape"]):
            if isinstance(dim, str):
                if dim not in workload:
                    raise ConfigError(f"{source}: {where}.shape[{j}]: {dim!r} is not a workload key")
            elif not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
                raise ConfigError(f"{source}: {where}.shape[{j}]: expected a non-negative integer or workload key")
        try:
            dtype_bytes(str(spec.get("dtype", "float32")))
        except ValueError as exc:
            raise ConfigError(f"{source}: {where}.dtype: {exc}") from None


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


def _parse(cls: type, raw: Any, source: str, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {where or '(top level)'}: expected a mapping, got {_type_name(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for key in raw:
        if key not in fields:
            raise ConfigError(
                f"{source}: {_join(where, str(key))}: unknown key; expected one of {', '.join(fields)}"
            )
    values = {}
    for name, f in fields.items():
        key = _join(where, name)
        if name in raw:
            values[name] = _convert(hints[name], raw[name], source, key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: {key}: missing")
    return cls(**values)


def _convert(hint: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, source, key)
    if hint is Size:
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {key}: {exc}") from None
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{source}: {key}: expected one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return _parse(hint, value, source, key)
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}: expected a list, got {_type_name(value)}")
        return tuple(_convert(args[0], v, source, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping, got {_type_name(value)}")
        return {str(k): _convert(args[1], v, source, f"{key}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key}: expected a string, got {value!r}")
        return value
    raise AssertionError(f"unsupported schema type {hint!r} at {key}")


def _walk_schema(cls: type, prefix: str, rows: list[tuple[str, str, str, str]]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = _join(prefix, f.name)
        hint = hints[f.name]
        inner = _dataclass_in(hint)
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = "(defaults)" if inner else repr(f.default_factory())
        else:
            default = "required"
        rows.append((key, _hint_name(hint), default, f.metadata.get("doc", "")))
        if inner is not None:
            _walk_schema(inner, f"{key}[]" if typing.get_origin(hint) is tuple else key, rows)


def _dataclass_in(hint: Any) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _hint_name(hint: Any) -> str:
    if hint is Size:
        return "size"
    origin = typing.get_origin(hint)
    if origin is Literal:
        return " | ".join(map(str, typing.get_args(hint)))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_hint_name(a) for a in typing.get_args(hint) if a is not type(None)) + " (optional)"
    if origin is tuple:
        return f"list of {_hint_name(typing.get_args(hint)[0])}"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(hint):
        return "section"
    return getattr(hint, "__name__", str(hint))


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _type_name(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__

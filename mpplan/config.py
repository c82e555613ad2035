"""The YAML run configuration: one schema for every command, validated with precise errors.

The schema is the set of frozen dataclasses below; each field's ``metadata["doc"]``
documents it, and the configuration reference in ``docs/`` is generated from them,
so code and docs cannot drift.  Every error is one line,
``<file>: <dotted.key>: <what is wrong>``.

YAML is read by ``mpplan.reading`` (``safe_load``'s types; no alias bombs, duplicate
keys or runaway nesting).  ``model.torch.factory`` imports and calls user code *by
design*: run configs you trust.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mpplan.errors import ConfigError
from mpplan.reading import DocumentError, load_yaml, read_text
from mpplan.units import dtype_bytes, parse_size

Size = typing.NewType("Size", int)
"""An ``int`` of bytes written as ``16GiB``, ``512MB`` or a plain integer."""


def _doc(text: str, default: Any = dataclasses.MISSING, key: str | None = None, **kwargs: Any) -> Any:
    """A schema field: its doc line, default, and the YAML key when it differs from the name."""
    metadata = {"doc": text, "key": key}
    if default is dataclasses.MISSING and "default_factory" not in kwargs:
        return field(metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


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
class ShiftSection:
    """Caffe2-style activation shifting from one device to another."""

    activations: Any = _doc('activation tensor names to move, or "auto"', default="auto")
    from_device: str | None = _doc("device the activations leave (default: the first)", default=None, key="from")
    to_device: str | None = _doc("device they move to (default: the second)", default=None, key="to")


@dataclass(frozen=True)
class RematSection:
    """Rematerialisation: recompute activations in the backward pass instead of keeping them."""

    policy: Literal["none", "mirror", "sqrt", "budget"] = _doc("what to recompute", default="none")
    threshold: Size | None = _doc(
        "mirror: bytes a recomputed stretch may make before a stage is kept (64MB; 0 recomputes nothing; "
        "unset searches it as MXNet does)",
        default=None,
    )
    budget: Any = _doc(
        "budget: per-device bytes (16GiB), a fraction of the no-remat peak (0.8), or of the device's capacity "
        "('0.9 capacity', '90% capacity')",
        default=None,
    )
    solver: Literal["auto", "heuristic", "exact"] = _doc("budget: fast heuristic, exact ILP, or auto by size", default="auto")
    time_limit_s: float = _doc("budget: time limit of the exact solver", default=60.0)


@dataclass(frozen=True)
class PlannerSection:
    """How plans are made."""

    schedule: Literal["auto", "as_given", "longest_path", "greedy_free", "least_peak", "dfs", "bfs", "exact"] = _doc(
        "op order heuristic", default="auto"
    )
    assign: Literal["auto", "greedy_by_size", "best_fit", "search", "exact", "shared_greedy", "shared_dp"] = _doc(
        "offset assignment (search = branch and bound, exact is its alias) or memonger-style shared objects",
        default="auto",
    )
    alignment: int = _doc("every offset and buffer size is a multiple of this many bytes", default=64)
    parallel_safe: bool = _doc("share memory only between tensors ordered by the DAG itself", default=False)
    grads: Literal["static", "dynamic"] = _doc(
        "parameter gradients: dynamic (made by backward, held to the end of the step, as eager PyTorch's .grad "
        "after zero_grad(set_to_none=True)) or static (resident all step, as memonger)",
        default="dynamic",
    )
    placement: Literal["single", "pipeline", "shift", "manual", "auto"] = _doc(
        "how ops are spread over the devices", default="auto"
    )
    device_map: dict[str, str] = _doc("manual placement: module path prefix -> device name", default_factory=dict)
    no_split: tuple[str, ...] = _doc("module path prefixes a pipeline stage boundary must not cut", default=())
    shift: ShiftSection = _doc("placement: shift settings", default_factory=ShiftSection)
    remat: RematSection = _doc("rematerialisation settings", default_factory=RematSection)


@dataclass(frozen=True)
class OutputSection:
    """Where results go."""

    dir: str = _doc("output folder, relative to the working directory", default="runs/mpplan")


@dataclass(frozen=True)
class SearchMeasureSection:
    """How each measured candidate runs on its evaluator actor."""

    steps: int = _doc("timed steps per candidate; the step time is their median", default=3)
    warmup: int = _doc("untimed steps before the timed ones", default=1)
    arena: bool = _doc("back dynamic tensors by the plan's arena offsets", default=True)
    eager: bool = _doc(
        "also run plain PyTorch per candidate: the eager baseline and the numerics check (about doubles the time)",
        default=False,
    )


@dataclass(frozen=True)
class SearchSection:
    """``mpplan search``: a grid of config overrides, planned on the driver, the best measured on Ray actors."""

    space: dict[str, Any] = _doc(
        "dotted config key -> a list of values, a range {min, max, step} / {min, max, factor}, or "
        "{generate: mxnet, ntrial: 6} for planner.remat.threshold (MXNet's threshold search, from the "
        "base config's graph); every combination is one candidate (e.g. planner.schedule, devices.0.count, "
        "workload.batch)",
        default_factory=dict,
    )
    objective: Literal["min_peak", "min_time_that_fits", "max_batch"] = _doc(
        "min_peak: lowest measured peak; min_time_that_fits: fastest step that fits; "
        "max_batch: largest value of batch_key that fits, bisected on measured fit (a batch size, or "
        "planner.remat.budget: the least recompute that fits); fit is the plan's own peak, run by mpplan's "
        "executor: for your own loop under mpplan.apply, mpplan.runtime.apply_budget.max_batch",
        default="min_peak",
    )
    batch_key: str = _doc(
        "max_batch: the workload key to maximise (or a dotted config key); its space axis is bisected",
        default="batch",
    )
    top_k: int = _doc(
        "candidates to measure, best predicted first (max_batch: settings combinations to bisect); "
        "0 ranks by prediction only",
        default=4,
    )
    actors: int | None = _doc("evaluator actors (default: as many as the cluster holds, at most top_k)", default=None)
    gpus_per_actor: int | None = _doc(
        "GPUs each actor owns (default: a candidate's device count when a node has that many GPUs, "
        "else 0: virtual devices)",
        default=None,
    )
    timeout_s: float = _doc("seconds one evaluation may run before its actor is killed and replaced", default=600.0)
    retries: int = _doc("re-evaluations of a candidate whose actor died or timed out", default=1)
    startup_timeout_s: float = _doc("seconds an evaluator actor may take to start", default=300.0)
    measure: SearchMeasureSection = _doc("how candidates are measured", default_factory=SearchMeasureSection)


@dataclass(frozen=True)
class Config:
    """A whole run."""

    model: ModelSection = _doc("what to plan")
    devices: tuple[DeviceSpec, ...] = _doc("the devices to plan for", default=())
    workload: dict[str, int] = _doc("named sizes (batch, seq, ...) that input shapes refer to", default_factory=dict)
    planner: PlannerSection = _doc("planner settings", default_factory=PlannerSection)
    output: OutputSection = _doc("output settings", default_factory=OutputSection)
    search: SearchSection = _doc("search settings (mpplan search)", default_factory=SearchSection)
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
    try:
        raw = load_yaml(read_text(path))
    except FileNotFoundError:
        raise ConfigError(f"{source}: file not found") from None
    except DocumentError as exc:
        raise ConfigError(f"{source}: {exc}") from None
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
    names = {d.name for d in resolve_devices(config)}
    for prefix, device in config.planner.device_map.items():
        if names and device not in names:
            raise ConfigError(
                f"{source}: planner.device_map.{prefix}: unknown device {device!r}; "
                f"devices are {', '.join(sorted(names)[:16])}{' ...' if len(names) > 16 else ''}"
            )
    _check_remat(config.planner.remat, source)
    if config.planner.alignment < 1:
        raise ConfigError(f"{source}: planner.alignment: must be a positive number of bytes, got {config.planner.alignment}")
    for key, value in config.workload.items():
        if value <= 0:
            raise ConfigError(f"{source}: workload.{key}: must be positive, got {value}")
    _check_search(config.search, raw, source)
    return config


def apply_override(raw: dict[str, Any], item: str, source: str) -> dict[str, Any]:
    """Return a copy of ``raw`` with ``dotted.key=value`` set (value parsed as YAML)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{source}: --set {item!r}: expected dotted.key=value")
    try:
        value = load_yaml(text)
    except DocumentError as exc:
        raise ConfigError(f"{source}: --set {key}: {exc}") from None
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


def schema_fields(cls: type) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every key of the schema, for the docs."""
    rows: list[tuple[str, str, str, str]] = []
    _walk_schema(cls, "", rows)
    return rows


#: Most devices one config may expand to: placement and planning work grows with the device count.
MAX_DEVICES = 1024
#: Most units (layers, blocks, levels) a synthetic graph may have, and the arguments that count them.
MAX_SYNTHETIC_UNITS = 100_000
_SYNTHETIC_COUNTS = ("n", "blocks", "layers", "depth")
#: Largest integer a config key takes: beyond it, 64-bit arithmetic in numpy and torch overflows.
MAX_INT = 2**62

#: Most values one search axis, and candidates one search grid, may have.
MAX_AXIS_VALUES = 10_000
MAX_GRID = 100_000

#: Generated ``search.space`` axes: ``{generate: NAME}`` -> the one key it generates values for.
GENERATORS = {"mxnet": "planner.remat.threshold"}


def axis_generator(spec: Any) -> str | None:
    """The generator a ``search.space`` axis names (``{generate: mxnet}``), or None for listed values."""
    return spec.get("generate") if isinstance(spec, dict) and "generate" in spec else None


def _check_generated_axis(key: str, spec: dict, base: dict[str, Any], source: str, where: str) -> int:
    """Validate a generated axis; return the most values it can make."""
    name = spec["generate"]
    if GENERATORS.get(name) != key:
        known = ", ".join(f"{g} (for {k})" for g, k in GENERATORS.items())
        raise ConfigError(f"{source}: {where}.generate: unknown generator {name!r} for {key}; known: {known}")
    if set(spec) - {"generate", "ntrial"}:
        raise ConfigError(f"{source}: {where}: a generated axis takes generate and ntrial; got {sorted(spec)}")
    ntrial = spec.get("ntrial", 6)
    if isinstance(ntrial, bool) or not isinstance(ntrial, int) or ntrial < 1:
        raise ConfigError(f"{source}: {where}.ntrial: expected a positive integer, got {ntrial!r}")
    policy = ((base.get("planner") or {}).get("remat") or {}).get("policy", "none")
    if policy != "mirror":
        raise ConfigError(f"{source}: {where}: thresholds steer planner.remat.policy mirror; set it (it is {policy!r})")
    return 3 + ntrial


def axis_values(spec: Any, source: str = "<config>", where: str = "search.space") -> tuple[Any, ...]:
    """The values of one ``search.space`` axis: a non-empty list, or an arithmetic or geometric range.

    >>> axis_values({"min": 8, "max": 64, "factor": 2})
    (8, 16, 32, 64)
    >>> axis_values({"min": 1, "max": 2, "step": 0.5})
    (1.0, 1.5, 2.0)
    """
    if isinstance(spec, list):
        if not spec:
            raise ConfigError(f"{source}: {where}: empty list; give at least one value")
        return tuple(spec)
    if not isinstance(spec, dict):
        raise ConfigError(
            f"{source}: {where}: expected a list of values or a range {{min, max, step|factor}}, got {_type_name(spec)}"
        )
    keys = set(spec)
    if not {"min", "max"} <= keys or len(keys & {"step", "factor"}) != 1 or keys - {"min", "max", "step", "factor"}:
        raise ConfigError(f"{source}: {where}: a range needs min, max and exactly one of step, factor; got {sorted(keys)}")
    for key in keys:
        value = spec[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{source}: {where}.{key}: expected a number, got {value!r}")
    low, high = spec["min"], spec["max"]
    if low > high:
        raise ConfigError(f"{source}: {where}: empty range, min {low} is above max {high}")
    integral = all(isinstance(spec[k], int) for k in keys)
    if "step" in spec:
        step = spec["step"]
        if step <= 0:
            raise ConfigError(f"{source}: {where}.step: must be positive, got {step}")
        count = int((high - low) / step + 1e-9) + 1
        _check_axis_size(count, source, where)
        values: list[Any] = [low + i * step if integral else round(low + i * step, 12) for i in range(count)]
    else:
        factor = spec["factor"]
        if factor <= 1:
            raise ConfigError(f"{source}: {where}.factor: must be above 1, got {factor}")
        if low <= 0:
            raise ConfigError(f"{source}: {where}.min: a geometric range must start above 0, got {low}")
        values, value = [], low
        while value <= high * (1 + 1e-12):
            values.append(round(value, 12))
            _check_axis_size(len(values), source, where)
            value *= factor
        if isinstance(low, int) and isinstance(high, int):  # integer ends: round, keep distinct sizes
            values = list(dict.fromkeys(round(v) for v in values))
    return tuple(values)


def _check_axis_size(count: int, source: str, where: str) -> None:
    if count > MAX_AXIS_VALUES:
        raise ConfigError(f"{source}: {where}: more than {MAX_AXIS_VALUES} values; use a larger step or factor")


def format_override(key: str, value: Any) -> str:
    """The ``dotted.key=value`` item that ``apply_override`` reads back as ``value`` (YAML flow style).

    >>> format_override("planner.schedule", "yes")
    "planner.schedule='yes'"
    """
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).removesuffix(chr(10) + '...' + chr(10)).strip()}"


def batch_axis_key(search: SearchSection) -> str:
    """The dotted config key ``search.batch_key`` names: a bare name is a workload key."""
    return search.batch_key if "." in search.batch_key else f"workload.{search.batch_key}"


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
            grid *= _check_generated_axis(key, spec, base, source, where)
            continue
        values = axis_values(spec, source, where)
        grid *= len(values)
        for value in values:
            try:
                parse_config(apply_override(base, format_override(key, value), source), source)
            except ConfigError as exc:
                detail = str(exc).removeprefix(f"{source}: ")
                raise ConfigError(f"{source}: {where}: value {value!r} does not make a valid config: {detail}") from None
    if grid > MAX_GRID:
        raise ConfigError(f"{source}: search.space: {grid} combinations, more than {MAX_GRID}; narrow the axes")
    if search.objective == "max_batch":
        key = batch_axis_key(search)
        if key not in search.space:
            raise ConfigError(
                f"{source}: search.space: objective max_batch bisects {key} (search.batch_key); "
                f"give it an axis such as {key}: {{min: 1, max: 256, factor: 2}}"
            )
        if axis_generator(search.space[key]) is not None:
            raise ConfigError(f"{source}: search.space.{key}: max_batch bisects listed values, not a generated axis")
        number = int if key.startswith("workload.") else (int, float)  # a budget fraction may be bisected too
        values = axis_values(search.space[key], source)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, number)]
        if bad:
            what = "integer batch sizes" if number is int else "numbers"
            raise ConfigError(f"{source}: search.space.{key}: max_batch needs {what}, got {bad[0]!r}")


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
    for key in _SYNTHETIC_COUNTS:  # the generators' size arguments: each unit is a few ops
        value = (config.model.synthetic or {}).get(key)
        if isinstance(value, int) and value > MAX_SYNTHETIC_UNITS:
            raise ConfigError(
                f"{source}: model.synthetic.{key}: at most {MAX_SYNTHETIC_UNITS} (graphs of a few hundred thousand "
                f"ops), got {_show(value)}"
            )


def _check_remat(remat: RematSection, source: str) -> None:
    if remat.policy == "budget":
        if remat.budget is None:
            raise ConfigError(f"{source}: planner.remat.budget: budget needs bytes (16GiB) or a fraction (0.8)")
        try:
            if capacity_fraction(remat.budget) is None:
                parse_budget(remat.budget)
        except ValueError as exc:
            raise ConfigError(f"{source}: planner.remat.budget: {exc}") from None
    if remat.time_limit_s <= 0:
        raise ConfigError(f"{source}: planner.remat.time_limit_s: must be positive")


_CAPACITY_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*(?:of\s+)?(?:the\s+)?capacity\s*$", re.I)


def capacity_fraction(value: Any) -> float | None:
    """The fraction of a remat budget stated against the device's capacity ('0.9 capacity', '90% capacity').

    ``None`` for any other form (bytes, a fraction of the no-remat peak); ``ValueError``
    when the fraction is outside (0, 1].  The planner turns it into bytes of the
    smallest device's capacity.
    """
    if not isinstance(value, str):
        return None
    match = _CAPACITY_BUDGET.match(value)
    if match is None:
        return None
    fraction = float(match.group(1)) / (100 if match.group(2) else 1)
    if not 0 < fraction <= 1:
        raise ValueError(f"a fraction of capacity must lie in (0, 1] (or 0-100%), got {value!r}")
    return fraction


def parse_budget(value: Any) -> int | float:
    """A remat budget: a fraction in (0, 1] of the no-remat peak (float) or a size in bytes (int)."""
    if isinstance(value, float) and not isinstance(value, bool):
        if not 0 < value <= 1:
            raise ValueError(f"a fraction must lie in (0, 1], got {value}")
        return value
    size = parse_size(value)
    if size <= 0:
        raise ValueError("must be positive")
    return size


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


def _parse(cls: type, raw: Any, source: str, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {where or '(top level)'}: expected a mapping, got {_type_name(raw)}")
    hints = typing.get_type_hints(cls)
    fields = {_yaml_key(f): f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for key in raw:
        if key not in fields:
            raise ConfigError(
                f"{source}: {_join(where, str(key))}: unknown key; expected one of {', '.join(fields)}"
            )
    values = {}
    for yaml_key, f in fields.items():
        key = _join(where, yaml_key)
        if yaml_key in raw:
            values[f.name] = _convert(hints[f.name], raw[yaml_key], source, key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: {key}: missing")
    return cls(**values)


def _yaml_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
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
            raise ConfigError(f"{source}: {key}: expected an integer, got {_show(value)}")
        if abs(value) > MAX_INT:
            raise ConfigError(f"{source}: {key}: expected an integer of at most 2**62, got {_show(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) > MAX_INT:
            raise ConfigError(f"{source}: {key}: expected a number of at most 2**62, got {_show(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{source}: {key}: expected a finite number, got {_show(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key}: expected a string, got {_show(value)}")
        return value
    raise AssertionError(f"unsupported schema type {hint!r} at {key}")


def _walk_schema(cls: type, prefix: str, rows: list[tuple[str, str, str, str]]) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = _join(prefix, _yaml_key(f))
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
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


def _show(value: Any) -> str:
    """``repr`` cut to 40 characters, so a 400-digit number or a huge list still makes one short line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def _type_name(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__

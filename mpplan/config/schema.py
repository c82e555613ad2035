"""The config schema: one frozen dataclass per YAML section, each field documented.

Each field's ``metadata["doc"]`` documents it (``key`` when the YAML key differs from
the name); ``schema_fields`` walks them for the configuration reference in ``docs/``,
so code and docs cannot drift.  Reading a mapping into these classes is
``mpplan.config.convert``'s; checks across fields are ``mpplan.config.load``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

# The pass choices come from the pass registries, so a new scheduler, assigner or placement is
# accepted and documented by registering it. To mypy they are plain strings; at run time the schema's
# hints resolve them through ``pass_choices``, which imports the registries only when a schema is
# first read: importing the config must not load the passes (the verifier imports it).
if typing.TYPE_CHECKING:
    ScheduleName: typing.TypeAlias = str
    AssignName: typing.TypeAlias = str
    PlacementName: typing.TypeAlias = str


@functools.cache
def pass_choices() -> dict[str, Any]:
    """The ``Literal`` of each pass registry's names, for ``typing.get_type_hints``."""
    from mpplan.passes.assign import ASSIGNERS
    from mpplan.passes.place import PLACEMENTS
    from mpplan.passes.schedule import SCHEDULERS

    return {
        "ScheduleName": Literal[tuple(SCHEDULERS)],
        "AssignName": Literal[tuple(ASSIGNERS)],
        "PlacementName": Literal[tuple(PLACEMENTS)],
    }


def schema_hints(cls: type) -> dict[str, Any]:
    """The resolved type hints of a schema dataclass, the pass choices included."""
    return typing.get_type_hints(cls, localns=pass_choices())


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
    solver: Literal["auto", "heuristic", "exact"] = _doc(
        "budget: fast heuristic, exact ILP, or auto by size", default="auto"
    )
    time_limit_s: float = _doc("budget: time limit of the exact solver", default=60.0)


@dataclass(frozen=True)
class PlannerSection:
    """How plans are made."""

    schedule: ScheduleName = _doc(
        "op order heuristic", default="auto"
    )
    assign: AssignName = _doc(
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
    placement: PlacementName = _doc(
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
        "planner.remat.budget: the least recompute that fits); search.fit says whose peak must fit: the plan's "
        "own under mpplan's executor, or your own loop's under mpplan.apply",
        default="min_peak",
    )
    fit: Literal["plan", "apply"] = _doc(
        "what a candidate must fit its devices with: plan: the plan's own peak under mpplan's executor; "
        "apply: the peak of your own training loop under mpplan.apply (planned with "
        "mpplan.runtime.apply_budget.plan_for_apply at the remat budget or the device's capacity, measured by "
        "training through apply with torch.optim); needs model.torch",
        default="plan",
    )
    step_in_backward: bool = _doc(
        "fit: apply: judge and measure your loop with the optimizer stepping per parameter inside backward "
        "(mpplan.apply(..., step_in_backward=optimizer)): each gradient is freed once its parameter is updated, "
        "which lowers the floor set by gradients and the optimizer's temporaries; needs an optimizer",
        default=False,
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


#: Most devices one config may expand to: placement and planning work grows with the device count.
MAX_DEVICES = 1024
#: Most units (layers, blocks, levels) a synthetic graph may have.
MAX_SYNTHETIC_UNITS = 100_000

#: Largest integer a config key takes: beyond it, 64-bit arithmetic in numpy and torch overflows.
MAX_INT = 2**62


def schema_fields(cls: type) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every key of the schema, for the docs."""
    rows: list[tuple[str, str, str, str]] = []
    _walk_schema(cls, "", rows)
    return rows


def yaml_key(f: dataclasses.Field[Any]) -> str:
    """The YAML key of schema field ``f``: its name unless the field says otherwise (``from``)."""
    return f.metadata.get("key") or f.name


def join_key(prefix: str, key: str) -> str:
    """``prefix.key``, or ``key`` at the top level."""
    return f"{prefix}.{key}" if prefix else key


def _walk_schema(cls: type, prefix: str, rows: list[tuple[str, str, str, str]]) -> None:
    hints = schema_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = join_key(prefix, yaml_key(f))
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

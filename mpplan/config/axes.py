"""The axes of ``search.space``: listed values, ranges and generated axes, checked one by one.

An axis is a list of values, an arithmetic range ``{min, max, step}``, a geometric range
``{min, max, factor}``, or a generated axis ``{generate: mxnet, ntrial: 6}`` whose
values come from the base config's graph.  The search's grid, candidate configs and keys
are ``mpplan.cluster.space``'s, which builds on these; they live here because checking a
config checks its axes, and the config sits below the cluster.
"""

from __future__ import annotations

from typing import Any

from mpplan.config.convert import type_name
from mpplan.config.schema import SearchSection
from mpplan.errors import ConfigError


#: Most values one search axis, and candidates one search grid, may have.
MAX_AXIS_VALUES = 10_000
MAX_GRID = 100_000

#: Generated ``search.space`` axes: ``{generate: NAME}`` -> the one key it generates values for.
GENERATORS = {"mxnet": "planner.remat.threshold"}


def axis_generator(spec: Any) -> str | None:
    """The generator a ``search.space`` axis names (``{generate: mxnet}``), or None for listed values."""
    return spec.get("generate") if isinstance(spec, dict) and "generate" in spec else None


def check_generated_axis(key: str, spec: dict[str, Any], base: dict[str, Any], source: str, where: str) -> int:
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
            f"{source}: {where}: expected a list of values or a range {{min, max, step|factor}}, got {type_name(spec)}"
        )
    keys = set(spec)
    if not {"min", "max"} <= keys or len(keys & {"step", "factor"}) != 1 or keys - {"min", "max", "step", "factor"}:
        raise ConfigError(
            f"{source}: {where}: a range needs min, max and exactly one of step, factor; got {sorted(keys)}"
        )
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


def batch_axis_key(search: SearchSection) -> str:
    """The dotted config key ``search.batch_key`` names: a bare name is a workload key."""
    return search.batch_key if "." in search.batch_key else f"workload.{search.batch_key}"


def check_batch_axis(search: SearchSection, source: str) -> None:
    """``max_batch`` bisects one listed axis (``search.batch_key``) of integers (batch sizes) or numbers."""
    if search.objective != "max_batch":
        return
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


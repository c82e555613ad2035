"""The search space: axes from ``search.space``, their grid, candidate configs and stable keys.

A point of the grid is a tuple of ``(dotted key, value)`` overrides.  Its config is
the run config with the overrides applied exactly as ``--set`` applies them
(``apply_override`` then ``parse_config``), so a candidate is validated like any
config.  Its key hashes what determines a measurement: the graph's content hash,
the planner settings, the devices and the workload.  Overrides that change none of
these (an output folder, say) give the same key, and the candidate is measured once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from mpplan.config import (
    Config,
    Device,
    SearchSection,
    apply_override,
    axis_generator,
    axis_values,
    batch_axis_key,
    format_override,
    parse_config,
)

Overrides = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Axis:
    """One searched config key and its values, in the order the config gave them."""

    key: str
    values: tuple[Any, ...]


def axes(search: SearchSection, source: str = "<config>", base: Config | None = None) -> tuple[Axis, ...]:
    """The axes of ``search.space`` (already validated by ``parse_config``), in config order.

    Generated axes (``{generate: mxnet}``) take their values from ``base``'s graph.
    """
    found = []
    for key, spec in search.space.items():
        if axis_generator(spec) is not None:
            if base is None:
                raise ValueError(f"search.space.{key}: a generated axis needs the base config")
            found.append(Axis(key, generated_values(base, spec)))
        else:
            found.append(Axis(key, axis_values(spec, source, f"search.space.{key}")))
    return tuple(found)


def generated_values(base: Config, spec: dict[str, Any]) -> tuple[Any, ...]:
    """The values a generator makes from ``base``'s graph: MXNet's mirror thresholds."""
    from mpplan.capture import graph_from_config
    from mpplan.passes.remat import mirror_thresholds

    return mirror_thresholds(graph_from_config(base), ntrial=spec.get("ntrial", 6))


def split_batch_axis(search: SearchSection, all_axes: Sequence[Axis]) -> tuple[Axis, tuple[Axis, ...]]:
    """For ``max_batch``: the batch axis, its values sorted ascending, and the other axes."""
    key = batch_axis_key(search)
    (batch,) = [a for a in all_axes if a.key == key]
    values = tuple(sorted(set(batch.values)))
    return Axis(key, values), tuple(a for a in all_axes if a.key != key)


def grid(grid_axes: Sequence[Axis]) -> Iterator[Overrides]:
    """Every combination of the axes' values, first axis slowest; no axes give one empty point."""
    for values in itertools.product(*(a.values for a in grid_axes)):
        yield tuple((a.key, v) for a, v in zip(grid_axes, values))


def base_raw(config: Config) -> dict[str, Any]:
    """The config as the YAML mapping it was parsed from, without its ``search`` section.

    ``parse_config(base_raw(c), c.source)`` equals ``c`` with a default search section.
    """
    raw: dict[str, Any] = _to_raw(config)
    raw.pop("search", None)
    return raw


def candidate_config(base: dict[str, Any], overrides: Overrides, source: str) -> Config:
    """The config of one point: ``base`` with each override applied as ``--set`` would.

    Raises ``ConfigError`` when the combination is invalid (each value alone was checked).
    """
    raw = base
    for key, value in overrides:
        raw = apply_override(raw, format_override(key, value), source)
    return parse_config(raw, source)


def candidate_key(graph_hash: str, planner: dict[str, Any], devices: Sequence[Device], workload: dict[str, int]) -> str:
    """A stable hex key of what determines a candidate's plan and measurement.

    ``planner`` is the whole ``planner`` section (``planner_section``), so a knob the
    planner gains later (remat, say) separates candidates without touching this code.

    >>> from mpplan.config import Device
    >>> candidate_key("g", {"schedule": "dfs"}, [Device("a", 10)], {"batch": 2}) == candidate_key(
    ...     "g", {"schedule": "dfs"}, [Device("a", 10)], {"batch": 2})
    True
    """
    payload = {
        "graph": graph_hash,
        "planner": planner,
        "devices": [[d.name, d.capacity, d.reserve] for d in devices],
        "workload": dict(sorted(workload.items())),
    }
    return _digest(payload)


def planner_section(config: Config) -> dict[str, Any]:
    """The config's ``planner`` section as YAML-shaped data, every key present (defaults included)."""
    section: dict[str, Any] = _to_raw(config.planner)
    return section


def invalid_key(overrides: Overrides) -> str:
    """The key of a point whose config is invalid: it has no graph, so its overrides identify it."""
    return "invalid-" + _digest([[k, v] for k, v in overrides])


def workload_key(config: Config) -> str:
    """What a built model depends on: the model section and the workload (the graph cache's key)."""
    raw: dict[str, Any] = _to_raw(config)
    return _digest({"model": raw["model"], "workload": raw["workload"], "source": config.source})


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _to_raw(value: Any) -> Any:
    """A schema dataclass back to YAML-shaped data: YAML keys, lists for tuples, internal fields dropped."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.metadata.get("key") or f.name: _to_raw(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not f.metadata.get("internal")
        }
    if isinstance(value, (list, tuple)):
        return [_to_raw(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_raw(v) for k, v in value.items()}
    return value

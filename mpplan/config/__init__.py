"""The YAML run configuration: one schema for every command, validated with precise errors.

The package, by concept:

* ``schema``: the frozen dataclasses of every section, each field documented; the
  configuration reference in ``docs/`` is generated from them, so code and docs cannot drift;
* ``convert``: a raw mapping read into the schema, field by field;
* ``overrides``: ``--set dotted.key=value``;
* ``axes``: the values of ``search.space``'s axes (the grid is ``mpplan.cluster.space``'s);
* ``load``: ``load_config`` and ``parse_config``, the checks across fields, ``resolve_devices``.

Remat budgets are parsed by ``mpplan.budget`` (re-exported here), which the passes use
without importing the config.  Every error is one line, ``<file>: <dotted.key>: <what is
wrong>``.  YAML is read by ``mpplan.reading`` (``safe_load``'s types; no alias bombs,
duplicate keys or runaway nesting).  ``model.torch.factory`` imports and calls user code
*by design*: run configs you trust.
"""

from __future__ import annotations

from mpplan.budget import capacity_fraction, parse_budget
from mpplan.config.axes import (
    GENERATORS,
    MAX_AXIS_VALUES,
    MAX_GRID,
    axis_generator,
    axis_values,
    batch_axis_key,
)
from mpplan.config.load import load_config, parse_config, resolve_devices
from mpplan.config.overrides import apply_override, format_override
from mpplan.config.schema import (
    MAX_DEVICES,
    MAX_INT,
    MAX_SYNTHETIC_UNITS,
    Config,
    Device,
    DeviceSpec,
    GraphModel,
    ModelSection,
    OutputSection,
    PlannerSection,
    RematSection,
    SearchMeasureSection,
    SearchSection,
    ShiftSection,
    Size,
    TorchModel,
    schema_fields,
)

__all__ = [
    "GENERATORS", "MAX_AXIS_VALUES", "MAX_DEVICES", "MAX_GRID", "MAX_INT", "MAX_SYNTHETIC_UNITS",
    "Config", "Device", "DeviceSpec", "GraphModel", "ModelSection", "OutputSection", "PlannerSection",
    "RematSection", "SearchMeasureSection", "SearchSection", "ShiftSection", "Size", "TorchModel",
    "apply_override", "axis_generator", "axis_values", "batch_axis_key", "capacity_fraction",
    "format_override", "load_config", "parse_budget", "parse_config", "resolve_devices", "schema_fields",
]

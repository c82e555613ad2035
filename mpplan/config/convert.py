"""A raw YAML mapping read into the schema's dataclasses, field by field, with one-line errors.

Unknown keys, missing keys and values of the wrong type are ``ConfigError``s naming the
file and the dotted key (``<file>: planner.alignment: expected an integer, got 'x'``).
Sizes (``Size`` fields) accept ``16GiB``, ``512MB`` or integers; integers are at most 2**62.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from mpplan.config.schema import MAX_INT, Size, join_key, schema_hints, yaml_key
from mpplan.errors import ConfigError
from mpplan.units import parse_size


def parse_section(cls: type, raw: Any, source: str, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {where or '(top level)'}: expected a mapping, got {type_name(raw)}")
    hints = schema_hints(cls)
    fields = {yaml_key(f): f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    for key in raw:
        if key not in fields:
            raise ConfigError(
                f"{source}: {join_key(where, str(key))}: unknown key; expected one of {', '.join(fields)}"
            )
    values = {}
    for name, f in fields.items():
        key = join_key(where, name)
        if name in raw:
            values[f.name] = _convert(hints[f.name], raw[name], source, key)
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
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return parse_section(hint, value, source, key)
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}: expected a list, got {type_name(value)}")
        return tuple(_convert(args[0], v, source, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping, got {type_name(value)}")
        return {str(k): _convert(args[1], v, source, f"{key}.{k}") for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {key}: expected an integer, got {show_value(value)}")
        if abs(value) > MAX_INT:
            raise ConfigError(f"{source}: {key}: expected an integer of at most 2**62, got {show_value(value)}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) > MAX_INT:
            raise ConfigError(f"{source}: {key}: expected a number of at most 2**62, got {show_value(value)}")
        if not math.isfinite(value):
            raise ConfigError(f"{source}: {key}: expected a finite number, got {show_value(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {key}: expected a string, got {show_value(value)}")
        return value
    raise AssertionError(f"unsupported schema type {hint!r} at {key}")


def show_value(value: Any) -> str:
    """``repr`` cut to 40 characters, so a 400-digit number or a huge list still makes one short line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def type_name(value: Any) -> str:
    """The YAML-facing name of a value's type (``nothing`` for null)."""
    return "nothing" if value is None else type(value).__name__

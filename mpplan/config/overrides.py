"""``--set dotted.key=value`` overrides, applied to the raw YAML mapping before it is checked.

A value is read as YAML (``--set planner.alignment=128`` sets an integer); list
elements are addressed by index (``devices.0.count``).  ``format_override`` writes the
item that reads back as a given value, which is how the search makes its candidates.
"""

from __future__ import annotations

from typing import Any

import yaml

from mpplan.errors import ConfigError
from mpplan.reading import DocumentError, load_yaml


def apply_override(raw: dict[str, Any], item: str, source: str) -> dict[str, Any]:
    """Return a copy of ``raw`` with ``dotted.key=value`` set (value parsed as YAML)."""
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{source}: --set {item!r}: expected dotted.key=value")
    try:
        value = load_yaml(text)
    except DocumentError as exc:
        raise ConfigError(f"{source}: --set {key}: {exc}") from None
    root: dict[str, Any] = _deep_copy(raw)
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


def format_override(key: str, value: Any) -> str:
    """The ``dotted.key=value`` item that ``apply_override`` reads back as ``value`` (YAML flow style).

    >>> format_override("planner.schedule", "yes")
    "planner.schedule='yes'"
    """
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).removesuffix(chr(10) + '...' + chr(10)).strip()}"


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value

"""Remat budgets as users write them: bytes, a fraction of the no-remat peak, or of a device's capacity.

The config checks a budget with these when it is loaded, and the remat pass and the planner
turn it into bytes; this module sits below both, so no pass imports the config.

>>> parse_budget("16GiB"), parse_budget(0.8), capacity_fraction("90% capacity")
(17179869184, 0.8, 0.9)
"""

from __future__ import annotations

import re
from typing import Any

from mpplan.units import parse_size


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

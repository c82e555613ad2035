"""Argument checks shared by the synthetic generators: one ``ValueError`` naming the generator and field."""

from __future__ import annotations

from mpplan.capture.synthetic.builder import OPTIMIZER_STATES
from mpplan.units import DTYPE_BYTES


def check_common(kind: str, dtype: object, train: object, optimizer: object, seed: object, name: object) -> None:
    """Check the arguments every generator takes; ``optimizer`` may also be ``"none"``."""
    if not isinstance(dtype, str) or dtype.removeprefix("torch.") not in DTYPE_BYTES:
        raise ValueError(f"{kind}: dtype: expected one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    if not isinstance(train, bool):
        raise ValueError(f"{kind}: train: expected true or false, got {train!r}")
    if optimizer is not None and optimizer != "none" and optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"{kind}: optimizer: expected one of none, {', '.join(OPTIMIZER_STATES)}, got {optimizer!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"{kind}: seed: expected an integer, got {seed!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"{kind}: name: expected a non-empty string, got {name!r}")


def positive(kind: str, **values: object) -> None:
    """Check that each of ``values`` is a positive ``int`` (``bool`` is not one)."""
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{kind}: {key}: expected a positive integer, got {value!r}")

"""Byte sizes as users write them (``16GiB``, ``512MB``, ``0.5 GB``) and dtype widths."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
#: Largest size accepted (2**62 bytes, 4 EiB): beyond it, 64-bit arithmetic in numpy and torch overflows.
#: The planner's int64 fast paths (``Memory.of``, ``sweep_load``) run only while their sums stay below it
#: (a graph built in Python is not held to it), else fall back to Python ints.
MAX_BYTES = 2**62

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")

#: Bytes per element of the dtypes graph files and captured models name.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complex64": 8,
    "complex128": 16,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def parse_size(value: object) -> int:
    """Bytes from an int or a string such as ``"16GiB"``, ``"512MB"`` or ``"64"``.

    Decimal units (kB, MB, GB) are powers of 1000, binary units (KiB, MiB, GiB)
    and the bare letters K, M, G powers of 1024.  Raises ``ValueError`` with the
    accepted forms on anything else, negative values included.

    >>> parse_size("1.5KiB"), parse_size("2MB"), parse_size(7)
    (1536, 2000000, 7)
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a size such as 16GiB or 512MB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a non-negative size, got {value}")
        return _bounded(value, value)
    if isinstance(value, float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"expected a non-negative size, got {value}")
        return _bounded(value, value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            return _bounded(float(match.group(1)) * _UNITS[match.group(2).lower()], value)
    raise ValueError(f"expected a size such as 16GiB, 512MB or an integer, got {_short(value)}")


def _bounded(size: int | float, written: object) -> int:
    """``int(size)``, refusing sizes past ``MAX_BYTES`` (a float may be ``inf`` after a huge mantissa)."""
    if not size <= MAX_BYTES:
        raise ValueError(f"a size of at most 2**62 bytes (4 EiB) is accepted, got {_short(written)}")
    return int(size)


def _short(value: object) -> str:
    """``repr`` cut to 40 characters: a 400-digit number makes no readable error line."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"


def format_size(nbytes: int | float) -> str:
    """A short human form with binary units: ``format_size(3 * 2**20) == '3.00 MiB'``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def dtype_bytes(dtype: str) -> int:
    """Element width of ``dtype`` (``torch.`` prefix allowed); ``ValueError`` when unknown."""
    key = dtype.removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]

"""The graph's content hash (``plan.json``'s ``graph.hash``): its two versions and how a claim is matched.

A plan names the graph it was made for by this hash, so a hash on disk must keep meaning the
same graph.  Version 1 (plans made before 2026-11-27) is sha256 of the tensor and op field
tuples as one JSON text: about 1 s for a 100k-op graph, most of it json walking 2.3M nested
values.  Version 2 feeds the same fields to sha256 column by column (one field of every
tensor, then the next), each column in the cheapest encoding that still tells every value
apart, and is marked by the ``v2-`` prefix.  A claim is compared with the hash of its own
version (``hash_matches``), so older plans keep verifying.

Both ignore the graph's name: the same ops and tensors under another name are the same graph.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Callable
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpplan.graph import Graph

#: What starts a version 2 hash; a version 1 hash is 16 hex digits alone.
VERSION_2 = "v2-"

_TENSOR_FIELDS = attrgetter("name", "nbytes", "kind", "shape", "dtype", "alias_of", "grad_of")
_OP_FIELDS = attrgetter(
    "name", "type", "inputs", "outputs", "cost", "device", "backward_of", "module", "stage", "recompute_of"
)
_JSON = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def hash_v1(graph: Graph) -> str:
    """Version 1: sha256 of ``[tensor field lists, op field lists, sorted outputs]`` as compact JSON."""
    # Field tuples by ``attrgetter`` (json writes a tuple as a list, and a ``Kind``, a str enum, as its
    # value): the same text as lists built field by field.  Fields hold no containers but tuples of names
    # and sizes, so no cycle: the encoder need not look for one.
    tensors = list(map(_TENSOR_FIELDS, graph.tensors))
    ops = list(map(_OP_FIELDS, graph.ops))
    payload = json.dumps([tensors, ops, sorted(graph.outputs)], separators=(",", ":"), check_circular=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def hash_v2(graph: Graph) -> str:
    """Version 2: sha256 over the fields column by column; ``v2-`` and 16 hex digits.

    Each column is one piece of the digest's input whose end can be told from its content (a
    JSON list ends at its bracket; packed numbers come after a tag naming their encoding and their
    count), so no two graphs' columns run together into the same bytes.  Names stay JSON (its C
    encoder writes a list of strings as fast as joining them would); sizes, costs and shapes are
    packed, which skips formatting each number as text.
    """
    digest = hashlib.sha256()
    tensors, ops = graph.tensors, graph.ops
    for field, encode in _TENSOR_COLUMNS:
        digest.update(encode(list(map(attrgetter(field), tensors))))
    for field, encode in _OP_COLUMNS:
        digest.update(encode(list(map(attrgetter(field), ops))))
    digest.update(_json(sorted(graph.outputs)))
    return VERSION_2 + digest.hexdigest()[:16]


def hash_matches(claimed: str, graph: Graph) -> bool:
    """Whether ``claimed`` (a plan's ``graph.hash``) is ``graph``'s hash, in the version ``claimed`` has."""
    return claimed == graph_hash_like(claimed, graph)


def graph_hash_like(claimed: str, graph: Graph) -> str:
    """``graph``'s hash in the version of ``claimed``: the current one unless ``claimed`` is version 1."""
    return graph.content_hash if claimed.startswith(VERSION_2) else graph.content_hash_v1


def _json(values: list[Any]) -> bytes:
    """Any column: JSON tells ``None`` from ``""`` and an int from a float, and ends at its bracket."""
    return _JSON(values).encode()


def _packed(tag: bytes, numbers: array[Any]) -> bytes:
    """``tag`` (which encoding follows), the count, then the numbers little-endian: the count says where they end."""
    if sys.byteorder == "big":
        numbers.byteswap()
    return tag + len(numbers).to_bytes(8, "little") + numbers.tobytes()


def _sizes(values: list[Any]) -> bytes:
    """Integers packed as int64 (json for a size beyond int64 or a value that is no int)."""
    try:
        return _packed(b"q", array("q", values))
    except (OverflowError, TypeError):
        return _json(values)


def _costs(values: list[Any]) -> bytes:
    """Numbers packed as float64 (json when one is no float: an int cost stays told apart from a float)."""
    if not all(type(v) is float for v in values):
        return _json(values)
    return _packed(b"d", array("d", values))


def _shapes(values: list[Any]) -> bytes:
    """Shapes: each one's length, then every dimension, packed (json when a shape is unknown or odd)."""
    if None in values:
        return _json(values)
    try:
        return _packed(b"n", array("q", map(len, values))) + _packed(b"q", array("q", chain.from_iterable(values)))
    except (OverflowError, TypeError):
        return _json(values)


_Encoder = Callable[[list[Any]], bytes]
_TENSOR_COLUMNS: tuple[tuple[str, _Encoder], ...] = (
    ("name", _json), ("nbytes", _sizes), ("kind", _json), ("shape", _shapes), ("dtype", _json),
    ("alias_of", _json), ("grad_of", _json),
)
_OP_COLUMNS: tuple[tuple[str, _Encoder], ...] = (
    ("name", _json), ("type", _json), ("inputs", _json), ("outputs", _json), ("cost", _costs),
    ("device", _json), ("backward_of", _json), ("module", _json), ("stage", _json),
    ("recompute_of", _json),
)

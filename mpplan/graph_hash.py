"""The graph's content hash (``plan.json``'s ``graph.hash``): its two versions and how a claim is matched.

A plan names the graph it was made for by this hash, so a hash on disk must keep meaning the
same graph.  Version 1 (plans made before 2026-11-27) is sha256 of the tensor and op field
tuples as one JSON text: about 1 s for a 100k-op graph, most of it json walking 2.3M nested
values.  Version 2 feeds the same fields to sha256 as ``marshal`` writes them (a third of the
time), and is marked by the ``v2-`` prefix.  A claim is compared with the hash of its own
version (``hash_matches``), so older plans keep verifying.

Both ignore the graph's name: the same ops and tensors under another name are the same graph.
"""

from __future__ import annotations

import hashlib
import json
import marshal
from operator import attrgetter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpplan.graph import Graph

#: What starts a version 2 hash; a version 1 hash is 16 hex digits alone.
VERSION_2 = "v2-"

_TENSOR_FIELDS = attrgetter("name", "nbytes", "kind", "shape", "dtype", "alias_of", "grad_of")
_TENSOR_ROW = attrgetter("name", "nbytes", "shape", "dtype", "alias_of", "grad_of")
_KIND = attrgetter("kind")
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
    """Version 2: sha256 of the tensors' and ops' field rows as ``marshal`` version 0; ``v2-`` and 16 hex digits.

    One pass over the objects (a field read per column would walk 300k scattered objects 17
    times), then one C call per list.  Marshal's version 0 writes each value by type and value
    only (no references between equal objects, no interning marks, floats as their 17-digit
    text), so equal graphs give equal bytes; tests/test_graph_hash.py pins the digest of a graph
    so a Python whose format moved would fail there, not in a user's verify.  The kinds (a str
    enum, which marshal refuses) go as a JSON list of their values; a row holding a value of
    another type (a subclass of str or tuple, say) sends its list through JSON, with its own tag.
    Each piece ends where its content says (marshal and JSON lists carry their extent).
    """
    digest = hashlib.sha256()
    digest.update(_rows(list(map(_TENSOR_ROW, graph.tensors))))
    digest.update(_JSON(list(map(_KIND, graph.tensors))).encode())
    digest.update(_rows(list(map(_OP_FIELDS, graph.ops))))
    digest.update(_JSON(sorted(graph.outputs)).encode())
    return VERSION_2 + digest.hexdigest()[:16]


def hash_matches(claimed: str, graph: Graph) -> bool:
    """Whether ``claimed`` (a plan's ``graph.hash``) is ``graph``'s hash, in the version ``claimed`` has."""
    return claimed == graph_hash_like(claimed, graph)


def graph_hash_like(claimed: str, graph: Graph) -> str:
    """``graph``'s hash in the version of ``claimed``: the current one unless ``claimed`` is version 1."""
    return graph.content_hash if claimed.startswith(VERSION_2) else graph.content_hash_v1


def _rows(rows: list[tuple[Any, ...]]) -> bytes:
    """``rows`` as marshal version 0, or as JSON when a value is of a type marshal does not take."""
    try:
        return b"m" + marshal.dumps(rows, 0)
    except ValueError:
        return b"j" + _JSON(rows).encode()

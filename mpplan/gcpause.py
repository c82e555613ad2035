"""Pause Python's cyclic garbage collector while a command builds large acyclic structures.

A 100k-op graph is millions of small objects (tensors, ops, tuples of ids) that reference
counting frees on its own.  The cyclic collector still scans them: each time allocations
pass its threshold, and a full pass over every live object whenever the survivors grow by a
quarter, so loading and planning a large graph spent about a third of its time in
collections that find nothing.  The CLI's short-lived planning verbs run with it paused,
then collect once.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with the cyclic collector off (as it was before afterwards, and one
    collection then if it was on), so no cycle made meanwhile outlives the body for long.

    >>> with collector_paused():
    ...     gc.isenabled()
    False
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
            gc.collect(0)

"""What a replay of a plan works on and gives: tensors and copies by number, and who touches each storage,
where and when.

Two modules compute a ``Replay``: ``replay`` (step by step, wording the first fault) and
``sweep`` (numpy columns, for plans without copies); the checks after it read it.  It
lives here, apart from both and without numpy, so that ``replay`` can import ``sweep`` at
its top while the verifier's package (and so the CLI) starts without numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from mpplan.graph import Graph


@dataclass(frozen=True, slots=True)
class Numbering:
    """The graph's tensors, then the plan's copies, by number: ``names``, its inverse ``index``, and
    ``root_of``, the number of each one's storage (the root of its alias chain; a copy is its own)."""

    names: list[str]
    index: dict[str, int]
    root_of: list[int]


@dataclass(frozen=True, slots=True)
class Replay:
    """Per storage (root tensor or copy), by its number: its first and last step, and its one device.

    Storages are numbered as ``names`` lists them (the graph's tensors, then the copies;
    ``index`` is the inverse); ``order`` holds the numbers of the storages the schedule
    touches, in the order first touched.  ``first``, ``last`` and ``home`` hold -1, -1 and
    None for the rest.  The checks after the replay run on these numbers; names come back
    only to word an error.

    With ``dependencies``: ``users[s]`` are the steps that touch ``s`` (by name) on its device,
    and ``preds[i]`` the steps that step ``i`` must wait for in the executed DAG (data,
    copies, and the in-place version order), for the parallel-safety check.
    """

    names: list[str]
    index: dict[str, int]
    order: list[int]
    first: list[int]
    last: list[int]
    home: list[str | None]
    users: dict[str, list[int]]
    preds: list[list[int]]


def numbering(graph: Graph) -> tuple[list[str], dict[str, int]]:
    """The graph's tensor names by number, and the inverse; the plan's copies are numbered after them.

    A validated graph has numbered its tensors once already (``graph.topology``, the planner's
    view of the graph): its index is copied only once proven to be exactly these numbers (its keys
    are the names in order, its values ``0..n-1``: two passes in C, about a quarter of building
    it), so a fault in the topology cannot pass into the verifier.  Otherwise the numbers are
    built here.
    """
    names = list(map(attrgetter("name"), graph.tensors))
    topology = vars(graph).get("topology")  # only when already built: building it here would validate
    if topology is not None and is_numbering(topology.tensor_index, names):
        return names, dict(topology.tensor_index)
    return names, {name: i for i, name in enumerate(names)}


def is_numbering(index: dict[str, int], names: list[str]) -> bool:
    """Whether ``index`` is exactly ``{names[i]: i}`` (which also says the names are distinct); ints only,
    as ``True == 1 == 1.0`` would pass the comparison and fail later as a list index."""
    values = list(index.values())
    return list(index) == names and values == list(range(len(names))) and set(map(type, values)) <= {int}

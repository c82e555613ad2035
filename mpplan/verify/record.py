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

    A validated graph has numbered its tensors once already (``graph.topology``, built by the
    graph itself, not by any planner): that index is copied, which is many times faster than
    hashing 200k names anew.  Otherwise (a graph rewritten with recomputes, not yet validated)
    the same numbers are built here.
    """
    names = list(map(attrgetter("name"), graph.tensors))
    topology = vars(graph).get("topology")  # only when already built: building it here would validate
    if topology is not None:
        return names, dict(topology.tensor_index)
    return names, {name: i for i, name in enumerate(names)}

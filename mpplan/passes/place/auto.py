"""Choosing a placement: ``PLACEMENTS`` names every strategy, and ``auto`` keeps the best that fits.

``PLACEMENTS`` is the one list of ``planner.placement`` choices: the config's schema and
the generated reference take their names from it.  Every strategy has one signature,
``(graph, order, capacity, options) -> device per op``; ``capacity`` maps each device
name, in the configured order, to its usable bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from mpplan.errors import ConfigError
from mpplan.graph import Graph
from mpplan.passes.place.manual import place_manual, place_single
from mpplan.passes.place.pipeline import place_pipeline
from mpplan.passes.place.scoring import score
from mpplan.passes.place.shifting import shift_placement


@dataclass(frozen=True)
class PlacementOptions:
    """What the strategies read besides the devices (``planner.device_map``, ``no_split``, ``shift``)."""

    device_map: Mapping[str, str] = field(default_factory=dict)
    no_split: tuple[str, ...] = ()
    shift_activations: Any = "auto"
    shift_from: str | None = None
    shift_to: str | None = None


Placement = Callable[[Graph, Sequence[int], Mapping[str, int], PlacementOptions], tuple[str, ...]]


def _single(
    graph: Graph, order: Sequence[int], capacity: Mapping[str, int], options: PlacementOptions
) -> tuple[str, ...]:
    return place_single(graph, next(iter(capacity)))


def _pipeline(
    graph: Graph, order: Sequence[int], capacity: Mapping[str, int], options: PlacementOptions
) -> tuple[str, ...]:
    return place_pipeline(graph, order, capacity, no_split=options.no_split)


def _shift(
    graph: Graph, order: Sequence[int], capacity: Mapping[str, int], options: PlacementOptions
) -> tuple[str, ...]:
    return shift_placement(
        graph, order, capacity, activations=options.shift_activations, src=options.shift_from, dst=options.shift_to
    )


def _manual(
    graph: Graph, order: Sequence[int], capacity: Mapping[str, int], options: PlacementOptions
) -> tuple[str, ...]:
    return place_manual(graph, order, list(capacity), options.device_map)


def _auto(
    graph: Graph, order: Sequence[int], capacity: Mapping[str, int], options: PlacementOptions
) -> tuple[str, ...]:
    return choose_placement(graph, order, capacity, "auto", options)[0]


#: Every ``planner.placement`` choice by name.
PLACEMENTS: dict[str, Placement] = {
    "single": _single,
    "pipeline": _pipeline,
    "shift": _shift,
    "manual": _manual,
    "auto": _auto,
}


def choose_placement(
    graph: Graph,
    order: Sequence[int],
    capacity: Mapping[str, int],
    strategy: str = "auto",
    options: PlacementOptions = PlacementOptions(),
) -> tuple[tuple[str, ...], str]:
    """The op devices by ``strategy`` and the strategy that made them; one device is always ``single``.

    ``auto`` scores single, pipeline and (with a ``device_map``) manual exactly after copies, and
    shift too on two devices or when the pipeline does not fit; it keeps the best that fits
    (least worst ratio, then cross-device bytes), or the least bad when none does.
    """
    if strategy not in PLACEMENTS:
        raise ConfigError(f"planner.placement: expected one of {', '.join(PLACEMENTS)}, got {strategy!r}")
    if strategy == "single" or len(capacity) == 1:
        return _single(graph, order, capacity, options), "single"
    if strategy != "auto":
        return PLACEMENTS[strategy](graph, order, capacity, options), strategy
    candidates = {
        "single": _single(graph, order, capacity, options),
        "pipeline": _pipeline(graph, order, capacity, options),
    }
    if options.device_map:
        candidates["manual"] = _manual(graph, order, capacity, options)
    scored = {name: score(graph, order, op_device, capacity) for name, op_device in candidates.items()}
    # Shift moves activations between two devices only: on more devices it is tried when the
    # pipeline does not fit, since its greedy search costs many exact evaluations.
    if len(capacity) == 2 or scored["pipeline"][0] > 1.0:
        candidates["shift"] = _shift(graph, order, capacity, options)
        scored["shift"] = score(graph, order, candidates["shift"], capacity)
    best = min(scored, key=lambda n: (scored[n][0] > 1.0, scored[n]))
    return candidates[best], best

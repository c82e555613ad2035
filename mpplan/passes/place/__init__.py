"""Placement: which device runs each op.

The package: ``complete`` (anchors to every op), ``manual`` (single, manual),
``partition`` (the pipeline's exact DP), ``pipeline``, ``shifting`` (shift and its greedy
choice), ``scoring`` (every placement judged exactly after copies), ``modules`` (the device of each module
path) and ``auto``
(``PLACEMENTS``, the registry of ``planner.placement`` choices, and ``choose_placement``).

* ``single``: everything on the first device (the baseline every report shows).
* ``manual``: ``device_map`` (module path prefix -> device, accelerate's format), or
  the ops' own ``device`` fields in graph files.
* ``pipeline``: a contiguous partition of the forward ops (in schedule order) into
  one stage per device, by an exact DP minimising the largest predicted
  ``peak / capacity``, then cross-device bytes.
* ``shift``: Caffe2's ShiftActivationDevices, generalised (see ``shift``), the
  activations named or chosen greedily (``auto_shift``).
* ``auto``: the best of the above that fits (``choose_placement``).

Only *anchor* ops are placed directly (forward ops); ``complete`` derives the rest:
a backward op runs where its forward op ran, a recompute where its original ran
(so recomputing never adds cross-device traffic of its own), an op that updates a parameter or
optimizer state in place runs where that tensor is used, and any other op follows
the producer of its inputs.  Pure view ops stay with their base.
"""

from __future__ import annotations

from mpplan.passes.place.auto import PLACEMENTS, Placement, PlacementOptions, choose_placement
from mpplan.passes.place.complete import complete, forward_ops
from mpplan.passes.place.manual import place_manual, place_single
from mpplan.passes.place.modules import module_devices
from mpplan.passes.place.partition import SegmentCost, partition
from mpplan.passes.place.pipeline import default_units, make_units, optimizer_ops, place_pipeline, pull_tied_readers
from mpplan.passes.place.scoring import DeviceLoad, device_loads, score, worst_ratio
from mpplan.passes.place.shifting import auto_shift, shift, shift_placement

__all__ = [
    "DeviceLoad",
    "PLACEMENTS",
    "Placement",
    "PlacementOptions",
    "SegmentCost",
    "auto_shift",
    "choose_placement",
    "complete",
    "default_units",
    "device_loads",
    "forward_ops",
    "make_units",
    "module_devices",
    "optimizer_ops",
    "partition",
    "place_manual",
    "place_pipeline",
    "place_single",
    "pull_tied_readers",
    "score",
    "shift",
    "shift_placement",
    "worst_ratio",
]

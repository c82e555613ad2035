"""The liveness stage of the pipeline: ``mpplan.liveness`` under its pass name.

Live ranges are computed in ``mpplan.liveness``, on the floor of the peak simulator
(``mpplan.sim``), which scores orders with them; this module keeps the passes' import
path for code written against it.
"""

from __future__ import annotations

from mpplan.liveness import LiveRange, Liveness, check_order, live_ranges

__all__ = ["LiveRange", "Liveness", "check_order", "live_ranges"]

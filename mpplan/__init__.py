"""mpplan: plan, verify, measure and search the memory of deep-learning models over GPUs.

The facade: the verbs and records users need.  Verbs that need torch (``capture``,
``evaluate``, ``apply``) are imported on first use, so planning a graph file never
pays for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from mpplan.config import Device, load_config
from mpplan.errors import (
    CaptureError,
    ConfigError,
    GraphError,
    GraphFileError,
    InfeasibleError,
    MpplanError,
    PlanError,
    VerificationError,
)
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.plan import Plan, load_plan, save_plan

__version__ = "0.1.0"

_LAZY = {
    "capture": "mpplan.capture.torch_capture",
    "capture_program": "mpplan.capture.torch_capture",
    "load_graph": "mpplan.capture.graph_file",
    "save_graph": "mpplan.capture.graph_file",
    "synthetic_graph": "mpplan.capture.synthetic",
    "assign_offsets": "mpplan.passes.assign",
    "share_objects": "mpplan.passes.assign",
    "schedule": "mpplan.passes.schedule",
    "plan": "mpplan.planner",
    "PlannerSettings": "mpplan.planner",
    "verify": "mpplan.verify",
    "evaluate": "mpplan.runtime",
    "apply": "mpplan.runtime",
    "Measurement": "mpplan.runtime",
    "run_config": "mpplan.runtime",
    "remat": "mpplan.passes.remat",
    "run_search": "mpplan.cluster",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mpplan' has no attribute {name!r}")


__all__ = [
    "CaptureError",
    "ConfigError",
    "Device",
    "Graph",
    "GraphError",
    "GraphFileError",
    "InfeasibleError",
    "Kind",
    "MpplanError",
    "Op",
    "Plan",
    "PlanError",
    "Tensor",
    "VerificationError",
    "load_config",
    "load_plan",
    "save_plan",
    *_LAZY,
]

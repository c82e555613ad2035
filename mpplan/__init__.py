"""mpplan: plan, verify, measure and search the memory of deep-learning models over GPUs.

The facade: the verbs and records users need.  Verbs that need torch (``capture``,
``evaluate``, ``apply``) are imported on first use, so planning a graph file never
pays for importing torch.

Three verbs share their name with a submodule: ``mpplan.plan`` is the planner's
``plan`` function (the record and ``plan.json`` live in the module ``mpplan.plan``),
``mpplan.verify`` the verifier's function and ``mpplan.capture`` the torch capture.
The import system binds every loaded submodule onto its package, which would hide
the verb behind the module; the package refuses those bindings, so the name is
the verb whatever was imported first (``sys.modules`` still holds the modules, so
``from mpplan.plan import Plan`` works as before).
"""

from __future__ import annotations

import importlib
import sys
import types
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


class _Facade(types.ModuleType):
    """The package's module type: a submodule named like a verb never replaces the verb."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            self.__dict__.pop(name, None)  # the lazy __getattr__ answers with the verb
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Facade
# ``mpplan.plan`` was bound by the import of ``Plan`` above, before the guard: unbind it
globals().pop("plan", None)


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

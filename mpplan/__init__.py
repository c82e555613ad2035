"""mpplan: plan, verify, measure and search the memory of deep-learning models over GPUs."""

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

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "ConfigError",
    "Graph",
    "GraphError",
    "GraphFileError",
    "InfeasibleError",
    "Kind",
    "MpplanError",
    "Op",
    "PlanError",
    "Tensor",
    "VerificationError",
]

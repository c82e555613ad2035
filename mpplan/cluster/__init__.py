"""Cluster-wide memory-cost search on Ray: plan a space of configs, measure the best on actors.

The verbs and records users need; everything else in the package is internal.
Only this package imports Ray.

>>> from mpplan.cluster import run_search        # doctest: +SKIP
>>> summary = run_search("configs/search.yaml")  # doctest: +SKIP
"""

from __future__ import annotations

from mpplan.cluster.actors import ClusterError, EvaluatorPool, PoolSettings
from mpplan.cluster.driver import SearchSummary, run_search
from mpplan.cluster.evaluator import DeviceOutOfMemory, EvaluateFn, RuntimeEvaluator, evaluate_safely, is_out_of_memory
from mpplan.cluster.records import Candidate, Evaluation, Result, Status

__all__ = [
    "Candidate",
    "ClusterError",
    "DeviceOutOfMemory",
    "EvaluateFn",
    "Evaluation",
    "EvaluatorPool",
    "PoolSettings",
    "Result",
    "RuntimeEvaluator",
    "SearchSummary",
    "Status",
    "evaluate_safely",
    "is_out_of_memory",
    "run_search",
]

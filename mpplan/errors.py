"""The error hierarchy: one root, one class per kind of failure.

Each subclass also derives from the builtin a caller would expect, so plain
``except ValueError`` keeps working.  The CLI turns any ``MpplanError`` into one
line and an exit code; library code never prints.
"""

from __future__ import annotations


class MpplanError(Exception):
    """Root of every error mpplan raises on purpose."""

    exit_code = 2


class GraphError(MpplanError, ValueError):
    """The graph is malformed: unknown tensor, double producer, cycle, bad size."""


class GraphFileError(MpplanError, ValueError):
    """A graph file cannot be read or does not follow the graph-file format."""


class ConfigError(MpplanError, ValueError):
    """A YAML config names an unknown key, a wrong type or an impossible value."""


class CaptureError(MpplanError, RuntimeError):
    """A PyTorch module could not be traced into a graph."""


class PlanError(MpplanError, ValueError):
    """A plan file is malformed or does not belong to the given graph."""


class VerificationError(MpplanError, AssertionError):
    """A plan breaks a memory rule; the message names the first violation."""

    exit_code = 1


class InfeasibleError(MpplanError, RuntimeError):
    """No plan fits the devices; ``missing_bytes`` says by how much the best one misses."""

    exit_code = 3

    def __init__(self, message: str, missing_bytes: int = 0) -> None:
        super().__init__(message)
        self.missing_bytes = missing_bytes

"""``mpplan verify`` as a function: check a ``plan.json`` against the graph, or the config, it was made for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mpplan.verify import VerifyReport
from mpplan.workflows.sources import graph_from_source, is_config


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    """A plan that passed: the file as the user named it, and what the verifier checked."""

    plan: str
    report: VerifyReport

    def text(self) -> str:
        """The line ``mpplan verify`` prints, naming what was taken on trust (no config was given)."""
        r = self.report
        line = f"{self.plan}: ok ({r.ops} ops, {r.buffers} buffers, {r.devices} devices)"
        if r.trusted:
            line += f"; taken on trust from the plan: {', '.join(r.trusted)} (pass --config to check them)"
        return line


def verify_file(
    plan: str | Path, *, graph: str | Path | None = None, config: str | Path | None = None,
    overrides: Sequence[str] = (),
) -> VerifyOutcome:
    """Check ``plan`` against a graph file (devices, capacities and settings taken on trust) or a run config.

    With ``config`` the devices, capacities, alignment, ``parallel_safe`` and ``grads`` come from the
    config and are checked too.  ``PlanError`` when the plan is for another graph (or the file is bad),
    ``VerificationError`` when the plan is wrong.
    """
    from mpplan.plan import check_plan_graph, load_plan
    from mpplan.verify import truth_from_config, verify

    if (graph is None) == (config is None):
        raise ValueError("verify_file: give exactly one of graph and config")
    loaded = load_plan(plan)
    truth = None
    if config is not None and is_config(Path(config)):
        from mpplan.capture import graph_from_config
        from mpplan.config import load_config

        run_config = load_config(config, overrides)
        built = graph_from_config(run_config)
        truth = truth_from_config(run_config)
    else:
        source = config if config is not None else graph
        assert source is not None  # checked on entry
        built = graph_from_source(source, overrides)
    check_plan_graph(loaded, built, str(plan))
    return VerifyOutcome(str(plan), verify(built, loaded, truth=truth))

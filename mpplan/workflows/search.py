"""After ``mpplan search``: the timeline and report of the best plan a finished search wrote."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpplan.config import Config

if TYPE_CHECKING:
    from mpplan.cluster import SearchSummary


def report_best(config: Config, summary: SearchSummary) -> Path | None:
    """``timeline.json`` beside the best plan and the search folder's report; the report's path.

    ``None`` when the search found no best plan (nothing fitted, or nothing was measured).
    """
    from mpplan.report_folder import write_folder_report

    if summary.best is None or summary.best_plan is None:
        return None
    write_best_timeline(config, summary.best.overrides, summary.best_plan)
    return write_folder_report(summary.out, html=False)


def write_best_timeline(config: Config, overrides: dict[str, Any], plan_path: Path) -> Path:
    """``timeline.json`` beside the search's best plan, from the graph of the best point's config."""
    from mpplan.capture import graph_from_config
    from mpplan.cluster.space import base_raw, candidate_config
    from mpplan.plan import load_plan, write_json_atomic
    from mpplan.timeline import timeline

    best_config = candidate_config(base_raw(config), tuple(overrides.items()), config.source)
    line = timeline(graph_from_config(best_config), load_plan(plan_path))
    return write_json_atomic(line.to_dict(), plan_path.parent / "timeline.json")

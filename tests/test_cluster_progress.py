"""Progress: log lines off a terminal, a bar on one; neither may disturb the search."""

from __future__ import annotations

import logging

from mpplan.cluster.objective import Objective
from mpplan.cluster.progress import Progress
from mpplan.cluster.records import Result, Status


def measured(key: str, status: Status, peak: int = 2**20) -> Result:
    measurement = {"devices": [{"name": "a", "measured_peak_bytes": peak}], "step_time_s": 0.01}
    return Result(
        key,
        status,
        {"planner.schedule": key},
        measurement=measurement if status is Status.OK else None,
        error=None if status is Status.OK else "boom",
    )


def test_log_lines_count_planned_measured_failed_and_best(caplog):
    progress = Progress(Objective("min_peak"), bar=False)
    with caplog.at_level(logging.INFO, logger="mpplan"):
        progress.begin("planning", 3)
        for status in (None, Status.PREDICTED_MISFIT, None):
            progress.planned(status)
        progress.end_planning(2)
        progress.begin("measuring", 2)
        best = measured("dfs", Status.OK)
        progress.measured(best, best, 2)
        progress.measured(measured("bfs", Status.OOM), best, 2)
        progress.close()
    text = caplog.text
    assert "search: planned 3 (1 predicted misfits, 0 resumed); 2 to measure" in text
    assert "search: [1/2] ok planner.schedule=dfs 1.00 MiB | 0 failed | best 1.00 MiB" in text
    assert "search: [2/2] oom planner.schedule=bfs (boom) | 1 failed | best 1.00 MiB" in text


def test_bar_mode_draws_without_logging_each_candidate(caplog, capsys):
    progress = Progress(Objective("max_batch"), bar=True)
    with caplog.at_level(logging.INFO, logger="mpplan"):
        progress.begin("measuring", 2)
        progress.measured(measured("dfs", Status.OK), None, 2)
        progress.close()
    assert "[1/2]" not in caplog.text
    assert "measuring" in capsys.readouterr().err

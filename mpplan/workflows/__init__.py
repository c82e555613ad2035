"""What each ``mpplan`` verb does, as library functions: the CLI only parses, calls one, and prints.

* ``plan_into_folder``: plan a config, verify the plan, write ``plan.json``, the timeline,
  the baselines and the report into the command's folder (``mpplan plan``);
* ``run_into_folder`` and ``measurement_text``: execute a config's plan and measure it
  against eager PyTorch, write the plan, the measurement and the report (``mpplan run``);
* ``report_best``: the timeline and report of a finished search's best plan (``mpplan search``);
* ``verify_file``: check a ``plan.json`` against its graph or config (``mpplan verify``);
* ``graph_from_source``: the graph of a run config or a graph file (``mpplan inspect``).

Each returns a record, so a notebook or a script gets what the command prints as data.
"""

from __future__ import annotations

from mpplan.workflows.plan import PlanOutcome, plan_into_folder, write_plan_report
from mpplan.workflows.run import RunOutcome, allocator_line, measurement_text, run_into_folder
from mpplan.workflows.search import report_best, write_best_timeline
from mpplan.workflows.sources import graph_from_source, is_config
from mpplan.workflows.verify import VerifyOutcome, verify_file

__all__ = [
    "PlanOutcome", "RunOutcome", "VerifyOutcome", "allocator_line", "graph_from_source", "is_config",
    "measurement_text", "plan_into_folder", "report_best", "run_into_folder", "verify_file", "write_best_timeline",
    "write_plan_report",
]

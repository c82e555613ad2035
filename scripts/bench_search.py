"""Search speed-up against evaluator actors: one real search measured on 1, then 2 Ray actors.

Rerun: ``python scripts/bench_search.py`` (``--quick``: 4 candidates instead of 8).
Writes the ``search`` section of docs/benchmarks.md.

The search is ``mpplan search`` on the zoo MLP (``configs/zoo_mlp.yaml``, enlarged so one
measurement takes a few seconds) over schedules and assigners; every candidate is
measured (``top_k`` = all) by the default evaluator, ``mpplan.runtime`` on virtual
devices inside the actors.  Ray runs locally with one CPU per actor.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from benchlib import REPO, log, rerun, section_main, stamp, table

from mpplan.cluster import SearchSummary, run_search
from mpplan.config import load_config

MODEL = ("workload.batch=4096", "model.torch.kwargs={hidden: 1024, layers: 3}")
SEARCH = ("search.measure={steps: 5, warmup: 1}", "search.timeout_s=600")


def space(quick: bool) -> str:
    """The ``search.space`` override: 4 schedules, times 2 assigners in a full run."""
    schedules = "[as_given, dfs, bfs, greedy_free]"
    if quick:
        return f"search.space={{planner.schedule: {schedules}}}"
    return f"search.space={{planner.schedule: {schedules}, planner.assign: [auto, best_fit]}}"


def overrides(quick: bool, actors: int) -> list[str]:
    top_k = 4 if quick else 8
    return [*MODEL, space(quick), f"search.top_k={top_k}", f"search.actors={actors}", *SEARCH]


def command(quick: bool, actors: int) -> str:
    """The ``mpplan search`` command line of one row."""
    sets = " ".join(f"--set '{o}'" for o in overrides(quick, actors))
    return f"mpplan search configs/zoo_mlp.yaml {sets} --out runs/bench_search_{actors}"


def search(quick: bool, actors: int, out: Path) -> SearchSummary:
    config = load_config(REPO / "configs" / "zoo_mlp.yaml", overrides(quick, actors))
    summary = run_search(config, out=out, progress=False)
    if summary.counts.get("ok", 0) != summary.measured:
        raise RuntimeError(f"search on {actors} actor(s): not every candidate measured ok: {summary.counts}")
    log(f"search: {actors} actor(s): {summary.measured} measured in {summary.measure_seconds:.1f}s")
    return summary


def evaluation_seconds(out: Path) -> tuple[float, float]:
    """Mean seconds of each actor's first evaluation (it builds and captures the model) and of the others."""
    first: list[float] = []
    later: list[float] = []
    seen: set[str] = set()
    for line in (out / "results.jsonl").read_text().splitlines():  # in the order results landed
        result = json.loads(line)
        (later if result["worker"] in seen else first).append(result["seconds"])
        seen.add(result["worker"])
    return mean(first), mean(later)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def section(quick: bool) -> str:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rows, measured, evaluations = [], {}, {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for actors in (1, 2):
                out = Path(tmp) / f"actors{actors}"
                summary = search(quick, actors, out)
                measured[actors] = summary.measure_seconds
                first, later = evaluations[actors] = evaluation_seconds(out)
                rows.append([
                    actors, summary.measured, f"{first:.2f}", f"{later:.2f}", f"{summary.measure_seconds:.1f}",
                    f"{summary.seconds:.1f}", f"{measured[1] / summary.measure_seconds:.2f}x",
                    f"`{command(quick, actors)}`",
                ])
    finally:
        ray.shutdown()
    return "\n\n".join(
        [
            "## Search: speed-up of the measured phase with evaluator actors",
            stamp(rerun("bench_search.py", quick)),
            (
                "One search, every candidate measured, on a local Ray with 1 and then 2 evaluator actors "
                "(one CPU each; this machine has 2).  `first evaluation`: mean seconds of each actor's first "
                "candidate, which also imports torch, builds and captures the model; `later evaluations`: "
                "mean seconds of the others (1 warm-up and 5 timed steps each); `measured phase`: wall seconds "
                "from the first evaluation "
                "handed to an actor to the last result; `search`: the whole `run_search` (planning every "
                "point, starting the actors, measuring); speed-up: measured phase on 1 actor / on N."
            ),
            table(["actors", "measured", "first evaluation s", "later evaluations s", "measured phase s", "search s",
                   "speed-up", "rerun one row"], rows),
            (
                f"Speed-up of the measured phase with 2 actors: {measured[1] / measured[2]:.2f}x (ideal 2x).  "
                f"Each actor pays its first evaluation once ({evaluations[2][0]:.1f} s), and the later "
                f"evaluations take {evaluations[1][1]:.2f} s alone against {evaluations[2][1]:.2f} s two at a time."
            ),
        ]
    )


def main() -> None:
    section_main("search", section, __doc__)


if __name__ == "__main__":
    main()

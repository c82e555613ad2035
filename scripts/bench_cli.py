"""End-to-end benchmark: `mpplan plan` of a synthetic transformer graph file on one device, per stage.

Rerun: ``python scripts/bench_cli.py`` (10k, 34k and 100k ops; ``--quick``: 1k, 3.4k and 10k).
Writes the ``cli`` section of docs/benchmarks.md.

Each size runs the real command, ``python -m mpplan.cli plan <config> --out <folder>``, in a
fresh interpreter, once; that run also times its own stages (the child mode of this script
wraps the stage functions, then calls ``mpplan.cli.main``), so the total and the split come
from the same run.  Wall seconds are what a user waits; CPU seconds (``time.process_time``)
are what the command itself spent, which a shared, loaded machine inflates less.
"""

from __future__ import annotations

import time

_START = (time.perf_counter(), time.process_time())  # before any import: the child's startup counts

import json  # noqa: E402 - after the clock starts
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# The parent's tools (benchlib, subprocess, tempfile) are imported where the parent uses them: imported
# here, the child would count their import (importlib.metadata, most of it) as the command's start-up.

#: (label, module, function) of each stage the child times; nested stages are split out of their parent.
STAGES = (
    ("load the graph file", "mpplan.capture", "graph_from_config"),
    ("plan", "mpplan.planner", "plan"),
    ("verify", "mpplan.verify", "verify"),
    ("save plan.json", "mpplan.plan", "save_plan"),
    ("baselines", "mpplan.sim", "order_load"),
    ("baselines", "mpplan.sim", "no_sharing_bytes"),
    ("timeline and report", "mpplan.workflows.plan", "write_plan_report"),
)
PLAN_PARTS = (
    ("schedule", "schedule_ops"),
    ("placement", "choose_placement"),
    ("placement", "legalize"),
    ("copies", "listing"),
    ("liveness", "live_ranges"),
    ("assign", "assign_arena"),
)


def synthetic_sizes(quick: bool) -> tuple[int, ...]:
    """Layers of the synthetic transformer training graphs: about 1k, 3.4k, 10k, 34k and 100k ops."""
    return (36, 120, 360) if quick else (360, 1200, 3600)


def child(config: str, out: str) -> None:
    """Run ``mpplan plan`` in this process with every stage timed; print the times as JSON."""
    import importlib
    import io
    from contextlib import redirect_stdout
    from functools import cached_property

    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}

    def timed(label: str, function):
        def run(*args, **kwargs):
            start = (time.perf_counter(), time.process_time())
            try:
                return function(*args, **kwargs)
            finally:
                wall[label] = wall.get(label, 0.0) + time.perf_counter() - start[0]
                cpu[label] = cpu.get(label, 0.0) + time.process_time() - start[1]
        return run

    for label, module, name in STAGES:
        mod = sys.modules.get(module) or importlib.import_module(module)
        setattr(mod, name, timed(label, getattr(mod, name)))
    planner = sys.modules["mpplan.planner"]
    for label, name in PLAN_PARTS:
        setattr(planner, name, timed(f"plan: {label}", getattr(planner, name)))
    # The graph's hash (for plan.json's ``graph.hash``) is a cached property, made where the planner
    # first asks for it: a stage of loading's kind, timed on its own so the planner's split shows it.
    from mpplan.graph import Graph

    hashing = cached_property(timed("plan: graph hash", Graph.content_hash.func))
    hashing.__set_name__(Graph, "content_hash")
    Graph.content_hash = hashing
    from mpplan.cli import main

    ready = (time.perf_counter(), time.process_time())
    with redirect_stdout(io.StringIO()):
        code = main(["-q", "plan", config, "--out", out])
    end = (time.perf_counter(), time.process_time())
    wall["start and imports"], cpu["start and imports"] = ready[0] - _START[0], ready[1] - _START[1]
    wall["total (in the process)"], cpu["total (in the process)"] = end[0] - _START[0], end[1] - _START[1]
    print(json.dumps({"exit": code, "wall": wall, "cpu": cpu}))


def measure(layers: int, folder: Path) -> dict:
    """Write the graph file and its config, run the command once; its times and its wall time from outside."""
    import os
    import subprocess

    from benchlib import REPO, load_average, log

    from mpplan.capture.graph_file import save_graph
    from mpplan.capture.synthetic import synthetic_graph

    graph = synthetic_graph("transformer", layers=layers, train=True)
    path = save_graph(graph, folder / f"transformer{layers}.json")
    config = folder / f"transformer{layers}.yaml"
    config.write_text(f"model: {{graph: {{path: {path.name}}}}}\ndevices: [{{name: gpu0, capacity: 1000GiB}}]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(config), str(folder / f"out{layers}")]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    outside = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"mpplan plan failed on {layers} layers: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(ops=len(graph.ops), outside=outside, file_mib=path.stat().st_size / 2**20, load=load_average())
    log(f"{len(graph.ops)} ops: {outside:.2f} s end to end")
    return result


def section(quick: bool) -> str:
    import tempfile

    from benchlib import fit_exponent, rerun, stamp, table

    with tempfile.TemporaryDirectory(prefix="mpplan-bench-cli-") as tmp:
        results = [measure(layers, Path(tmp)) for layers in synthetic_sizes(quick)]
    labels = [label for label in dict.fromkeys(label for r in results for label in r["wall"]) if "total" not in label]
    headers = ["stage", *(f"{r['ops']:,} ops: wall s / CPU s" for r in results)]
    rows = [[label, *(f"{r['wall'].get(label, 0.0):.2f} / {r['cpu'].get(label, 0.0):.2f}" for r in results)]
            for label in labels]
    def rest(r: dict, clock: str) -> float:
        top = [label for label in r[clock] if not label.startswith("plan: ") and "total" not in label]
        return r[clock]["total (in the process)"] - sum(r[clock][label] for label in top)

    rows.append(["the rest (config, arguments, folders, printing)",
                 *(f"{rest(r, 'wall'):.2f} / {rest(r, 'cpu'):.2f}" for r in results)])
    rows.append(["**end to end** (the command, timed from outside)", *(f"**{r['outside']:.2f}**" for r in results)])
    rows.append(["in the process (the stages above and the rest)",
                 *(f"{r['wall']['total (in the process)']:.2f} / {r['cpu']['total (in the process)']:.2f}"
                   for r in results)])
    wall_fit = fit_exponent([(r["ops"], r["outside"]) for r in results])
    cpu_fit = fit_exponent([(r["ops"], r["cpu"]["total (in the process)"]) for r in results])
    loads = ", ".join(f"{r['load']:.1f}" for r in results)
    sizes = ", ".join(f"{r['ops']:,} ops ({r['file_mib']:.0f} MiB)" for r in results)
    return "\n\n".join([
        "## `mpplan plan` end to end (graph file, one device)",
        stamp(rerun("bench_cli.py", quick)),
        f"`mpplan plan` of the synthetic transformer training graph as a JSON graph file ({sizes}), one "
        "1000 GiB device, default planner settings, verification included; one run per size, each in a fresh "
        "interpreter, which also timed its own stages (`plan: ...` rows split the planner; `plan` includes them).",
        table(headers, rows),
        f"End to end grows as ops^{wall_fit:.2f} (wall) and ops^{cpu_fit:.2f} (CPU in the process) over these "
        f"sizes. The 1-minute load average was {loads} at the runs: on this shared 2-core machine a load above 2 "
        "means other processes held the cores, and wall seconds then exceed CPU seconds.",
    ])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    from benchlib import section_main

    section_main("cli", section, __doc__)


if __name__ == "__main__":
    main()

"""End-to-end benchmark: `mpplan plan` of a synthetic transformer graph file on one device, per stage.

Rerun: ``python scripts/bench_cli.py`` (10k, 34k and 100k ops; ``--quick``: 1k, 3.4k and 10k).
Writes the ``cli`` section of docs/benchmarks.md.

Each size runs the real command, ``python -m mpplan.cli plan <config> --out <folder>``, in a
fresh interpreter, once; that run also times its own stages (the child mode of this script
wraps the stage functions, then calls ``mpplan.cli.main``), so the total and the split come
from the same run.  Wall seconds are what a user waits; CPU seconds (``time.process_time``)
are what the command itself spent, which a shared, loaded machine inflates less.

``--against TREE [--pairs N]`` adds a comparison made in the same minutes: the largest size's
command run alternately in ``TREE`` (another checkout, say a ``git worktree`` of main) and in
this tree, ``N`` times each (default 3), medians of CPU seconds per stage; each tree reads the graph
file its own ``save_graph`` writes (a tree before the columnar layout reads no columns).  On a shared host
one run's stages vary by up to 40%, so only such paired runs say what a change gained.
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
TOTAL = "total (in the process)"
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

    # A stage an older tree (``--against``) lacks is left untimed: its time stays in the rest.
    for label, module, name in STAGES:
        mod = sys.modules.get(module) or importlib.import_module(module)
        if hasattr(mod, name):
            setattr(mod, name, timed(label, getattr(mod, name)))
    planner = sys.modules["mpplan.planner"]
    for label, name in PLAN_PARTS:
        if hasattr(planner, name):
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
    wall[TOTAL], cpu[TOTAL] = end[0] - _START[0], end[1] - _START[1]
    print(json.dumps({"exit": code, "wall": wall, "cpu": cpu}))


def write_case(layers: int, folder: Path, tree: Path) -> tuple[Path, int, float]:
    """The graph file of ``layers`` layers, as ``tree``'s ``save_graph`` writes it (JSON: in columns since the
    columnar layout), and its config in ``folder``: the config, the op count, the file's MiB."""
    from benchlib import synthetic_graph_file

    path = folder / f"transformer{layers}.json"
    ops = synthetic_graph_file(tree, layers, path)
    config = folder / f"transformer{layers}.yaml"
    config.write_text(f"model: {{graph: {{path: {path.name}}}}}\ndevices: [{{name: gpu0, capacity: 1000GiB}}]\n")
    return config, ops, path.stat().st_size / 2**20


def run_child(config: Path, out: Path, tree: Path) -> dict:
    """The command once, in a fresh interpreter importing ``tree``'s mpplan: its times, and its wall time from
    outside."""
    import os
    import shutil
    import subprocess

    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(config), str(out)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
    outside = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"mpplan plan failed in {tree} on {config.name}: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["outside"] = outside
    return result


def measure(layers: int, folder: Path) -> dict:
    """Write the graph file and its config, run the command once; its times and its wall time from outside."""
    from benchlib import REPO, load_average, log

    config, ops, mib = write_case(layers, folder, REPO)
    result = run_child(config, folder / f"out{layers}", REPO)
    result.update(ops=ops, config=config, file_mib=mib, load=load_average())
    log(f"{ops} ops: {result['outside']:.2f} s end to end")
    return result


def paired(layers: int, folder: Path, against: Path, pairs: int) -> str:
    """The command on the graph of ``layers`` layers in ``against`` and in this tree, alternately ``pairs``
    times, each tree on the graph file its own ``save_graph`` writes: a table of the median CPU seconds of
    each stage, the totals of every run, and the load averages."""
    from statistics import median

    from benchlib import REPO, load_average, log, table

    trees = {"other": against, "this": REPO}
    configs = {}
    for side, tree in trees.items():
        (folder / side).mkdir()
        configs[side] = write_case(layers, folder / side, tree)[0]
    runs: dict[str, list[dict]] = {"other": [], "this": []}
    loads = []
    for _ in range(pairs):
        for side, tree in trees.items():
            runs[side].append(run_child(configs[side], folder / f"paired-{side}", tree)["cpu"])
            loads.append(load_average())
    log(f"paired: {', '.join(f'{r[TOTAL]:.2f}' for r in runs['this'])} s here, "
        f"{', '.join(f'{r[TOTAL]:.2f}' for r in runs['other'])} s in {against}")
    labels = [label for label in runs["this"][0] if label != TOTAL] + [TOTAL]

    def cell(side: str, label: str) -> float | None:
        """The median, or None where the tree has no such stage (an older tree's time for it is in the rest)."""
        return median(r[label] for r in runs[side]) if label in runs[side][0] else None

    def shown(value: float | None) -> str:
        return "not timed" if value is None else f"{value:.2f}"

    def ratio(label: str) -> str:
        this, other = cell("this", label), cell("other", label)
        return f"{this / other:.2f}" if this is not None and other is not None and other > 0.005 else ""

    rows = [[label, shown(cell("other", label)), shown(cell("this", label)), ratio(label)] for label in labels]
    rows.append(["every run's total", ", ".join(f"{r[TOTAL]:.2f}" for r in runs["other"]),
                 ", ".join(f"{r[TOTAL]:.2f}" for r in runs["this"]), ""])
    head = ["stage (CPU s, median)", f"`{_commit_of(against)}`", "this tree", "this / other"]
    return (f"The same command on transformer{layers} in another checkout (`{_commit_of(against)}`) and in this "
            f"tree, alternately, {pairs} runs each, each tree on the graph file its own `save_graph` writes "
            f"(load average {min(loads):.1f}-{max(loads):.1f}):\n\n"
            + table(head, rows))


def _commit_of(tree: Path) -> str:
    """``tree``'s commit, short."""
    import subprocess

    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or str(tree)


def section(quick: bool, against: Path | None = None, pairs: int = 3) -> str:
    import tempfile

    from benchlib import fit_exponent, rerun, stamp, table

    with tempfile.TemporaryDirectory(prefix="mpplan-bench-cli-") as tmp:
        results = [measure(layers, Path(tmp)) for layers in synthetic_sizes(quick)]
        comparison = [paired(synthetic_sizes(quick)[-1], Path(tmp), against, pairs)] if against else []
    labels = [label for label in dict.fromkeys(label for r in results for label in r["wall"]) if "total" not in label]
    headers = ["stage", *(f"{r['ops']:,} ops: wall s / CPU s" for r in results)]
    rows = [[label, *(f"{r['wall'].get(label, 0.0):.2f} / {r['cpu'].get(label, 0.0):.2f}" for r in results)]
            for label in labels]
    def rest(r: dict, clock: str) -> float:
        top = [label for label in r[clock] if not label.startswith("plan: ") and "total" not in label]
        return r[clock][TOTAL] - sum(r[clock][label] for label in top)

    rows.append(["the rest (config, arguments, folders, printing)",
                 *(f"{rest(r, 'wall'):.2f} / {rest(r, 'cpu'):.2f}" for r in results)])
    rows.append(["**end to end** (the command, timed from outside)", *(f"**{r['outside']:.2f}**" for r in results)])
    rows.append(["in the process (the stages above and the rest)",
                 *(f"{r['wall'][TOTAL]:.2f} / {r['cpu'][TOTAL]:.2f}"
                   for r in results)])
    wall_fit = fit_exponent([(r["ops"], r["outside"]) for r in results])
    cpu_fit = fit_exponent([(r["ops"], r["cpu"][TOTAL]) for r in results])
    loads = ", ".join(f"{r['load']:.1f}" for r in results)
    sizes = ", ".join(f"{r['ops']:,} ops ({r['file_mib']:.0f} MiB)" for r in results)
    return "\n\n".join([
        "## `mpplan plan` end to end (graph file, one device)",
        stamp(rerun("bench_cli.py", quick) + (f" --against OTHER_TREE --pairs {pairs}" if against else "")),
        f"`mpplan plan` of the synthetic transformer training graph as a JSON graph file ({sizes}), as "
        "`save_graph` writes it (in columns, `layout: columns`, since the columnar layout), one "
        "1000 GiB device, default planner settings, verification included; one run per size, each in a fresh "
        "interpreter, which also timed its own stages (`plan: ...` rows split the planner; `plan` includes them).",
        table(headers, rows),
        f"End to end grows as ops^{wall_fit:.2f} (wall) and ops^{cpu_fit:.2f} (CPU in the process) over these "
        f"sizes. The 1-minute load average was {loads} at the runs: on this shared 2-core machine a load above 2 "
        "means other processes held the cores, and wall seconds then exceed CPU seconds.",
        *comparison,
    ])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
        return
    import argparse

    from benchlib import BENCHMARKS, REPO, log, write_section

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller run (minutes)")
    parser.add_argument("--against", type=Path, help="another checkout to time the largest size against")
    parser.add_argument("--pairs", type=int, default=3, help="runs in each tree with --against (default 3)")
    args = parser.parse_args()
    write_section("cli", section(args.quick, args.against, args.pairs))
    log(f"wrote the cli section of {BENCHMARKS.relative_to(REPO)}")


if __name__ == "__main__":
    main()

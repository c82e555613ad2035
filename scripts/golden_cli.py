"""Golden check for speed work: ``mpplan plan`` of this tree against another (main's), byte for byte.

Rerun: ``python scripts/golden_cli.py OTHER_TREE [--big]`` from the tree under test, where ``OTHER_TREE``
is a checkout of the commit to compare against (a ``git worktree`` of main, say).  Each case runs
``python -m mpplan.cli plan <config> --out <folder>`` once in each tree (``python -m`` from the tree's
root, so its own ``mpplan`` is imported) and compares the exit code, stdout, stderr and every file
written (plan.json, report.md, timeline.json, baselines.json), ignoring only ``planner.seconds``
(wall time), the output folder's own path and the graph's hash (``graph.hash`` in plan.json and
wherever else it is written): a tree that moved to another version of the hash (``mpplan.graph_hash``)
writes another string for the same graph.  Each tree reads graph files its own ``save_graph`` wrote
(``benchlib.synthetic_graph_file``), in a folder of its own whose path is masked too: a tree before the
columnar layout reads rows, a tree since reads columns.  Cases: a synthetic transformer graph file (10k ops;
``--big`` adds 100k), the same graph in an old row-layout file, one file written by this tree that both
trees read (rows stay a supported input, though a tree since columns writes columns by default), on two
devices, with remat (``mirror``), with ``parallel_safe`` on devices too small (exit 3),
``configs/quickstart.yaml``, and a bad graph file (exit 2, one line).
Exit 0 when every case agrees; else prints the first difference of each case that differs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEVICE = "{name: gpu0, capacity: 1000GiB}"


def _rows_file(path: Path) -> None:
    """Write the 10k-op graph of the ``file10k`` case to ``path`` in rows, with this tree's ``save_graph``."""
    from mpplan.capture.graph_file import save_graph
    from mpplan.capture.synthetic import synthetic_graph

    save_graph(synthetic_graph("transformer", layers=360, train=True), path, layout="rows")


def _cases(folder: Path, big: bool, tree: Path, rows: bytes) -> dict[str, Path]:
    """Config of each case, written into ``folder`` beside the graph files they read, which ``tree`` writes
    (but for ``rows``, the text of the row-layout file, the same for each tree)."""
    from benchlib import synthetic_graph_file

    folder.mkdir()
    configs: dict[str, Path] = {}

    def config(name: str, text: str) -> None:
        configs[name] = folder / f"{name}.yaml"
        configs[name].write_text(text)

    for layers in (360, 3600) if big else (360,):
        synthetic_graph_file(tree, layers, folder / f"t{layers}.json")
    graph = "model: {graph: {path: t360.json}}\n"
    config("file10k", f"{graph}devices: [{DEVICE}]\n")
    (folder / "rows.json").write_bytes(rows)
    config("rows10k", f"model: {{graph: {{path: rows.json}}}}\ndevices: [{DEVICE}]\n")
    if big:
        config("file100k", f"model: {{graph: {{path: t3600.json}}}}\ndevices: [{DEVICE}]\n")
    config("two_devices", f"{graph}devices: [{{count: 2, capacity: 1000GiB}}]\n")
    config("remat", f"{graph}devices: [{DEVICE}]\nplanner: {{remat: {{policy: mirror}}}}\n")
    config("parallel_safe_misfit",
           f"{graph}devices: [{{name: gpu0, capacity: 64MiB}}]\nplanner: {{parallel_safe: true}}\n")
    (folder / "bad.json").write_text('{"tensors": {"x": {"bytes": -1}}, "ops": []}\n')
    config("bad_file", f"model: {{graph: {{path: bad.json}}}}\ndevices: [{DEVICE}]\n")
    configs["quickstart"] = REPO / "configs" / "quickstart.yaml"
    return configs


def _run(tree: Path, config: Path, out: Path) -> dict[str, object]:
    """Exit code, output and written files of one ``mpplan plan``, with the run-specific parts (the output
    folder, the folder of the config and its graph file, the graph's hash) masked."""
    done = subprocess.run([sys.executable, "-m", "mpplan.cli", "plan", str(config), "--out", str(out)],
                          cwd=tree, capture_output=True, text=True)
    plan = out / "plan.json"
    graph_hash = json.loads(plan.read_text())["graph"]["hash"] if plan.exists() else str(out)

    def masked(text: str) -> str:
        text = text.replace(str(out), "<out>").replace(str(config.parent), "<cases>")
        return text.replace(graph_hash, "<graph hash>")

    result: dict[str, object] = {"exit": done.returncode, "stdout": masked(done.stdout),
                                 "stderr": masked(done.stderr)}
    for path in sorted(out.rglob("*")) if out.exists() else ():
        text = path.read_text()
        if path.name == "plan.json":
            data = json.loads(text)
            data.get("planner", {}).pop("seconds", None)
            text = json.dumps(data, indent=1)
        result[str(path.relative_to(out))] = masked(text)
    return result


def main() -> int:
    old = Path(sys.argv[1]).resolve()
    big = "--big" in sys.argv[2:]
    failed = 0
    with tempfile.TemporaryDirectory(prefix="mpplan-golden-") as tmp:
        folder = Path(tmp)
        trees = {"old": old, "new": REPO}
        _rows_file(folder / "rows.json")
        rows = (folder / "rows.json").read_bytes()
        cases = {label: _cases(folder / label, big, tree, rows) for label, tree in trees.items()}
        for name in cases["new"]:
            a, b = (_run(tree, cases[label][name], folder / f"out-{name}-{label}") for label, tree in trees.items())
            same = a == b
            failed += not same
            print(f"{name}: exit {a['exit']}/{b['exit']}, {len(a) - 3} files: {'identical' if same else 'DIFFERENT'}")
            if not same:
                key = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                old_text, new_text = str(a.get(key))[:300], str(b.get(key))[:300]
                print(f"  first difference in {key}:\n  old: {old_text!r}\n  new: {new_text!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

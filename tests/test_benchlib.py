"""scripts/benchlib.py: the suite rewrites docs/benchmarks.md without losing what it does not run; graph files
per tree."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from benchlib import synthetic_graph_file, write_layout, write_section  # noqa: E402

from mpplan.capture.graph_file import load_graph  # noqa: E402
from mpplan.capture.synthetic import synthetic_graph  # noqa: E402


def test_the_suite_keeps_sections_only_their_own_script_writes(tmp_path) -> None:
    path = tmp_path / "benchmarks.md"
    write_section("gpu", "measured on a GPU", path)
    write_section("peak", "old peak table", path)
    write_layout(["machine", "peak"], path)
    text = path.read_text()
    assert "measured on a GPU" in text and "old peak table" in text
    assert text.index("<!-- bench:machine -->") < text.index("<!-- bench:peak -->") < text.index("<!-- bench:gpu -->")
    write_section("peak", "new peak table", path)
    assert "old peak table" not in path.read_text() and "measured on a GPU" in path.read_text()


def test_a_tree_writes_the_graph_file_in_its_own_layout(tmp_path) -> None:
    path = tmp_path / "t.json"
    assert synthetic_graph_file(REPO, 2, path) == 64
    assert '"layout": "columns"' in path.read_text()  # this tree's save_graph, not an older one's
    assert load_graph(path) == synthetic_graph("transformer", layers=2, train=True)

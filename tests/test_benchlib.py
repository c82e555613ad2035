"""scripts/benchlib.py: the suite rewrites docs/benchmarks.md without losing what it does not run."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

from benchlib import write_layout, write_section  # noqa: E402


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

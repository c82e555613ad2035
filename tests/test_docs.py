"""The generated reference pages match the code (rerun scripts/gen_docs.py when this fails)."""

import os
import re
import subprocess

from conftest import REPO
from mpplan.reference import cli_reference, config_reference


def test_configuration_reference_is_current():
    assert (REPO / "docs" / "configuration.md").read_text() == config_reference()


def test_cli_reference_is_current(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert (REPO / "docs" / "cli.md").read_text() == cli_reference()


CPU_TORCH = "$(nvidia-smi -L >/dev/null 2>&1 || echo --extra-index-url https://download.pytorch.org/whl/cpu)"


def test_readme_opens_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index("```bash") + 1
    block = lines[start : lines.index("```", start)]
    assert len(block) == 2, "exactly two set-up commands: the main job, the tests"
    assert block[0].startswith("pip install -e . ") and " && mpplan search " in block[0]
    assert block[1].startswith("pip install -e '.[test") and block[1].endswith("&& python -m pytest -q")
    # CPU-only machines get the CPU build of PyTorch, in the same line a GPU machine runs
    assert all(CPU_TORCH in line for line in block)
    # .ci/run finds the test command by this pattern, and runs it again in a copy with no ../shared
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"grep -m1 -E '\^pip install \.\*pytest' README\.md", ci)
    assert re.match(r"^pip install .*pytest", block[1])
    assert "mktemp -d" in ci and os.access(REPO / ".ci" / "run", os.X_OK)


def test_cpu_torch_switch_picks_the_cpu_index_only_without_a_gpu(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    echo = f"echo {CPU_TORCH}"
    without = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    with_gpu = subprocess.run(["bash", "-c", echo], capture_output=True, text=True,
                              env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert without.stdout.strip() == "--extra-index-url https://download.pytorch.org/whl/cpu"
    assert with_gpu.stdout.strip() == ""

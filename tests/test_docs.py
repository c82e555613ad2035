"""The docs hold: the generated reference pages and tables match the code (rerun scripts/gen_docs.py when
that fails), the README's set-up commands keep their shape, and a clone runs the tests."""

import os
import re
import shutil
import subprocess
import sys
from xml.etree import ElementTree

import pytest

from conftest import REPO
from mpplan.reference import STATUS_TABLE, cli_reference, config_reference, status_table, with_status_table


def test_configuration_reference_is_current():
    assert (REPO / "docs" / "configuration.md").read_text() == config_reference()


def test_cli_reference_is_current(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert (REPO / "docs" / "cli.md").read_text() == cli_reference()


def test_cluster_docs_status_table_is_current():
    """docs/cluster.md's table of search statuses says each meaning in the words of ``mpplan.search_status``,
    which the report's legend uses too (they were written three times, and had drifted apart)."""
    page = (REPO / "docs" / "cluster.md").read_text()
    assert page.count(STATUS_TABLE[0]) == page.count(STATUS_TABLE[1]) == 1
    assert with_status_table(page) == page
    assert f"\n{STATUS_TABLE[0]}\n{status_table()}{STATUS_TABLE[1]}\n" in page


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


#: The tests that read the benchmark graphs of ``../shared/data``, run in a clone that lacks them: each one
#: (every parametrized case of it) must skip there. Named one by one, not by file, so that none may pass.
#: test_remat's POLICY_GRAPHS tests read the data for some cases only, and are left to .ci/run.
SHARED_DATA_TESTS = [
    "tests/test_nodelink.py::test_all_eighteen_files_are_there",
    "tests/test_nodelink.py::test_shared_graph_loads_and_matches_the_file",
    "tests/test_nodelink.py::test_checkmate_train_graphs_link_backward_ops_to_their_forward",
    "tests/test_nodelink.py::test_checkmate_names_sizes_and_costs",
    "tests/test_nodelink.py::test_random_layered_files_follow_their_order_attribute",
    "tests/test_nodelink.py::test_size_and_cost_attributes_can_be_overridden",
    "tests/test_assign.py::test_auto_packs_random_layered_graphs_near_load",
    "tests/test_assign.py::test_auto_reaches_load_on_random_layered_n1000_in_its_given_order",
    "tests/test_assign.py::test_auto_reaches_load_on_real_networks",
    "tests/test_remat.py::test_checkmate_names_ops_and_tensors_alike",
    "tests/test_remat.py::test_exact_budget_on_a_checkmate_graph_is_optimal_and_verifies",
    "tests/test_remat.py::test_the_milp_backend_prints_nothing_to_stdout",
    "tests/test_remat.py::test_budget_heuristic_answers_are_those_of_the_full_resimulation",
]


def test_a_clone_without_the_benchmark_data_skips_saying_where_it_comes_from(tmp_path):
    """What .ci/run proves for the whole suite, for the tests that read ``../shared/data``: in a
    copy of the checkout with nothing beside it they skip, and each skip names the data's source
    (regression: test_remat's skips said where to put the graphs but not where to get them)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the copy is made from git's file list")
    clone = tmp_path / "mpplan"
    for name in listed.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    env = {**os.environ, "PYTHONPATH": str(clone)}
    report = tmp_path / "report.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                           *SHARED_DATA_TESTS], cwd=clone, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]
    # each case's skip message (None: it ran), by its listed test; not -rs lines, which merge equal skips
    skips: dict[str, list[str | None]] = {test: [] for test in SHARED_DATA_TESTS}
    for case in ElementTree.parse(report).iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name', '').split('[')[0]}"
        skipped = case.find("skipped")
        skips[test].append(None if skipped is None else skipped.get("message", ""))
    none = [test for test, seen in skips.items() if not seen]
    assert not none, f"these listed tests ran no case: {none}"
    ran = [test for test, seen in skips.items() if None in seen]
    assert not ran, f"these tests ran without ../shared/data instead of skipping: {ran}"
    source = "github.com/haoming-codes/moccasin"
    unsourced = [test for test, seen in skips.items() if any(source not in (m or source) for m in seen)]
    assert not unsourced, f"these skips do not say where the data comes from: {unsourced}"

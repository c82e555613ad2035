"""The generated reference pages match the code (rerun scripts/gen_docs.py when this fails)."""

import os

from conftest import REPO
from mpplan.reference import cli_reference, config_reference


def test_configuration_reference_is_current():
    assert (REPO / "docs" / "configuration.md").read_text() == config_reference()


def test_cli_reference_is_current(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert (REPO / "docs" / "cli.md").read_text() == cli_reference()


def test_readme_opens_with_the_two_commands():
    lines = (REPO / "README.md").read_text().splitlines()
    block = lines[lines.index("```bash") + 1 : lines.index("```bash") + 3]
    assert block[0].startswith("pip install -e . && mpplan ")
    assert block[1].startswith("pip install -e '.[test") and "pytest" in block[1]
    assert os.access(REPO / ".ci" / "run", os.R_OK)

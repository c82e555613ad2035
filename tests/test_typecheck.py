"""CI type-checks the package: mypy comes with the test extra and runs before the tests."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_mypy_between_the_install_and_the_tests():
    ci = (REPO / ".ci" / "run").read_text()
    install = ci.index('eval "$install_cmd"')
    check = ci.index("python3 -m mypy")
    tests = ci.index('eval "$pytest_cmd"')
    assert install < check < tests, "mypy needs the test extra installed, and must fail CI before the tests run"


def test_mypy_is_in_the_test_extra_and_configured_for_the_package():
    text = (REPO / "pyproject.toml").read_text()
    if tomllib is None:
        assert re.search(r'^test = \[.*"mypy', text, re.M)
        return
    project = tomllib.loads(text)
    assert any(req.startswith("mypy") for req in project["project"]["optional-dependencies"]["test"])
    # `python3 -m mypy` with no arguments checks what the configuration names: the whole package
    assert project["tool"]["mypy"]["packages"] == ["mpplan"]

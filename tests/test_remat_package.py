"""The remat package's shape: one concept per module, small modules, no import cycle.

The modules used to import each other (``remat_incremental`` and ``remat_moves``);
a cycle makes the import order matter and the modules impossible to read alone.
The import graph is read from the source (every ``import``, at module level or
inside a function), so a cycle hidden in a function body or behind
``TYPE_CHECKING`` is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mpplan.passes.remat as remat_package

PACKAGE = "mpplan.passes.remat"
ROOT = Path(remat_package.__file__).parent
MODULES = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")

#: The brief's "about 300 lines" with room for a docstring that explains the model.
MAX_LINES = 340


def imports_of(module: str) -> set[str]:
    """The sibling modules ``module`` imports, anywhere in its source."""
    tree = ast.parse((ROOT / f"{module}.py").read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found.update(alias.name for alias in node.names if alias.name in MODULES)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
    return found - {module}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a list of nodes, or ``None``."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for succ in sorted(graph.get(node, ())):
            if state.get(succ) == 1:
                return stack[stack.index(succ):] + [succ]
            if succ not in state and (cycle := visit(succ)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_remat_modules() -> None:
    graph = {module: imports_of(module) for module in MODULES}
    assert graph["choice"] >= {"moves", "index"}  # the reader sees real edges
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"


@pytest.mark.parametrize("module", MODULES)
def test_remat_modules_are_small(module: str) -> None:
    lines = len((ROOT / f"{module}.py").read_text().splitlines())
    assert lines <= MAX_LINES, f"{module}.py has {lines} lines; split it by concept"


def test_every_name_other_code_imports_is_in_the_package() -> None:
    """planner, verify, runtime and the search import these from ``mpplan.passes.remat``."""
    for name in ("RematResult", "apply_recompute", "remat", "mirror_thresholds", "mirror_search", "build_model",
                 "evaluate", "min_feasible_budget", "recomputable", "sqrt_checkpoints", "mirror_plan", "SUFFIX"):
        assert hasattr(remat_package, name), name
    assert set(remat_package.__all__) <= set(dir(remat_package))

"""The house rules of the code's layout: no import cycles, small pass modules, one registry per pass kind.

The registries (``SCHEDULERS``, ``ASSIGNERS``, ``PLACEMENTS``) are the one source of the
config's ``planner.schedule`` / ``assign`` / ``placement`` choices and of the generated
reference; these tests fail if a name is registered but not accepted or not documented.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from mpplan.config import load_config
from mpplan.errors import ConfigError
from mpplan.passes.assign import ASSIGNERS
from mpplan.passes.place import PLACEMENTS
from mpplan.passes.schedule import SCHEDULERS
from mpplan.reference import config_reference

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "mpplan"
QUICKSTART = REPO / "configs" / "quickstart.yaml"

#: No module under mpplan/passes/ may be longer: one concept per module.
MAX_PASS_MODULE_LINES = 400

REGISTRIES = {"schedule": SCHEDULERS, "assign": ASSIGNERS, "placement": PLACEMENTS}


# --- import cycles ------------------------------------------------------------------------------------


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: top level, and inside top-level ``if``/``try``
    (but not under ``if TYPE_CHECKING``, which never runs). Imports inside functions are
    deliberate deferrals and run later, so they cannot make an import cycle."""
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            body: list[ast.stmt] = node.orelse
        elif isinstance(node, (ast.If, ast.Try)):
            body = [n for n in ast.walk(node) if isinstance(n, ast.stmt)]
        else:
            body = [node]
        yield from (n for n in body if isinstance(n, (ast.Import, ast.ImportFrom)))


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports at import time (``from pkg import sub`` names ``pkg.sub``)."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _module_level_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in modules else base)
        edges[name] = {t for t in targets if t in modules and t != name}
    return edges


def import_cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def test_the_cycle_finder_finds_cycles_and_nothing_else() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": set(), "f": {"g"}, "g": {"f"}}
    assert sorted(import_cycles(edges)) == [["a", "b", "c"], ["f", "g"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_the_package_layout() -> None:
    edges = import_graph(module_names())
    assert "mpplan.passes.schedule.registry" in edges["mpplan.passes.schedule"]
    assert "mpplan.liveness" in edges["mpplan.sim"]
    assert "mpplan.topo" in edges["mpplan.graph"]


def test_no_import_cycles_among_mpplan_modules() -> None:
    cycles = import_cycles(import_graph(module_names()))
    assert cycles == [], f"import cycles (a module must not import, directly or not, what imports it): {cycles}"


def test_the_simulator_and_liveness_import_no_pass() -> None:
    edges = import_graph(module_names())
    for floor in ("mpplan.sim", "mpplan.liveness", "mpplan.topo", "mpplan.graph"):
        upward = sorted(m for m in edges[floor] if m.startswith("mpplan.passes"))
        assert upward == [], f"{floor} sits below the passes but imports {upward}"


# --- small pass modules -------------------------------------------------------------------------------


def test_no_module_in_passes_exceeds_the_line_limit() -> None:
    long = {
        str(path.relative_to(REPO)): lines
        for path in sorted((PACKAGE / "passes").rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_PASS_MODULE_LINES
    }
    assert long == {}, f"split these into modules of one concept each (at most {MAX_PASS_MODULE_LINES} lines): {long}"


# --- one registry per pass kind --------------------------------------------------------------------------


@pytest.mark.parametrize("key,name", [(key, name) for key, registry in REGISTRIES.items() for name in registry])
def test_every_registered_pass_is_a_config_choice_and_documented(key: str, name: str) -> None:
    config = load_config(QUICKSTART, [f"planner.{key}={name}"])
    assert getattr(config.planner, key) == name
    (row,) = [line for line in config_reference().splitlines() if line.startswith(f"| `planner.{key}` |")]
    choices = row.split(" | ")[1].split(" &#124; ")
    assert name in choices


def test_importing_the_config_loads_no_pass() -> None:
    """The config takes its choices from the registries only when a schema is read: the verifier imports
    the config and must not load what it checks."""
    import subprocess
    import sys

    code = "import sys, mpplan.config; print(sorted(m for m in sys.modules if m.startswith('mpplan.passes')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("key", sorted(REGISTRIES))
def test_the_config_offers_exactly_the_registered_choices(key: str) -> None:
    (row,) = [line for line in config_reference().splitlines() if line.startswith(f"| `planner.{key}` |")]
    assert row.split(" | ")[1].split(" &#124; ") == list(REGISTRIES[key])
    with pytest.raises(ConfigError, match=f"planner.{key}: expected one of {', '.join(REGISTRIES[key])}"):
        load_config(QUICKSTART, [f"planner.{key}=not_registered"])

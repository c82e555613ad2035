"""The capture packages keep their shape: small modules, no import cycle, and the old public names importable.

``torch_capture`` and ``synthetic`` were single modules of 1137 and 746 lines; they are packages now, one
concept per module, and their ``__init__`` re-exports every name the single modules offered, which other code
and users import.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

CAPTURE = Path(__file__).resolve().parents[1] / "mpplan" / "capture"
PACKAGES = ("torch_capture", "synthetic")
MAX_LINES = 400

#: The public names of the former single modules (everything without a leading underscore).
PUBLIC = {
    "torch_capture": [
        "BYTES_PER_US", "FLOPS_PER_US", "MIN_COST_US", "MODES", "OPTIMIZERS", "PROGRESS_MIN_MODULES",
        "CapturedProgram", "OptimizerSpec", "Source", "SourceRole", "capture", "capture_program", "default_loss",
    ],
    "synthetic": [
        "BYTES_PER_US", "FLOPS_PER_US", "MIN_COST_US", "OPTIMIZER_STATES", "DTYPE_BYTES", "GENERATORS", "Key",
        "chain", "random_layered", "residual_cnn", "synthetic_graph", "transformer", "unet",
    ],
}


def _modules(package: str) -> dict[str, Path]:
    return {f"mpplan.capture.{package}.{p.stem}".removesuffix(".__init__"): p
            for p in sorted((CAPTURE / package).glob("*.py"))}


def _imports(path: Path) -> set[str]:
    """The ``mpplan`` modules ``path`` imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mpplan"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mpplan"))
    return found


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges`` as a path (first node repeated at the end), or ``None`` if it is a DAG."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for succ in sorted(edges.get(node, ())):
            if state.get(succ) == 1:
                return path[path.index(succ):] + [succ]
            if succ not in state and (found := visit(succ)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_is_small(package):
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules(package).items()}
    assert len(sizes) > 1, f"{package} is meant to be a package of several modules"
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}, f"modules over {MAX_LINES} lines"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_the_package(package):
    modules = _modules(package)
    # the package's __init__ is the facade: it imports its modules, and none of them may import it back
    edges = {name: {m for m in _imports(path) if m in modules} for name, path in modules.items()}
    assert _cycle(edges) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_the_former_modules_public_names_still_import(package):
    if package == "torch_capture":
        pytest.importorskip("torch")
    module = importlib.import_module(f"mpplan.capture.{package}")
    missing = [name for name in PUBLIC[package] if not hasattr(module, name)]
    assert missing == []

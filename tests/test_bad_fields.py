"""One field of a valid graph file or ``plan.json`` given a value of the wrong type: ``mpplan verify`` and
``mpplan plan`` refuse it with exit 2 and one line that names the file and the field, never a traceback.

The plan starts from the plan ``mpplan plan`` makes of ``bad_inputs``' two-device config, with the
optional sections (``blocks``, ``scratch``, a device's ``scratch_bytes``) added as an older file holds
them, so it verifies untouched.  A value's wrong types are drawn by the type of the value it replaces.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_inputs import BASE_FILES
from mpplan.cli import main

Where = tuple[str | int, ...]
"""A place in a document: keys and list indices."""

#: Plan sections whose content is free-form (settings this version keeps as given) or a label only.
_FREE = (("planner", "settings", "shift"), ("planner", "settings", "remat"), ("planner", "settings", "remat_chosen"))

#: Values of another JSON type than the one replaced.  ``null`` is left out where the formats read it as
#: "absent" (a graph file's fields, a block's ``adopts``, a setting).
_WRONG: dict[type, list[Any]] = {
    int: ["nope", 8.5, [8], {"x": 8}, True],
    float: ["nope", [8], {"x": 8}, True],
    str: [8, 8.5, [8], {"x": 8}, True],
    bool: ["nope", 1, [True]],
    list: ["nope", 8, {"x": 8}],
    dict: ["nope", 8, [8]],
}


def _run(folder: Path, argv: list[str]) -> tuple[int, str]:
    """(exit code, stderr) of ``mpplan argv`` run in ``folder``; an exception escaping ``main`` fails the test."""
    err = io.StringIO()
    logger = logging.getLogger("mpplan")
    handlers = logger.handlers[:]
    logger.handlers.clear()  # the CLI adds its own, on this stderr
    cwd = Path.cwd()
    try:
        os.chdir(folder)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        os.chdir(cwd)
        logger.handlers[:] = handlers
    return code, err.getvalue()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """A folder with the graph and config, and the graph document and a plan document that verify."""
    folder = tmp_path_factory.mktemp("fields")
    for name, text in BASE_FILES.items():
        (folder / name).write_text(text)
    assert _run(folder, ["plan", "c.yaml", "--out", "out"])[0] == 0
    plan = json.loads((folder / "out" / "plan.json").read_text())
    steps = len(plan["schedule"])
    plan["blocks"] = [{"device": d["name"], "offset": 0, "bytes": d["arena_bytes"], "first": 0, "last": steps - 1}
                      for d in plan["devices"]]
    plan["scratch"] = {plan["schedule"][0]: 0}
    plan["devices"][0]["scratch_bytes"] = 0
    (folder / "plan.json").write_text(json.dumps(plan))
    for argv in (["verify", "plan.json", "--graph", "g.yaml"], ["verify", "plan.json", "--config", "c.yaml"]):
        assert _run(folder, argv) == (0, ""), argv
    return folder, yaml.safe_load(BASE_FILES["g.yaml"]), plan


def _places(doc: Any, path: Where = ()) -> Iterator[Where]:
    """The path of every value below ``doc`` (containers too), outside ``_FREE``."""
    if path in _FREE:
        return
    if path:
        yield path
    children = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in children:
        yield from _places(value, (*path, key))


def _at(doc: Any, path: Where) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _with(doc: Any, path: Where, value: Any) -> Any:
    doc = copy.deepcopy(doc)
    _at(doc, path[:-1])[path[-1]] = value
    return doc


def _dotted(path: Where) -> str:
    """``ops[1].inputs``, ``buffers.h0.offset``: a field as the error lines name it."""
    return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path).lstrip(".")


def _named(line: str, path: Where) -> bool:
    """The line names the field, or for an entry of a list of names (``schedule``, ``inputs``) the list."""
    return _dotted(path) in line or (isinstance(path[-1], int) and _dotted(path[:-1]) in line)


@st.composite
def _wrong_field(draw: st.DrawFn, doc: Any) -> tuple[Where, Any]:
    path = draw(st.sampled_from(sorted(_places(doc), key=repr)))
    return path, draw(st.sampled_from(_WRONG[type(_at(doc, path))]))


def _assert_refused(code: int, stderr: str, file: str, path: Where) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, f"exit {code}, expected 2 and one line:\n{stderr[-3000:]}"
    line = lines[0]
    assert line.startswith("mpplan: error: ") and file in line and "Traceback" not in line, line
    assert _named(line, path), f"{_dotted(path)} not named: {line}"


@pytest.mark.parametrize("which", ["plan", "graph"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_field_of_the_wrong_type_is_one_line_naming_it(base: tuple[Path, Any, Any], which: str,
                                                         data: st.DataObject) -> None:
    """A plan field, through ``verify`` with a graph file and with a config; a graph field, through ``verify``
    and ``plan`` (whose line names the config's ``model.graph.path`` and then the graph file's field)."""
    folder, graph, plan = base
    doc = plan if which == "plan" else graph
    path, value = data.draw(_wrong_field(doc), label="field, value")
    bad = _with(doc, path, value)
    if which == "plan":
        file = "bad.json"
        (folder / file).write_text(json.dumps(bad))
        runs = (["verify", file, "--graph", "g.yaml"], ["verify", file, "--config", "c.yaml"])
    else:
        file = "bad.yaml"
        (folder / file).write_text(yaml.safe_dump(bad, sort_keys=False))
        (folder / "bad_c.yaml").write_text(BASE_FILES["c.yaml"].replace("g.yaml", file))
        runs = (["verify", "plan.json", "--graph", file], ["plan", "bad_c.yaml", "--out", "bad_out"])
    for argv in runs:
        _assert_refused(*_run(folder, argv), file, path)


@pytest.mark.parametrize("entry", ["nope", 8, None, [8]])
def test_a_buffer_that_is_no_mapping_is_named(base: tuple[Path, Any, Any], entry: Any) -> None:
    """A ``buffers`` entry that is no mapping (an ``AttributeError`` traceback before): the buffer is named."""
    folder, _, plan = base
    name = next(iter(plan["buffers"]))
    (folder / "bad.json").write_text(json.dumps(_with(plan, ("buffers", name), entry)))
    code, stderr = _run(folder, ["verify", "bad.json", "--graph", "g.yaml"])
    assert code == 2 and stderr.strip().endswith(f"bad.json: buffers.{name}: expected a mapping, got {entry!r}")

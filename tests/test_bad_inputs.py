"""Issue 17's corpus: every bad input gets exit 2 and one line, in bounded time and memory, and none is accepted.

Each case runs ``mpplan.cli.main`` in a forked child (so a hang or a runaway
allocation cannot take the test run with it, and a fork costs milliseconds where a
fresh interpreter costs seconds) with:

* an address-space limit of 1 GiB above what the parent already maps: an input that
  makes mpplan allocate more dies with ``MemoryError`` and fails the case;
* a 10 s alarm: an input that makes mpplan hang is killed and fails the case.

The limits are guards, not measurements: a case passes when it is refused properly
far inside them.  The corpus itself is in ``tests/bad_inputs.py``.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
from pathlib import Path

import pytest
import torch  # noqa: F401 - imported once here, so the factory cases' children do not each import it

from bad_inputs import BASE_FILES, cases
from mpplan.capture import graph_from_config
from mpplan.config import load_config, resolve_devices
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify

GIB = 2**30
TIME_LIMIT_S = 10


@pytest.fixture(scope="module")
def base_plan(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("base")
    for name, text in BASE_FILES.items():
        (folder / name).write_text(text)
    config = load_config(folder / "c.yaml")
    graph = graph_from_config(config)
    result = plan(graph, resolve_devices(config), PlannerSettings.from_config(config.planner))
    verify(graph, result)
    return result.to_dict()


def test_the_corpus_is_large_and_covers_every_class(base_plan):
    corpus = cases(base_plan)
    kinds = {c.kind for c in corpus}
    assert len(corpus) >= 100
    assert kinds >= {
        "alias-bomb", "deep-nesting", "huge-integer", "not-utf8", "duplicate-key", "tensor-twice", "device-map",
        "device-count", "factory", "malformed-plan", "corrupt-report", "other",
    }
    assert len({c.id for c in corpus}) == len(corpus)


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


def run_forked(folder: Path, argv: tuple[str, ...]) -> tuple[int | None, int | None, str]:
    """(exit code, killing signal, stderr) of ``mpplan argv`` run in ``folder`` in a limited child."""
    from mpplan.cli import main

    err_path = folder / ".stderr"
    limit = _vm_bytes() + GIB
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.chdir(folder)
            sys.path.insert(0, str(folder))  # the factory cases' user modules
            err = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - pytest's capture objects are not fds 1 and 2
            sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
            logging.getLogger("mpplan").handlers.clear()  # the CLI adds its own, on this stderr
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(TIME_LIMIT_S)
            code = main(list(argv))
        except BaseException:  # noqa: BLE001 - a traceback here is the failure the test reports
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status, _ = os.wait4(pid, 0)
    stderr = err_path.read_text(errors="replace") if err_path.exists() else ""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status), stderr
    return os.WEXITSTATUS(status), None, stderr


def _write(folder: Path, files: dict[str, str | bytes]) -> None:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def _ids() -> list[str]:
    return [c.id for c in cases(_shape_only_plan())]


def _shape_only_plan() -> dict:
    """A plan-shaped dict, only for naming the cases at collection time (their content comes from ``base_plan``)."""
    device = {"name": "a", "capacity_bytes": 1, "static_bytes": 0, "arena_bytes": 0, "peak_bytes": 0,
              "lower_bound_bytes": 0}
    return {"schema": "mpplan.plan/1", "graph": {}, "devices": [device], "schedule": [], "buffers": {},
            "predicted": {}, "planner": {}}


@pytest.mark.parametrize("case_id", _ids())
def test_bad_input_gets_one_line_and_exit_2(case_id, base_plan, tmp_path):
    (case,) = [c for c in cases(base_plan) if c.id == case_id]
    _write(tmp_path, BASE_FILES)
    (tmp_path / "plan.json").write_text(json.dumps(base_plan))
    _write(tmp_path, case.files)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    code, killed, stderr = run_forked(tmp_path, case.argv)
    assert killed is None, f"killed by signal {killed} (hang past {TIME_LIMIT_S} s?): {stderr[-2000:]}"
    lines = stderr.strip().splitlines()
    assert code == 2, f"exit {code}, expected 2; stderr:\n{stderr[-3000:]}"
    assert len(lines) == 1 and lines[0].startswith("mpplan: error: "), stderr[-3000:]
    assert case.says.lower() in lines[0].lower(), lines[0]
    assert len(lines[0]) < 1000, "one line, and a readable one"
    for path, content in before.items():  # nothing the user wrote is overwritten
        assert path.read_bytes() == content, f"{path} was overwritten"


@pytest.mark.parametrize("verb", ["inspect", "plan", "verify", "run", "search"])
def test_every_verb_that_imports_user_code_says_so_in_its_help(verb, capsys):
    from mpplan.cli import main

    with pytest.raises(SystemExit):
        main([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Runs user code" in text and "module:function" in text


def test_a_failing_factory_is_one_line_and_verbose_shows_its_traceback(tmp_path, monkeypatch, capsys):
    from bad_inputs import TORCH_CONFIG

    from mpplan.cli import main

    (tmp_path / "f.yaml").write_text(TORCH_CONFIG.format(factory="userfac_verbose:make"))
    (tmp_path / "userfac_verbose.py").write_text("def make():\n    raise RuntimeError('weights missing')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    logger = logging.getLogger("mpplan")
    monkeypatch.setattr(logger, "handlers", [])  # the CLI adds its handler on this test's stderr; restored after
    monkeypatch.setattr(logger, "level", logger.level)
    assert main(["plan", "f.yaml"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "userfac_verbose:make raised RuntimeError: weights missing (mpplan -v shows the traceback)" in line
    logger.handlers.clear()
    assert main(["-v", "plan", "f.yaml"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "userfac_verbose.py" in err
    assert err.strip().splitlines()[-1].startswith("mpplan: error: f.yaml: model.torch.factory: ")

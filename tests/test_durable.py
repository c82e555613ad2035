"""Durable, atomic writes (issue 17): whole files or none, the user's umask, no temp file left behind."""

from __future__ import annotations

import os
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from mpplan import durable
from mpplan.cli import main
from mpplan.durable import is_temp, remove_stale_temps, write_bytes, write_json, write_text

CONFIG = """\
model: {synthetic: {kind: chain, n: 6}}
devices: [{name: a, capacity: 1GiB}, {name: b, capacity: 1GiB}]
output: {dir: out}
"""


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_users_umask(tmp_path, mask, expected):
    with umask(mask):
        path = write_json({"a": 1}, tmp_path / "x.json")
    assert mode(path) == expected
    assert path.read_text() == '{\n "a": 1\n}\n'


def test_every_file_mpplan_plan_writes_is_whole_with_the_umask_and_no_temp_is_left(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    with umask(0o022):
        assert main(["-q", "plan", "c.yaml"]) == 0
    out = tmp_path / "out" / "plan"  # plan's own subfolder of output.dir
    written = sorted(p.name for p in out.iterdir())
    assert {"plan.json", "timeline.json", "baselines.json", "report.md"} <= set(written)
    for name in written:
        assert mode(out / name) == 0o644, name  # JSON files were 0600 before
    assert not [n for n in written if is_temp(n) or n.startswith(".")]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp(tmp_path, monkeypatch):
    path = write_text(tmp_path / "a.txt", "old")

    def broken(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError, match="No space left"):
        write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_write_killed_before_its_rename_leaves_the_old_file_and_the_next_write_removes_the_temp(tmp_path):
    path = write_text(tmp_path / "plan.json", "old")
    pid = os.fork()
    if pid == 0:  # the child dies with SIGKILL right where a kill hurts most: data written, not renamed
        try:
            os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
            write_text(path, "new " * 1000)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert path.read_text() == "old"
    temps = [p for p in tmp_path.iterdir() if is_temp(p.name)]
    assert len(temps) == 1 and f"-{pid}-" in temps[0].name
    write_text(tmp_path / "other.json", "x")  # the next run's next write into this folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json", "plan.json"]


def test_a_live_processs_temp_file_is_left_alone(tmp_path):
    live = tmp_path / f".plan.json.mpplan-{os.getppid()}-0badcafe.tmp"
    dead = tmp_path / f".plan.json.mpplan-{_dead_pid()}-0badcafe.tmp"
    other = tmp_path / ".plan.json.tmp"  # not ours: never touched
    for p in (live, dead, other):
        p.write_text("partial")
    assert remove_stale_temps(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_writes_fsync_the_file_and_the_folder(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_bytes(tmp_path / "f.png", b"\x89PNG")
    assert synced == ["file", "folder"]


def test_a_folder_that_cannot_be_made_is_one_line_from_the_cli(tmp_path, monkeypatch, capsys):
    (tmp_path / "c.yaml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    assert main(["-q", "plan", "c.yaml", "--out", "c.yaml/sub"]) == 2  # a file where a folder must go
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mpplan: error: ") and "Not a directory" in err[0], err
    assert (tmp_path / "c.yaml").read_text() == CONFIG


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_the_temp_name_pattern_is_what_durable_writes(tmp_path, monkeypatch):
    seen: list[str] = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append(Path(a).name), real(a, b)))
    durable.write_text(tmp_path / "r.md", "x")
    assert len(seen) == 1 and is_temp(seen[0])

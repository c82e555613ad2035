"""Durable, atomic file writes: every file mpplan writes appears whole or not at all.

A write goes to a temp file in the target's own folder (so the rename cannot cross
file systems), is fsynced, renamed over the target, and the folder is fsynced so the
rename itself survives a power cut.  A process killed at any instant leaves the old
file or the new one, never a torn one.

Temp files are named ``.<target>.mpplan-<pid>-<random>.tmp``.  They are removed when
the write fails, and the next write into the same folder removes those whose process
is gone (a ``SIGKILL`` runs no cleanup).  They are created with mode ``0o666`` and the
kernel applies the user's umask, as for any file the user's tools make: ``mkstemp``'s
``0o600`` would hide results from the user's group.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> write_text(folder / "a.txt", "hello\\n").read_text()
'hello\\n'
>>> [p.name for p in folder.iterdir()]
['a.txt']
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

from mpplan.json_text import dumps_indented

_TEMP = re.compile(r"^\..+\.mpplan-(\d+)-[0-9a-f]+\.tmp$")


def write_bytes(path: str | os.PathLike[str], data: bytes, *, make_folder: bool = True) -> Path:
    """Replace ``path`` with ``data`` atomically and durably; return the path.

    ``make_folder`` creates the folder first; without it a missing folder raises ``FileNotFoundError``.
    """
    path = Path(path)
    if make_folder:
        path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path.parent)
    tmp = path.parent / f".{path.name}.mpplan-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    return path


def write_text(path: str | os.PathLike[str], text: str, *, make_folder: bool = True) -> Path:
    """``write_bytes`` of ``text`` as UTF-8."""
    return write_bytes(path, text.encode("utf-8"), make_folder=make_folder)


def write_json(data: Any, path: str | os.PathLike[str]) -> Path:
    """``data`` as indented JSON (one trailing newline); encoding errors are raised before any file exists."""
    return write_text(path, dumps_indented(data) + "\n")  # json.dumps(data, indent=1), faster


def fsync_folder(folder: str | os.PathLike[str]) -> None:
    """Make a folder's entries (a rename, a new file) durable; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a folder: the rename is still atomic
        pass
    finally:
        os.close(fd)


def remove_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove this module's temp files in ``folder`` whose writing process is gone; return them.

    A temp file of a live process (another mpplan writing here now) is left alone.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP.match(entry.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def is_temp(name: str) -> bool:
    """Whether ``name`` is one of this module's temp file names."""
    return _TEMP.match(name) is not None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True

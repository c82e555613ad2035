"""The search's output folder: ``results.jsonl``, ``best/`` and ``summary.json``, crash-safe and resumable.

* ``results.jsonl``: one ``Result`` per line, appended, flushed and fsynced the moment
  a candidate finishes, so a search killed at any instant has lost at most the
  candidates still running.  A line cut short by the kill is dropped on resume.
* ``best/plan.json`` and ``best/result.json``: the best candidate so far, and
  ``summary.json``: counts and the best; each rewritten atomically (temp file,
  rename), so a reader sees the old file or the new one, never half of one.

A fresh search refuses a folder whose ``results.jsonl`` holds anything: nothing
the user has is overwritten.  ``resume=True`` loads it instead, and every key in it
counts as finished (a ``predicted_fit`` one until it is measured).  An exclusive lock on ``results.jsonl`` keeps two
searches from writing into one folder at once.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from mpplan.cluster.records import Result, Status
from mpplan.durable import fsync_folder, remove_stale_temps
from mpplan.errors import ConfigError
from mpplan.plan import Plan, save_plan, write_json_atomic

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; never imported at run time

RESULTS = "results.jsonl"
SUMMARY = "summary.json"
BEST = "best"


class ResultStore:
    """The results of one search folder: those loaded on resume plus those added since."""

    def __init__(self, out: str | Path, *, resume: bool = False) -> None:
        self.out = Path(out)
        self.path = self.out / RESULTS
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"{self.out}: --out: exists and is not a folder")
        if self.path.exists() and self.path.stat().st_size > 0 and not resume:
            raise ConfigError(
                f"{self.path}: --out: a search already wrote results here; pass --resume to continue it, "
                "or choose another --out"
            )
        self.out.mkdir(parents=True, exist_ok=True)
        for folder in (self.out, self.out / BEST):  # temp files of a search killed mid-write
            remove_stale_temps(folder)
        self._file: IO[str] = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until close()
        fsync_folder(self.out)  # a results.jsonl made just now survives a power cut with its first lines
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.close()
            raise ConfigError(f"{self.path}: --out: another search is writing into this folder") from None
        self.results: dict[str, Result] = _load(self._file, self.path)
        self.loaded_keys = frozenset(self.results)
        """Keys whose results were already there (resume)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, key: str) -> bool:
        return key in self.results

    def get(self, key: str) -> Result | None:
        return self.results.get(key)

    def add(self, result: Result) -> bool:
        """Record a finished candidate durably; False (and nothing written) when its key is already final.

        A ``predicted_fit`` result is final unless the candidate is measured later (a
        resume with a larger ``top_k``): a measured result supersedes it.
        """
        if not _supersedes(result, self.results.get(result.key)):
            return False
        self._file.write(result.to_json() + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.results[result.key] = result
        return True

    def write_best(self, plan: Plan, result: Result) -> None:
        """Replace ``best/plan.json`` and ``best/result.json`` (plan first: ``result.json`` names the plan's key)."""
        save_plan(plan, self.out / BEST / "plan.json")
        write_json_atomic(result.to_dict(), self.out / BEST / "result.json")

    def best_on_disk(self) -> str | None:
        """The key ``best/result.json`` names, if there is one."""
        path = self.out / BEST / "result.json"
        try:
            return str(json.loads(path.read_text())["key"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_summary(self, summary: dict[str, Any]) -> Path:
        return write_json_atomic(summary, self.out / SUMMARY)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()  # closing releases the lock


def _load(handle: IO[str], path: Path) -> dict[str, Result]:
    """Parse every complete line; cut off a last line the previous run did not finish writing."""
    handle.seek(0)
    text = handle.read()
    complete = text[: text.rfind("\n") + 1]
    if len(complete) != len(text):
        handle.truncate(len(complete.encode("utf-8")))
    handle.seek(0, os.SEEK_END)
    results: dict[str, Result] = {}
    for number, line in enumerate(complete.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}: line {number}: invalid JSON ({exc.msg}); remove the line or start a new --out"
            ) from None
        result = Result.from_dict(data, f"{path}: line {number}")
        if _supersedes(result, results.get(result.key)):
            results[result.key] = result
    return results


def _supersedes(new: Result, old: Result | None) -> bool:
    """The first result of a key is final, except that a measurement replaces a ``predicted_fit``."""
    return old is None or (old.status is Status.PREDICTED_FIT and new.attempts > 0)

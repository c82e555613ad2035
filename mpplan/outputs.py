"""Where each command writes: one folder per command, so no command overwrites another's results.

``mpplan search`` owns the config's ``output.dir`` (``results.jsonl``, ``best/``, its report);
``mpplan plan`` and ``mpplan run`` default to ``<output.dir>/plan`` and ``<output.dir>/run``
beside it, and refuse a folder that holds a search's results (they would overwrite its report,
or its best plan).
"""

from __future__ import annotations

from pathlib import Path

from mpplan.errors import ConfigError

#: Files that mark a folder as a search's: its results, or its best candidate's folder.
SEARCH_MARKS = ("results.jsonl", "result.json")


def output_folder(verb: str, out: str | None, config_dir: str) -> Path:
    """The folder ``verb`` writes into: ``--out`` when given, else its own folder in ``config_dir``.

    >>> output_folder("plan", None, "runs/quickstart").as_posix(), output_folder("search", None, "runs/q").as_posix()
    ('runs/quickstart/plan', 'runs/q')
    """
    folder = Path(out) if out else Path(config_dir) if verb == "search" else Path(config_dir) / verb
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out: {folder} exists and is not a folder")
    if verb != "search":
        marks = [name for name in SEARCH_MARKS if (folder / name).is_file()]
        if marks:
            raise ConfigError(
                f"--out: {folder} holds the results of mpplan search ({marks[0]}); mpplan {verb} would "
                "overwrite them: give another folder"
            )
    return folder

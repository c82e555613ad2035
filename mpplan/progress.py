"""Progress bars for long work (capture of large models, planning of large graphs).

A bar is drawn with ``tqdm`` on stderr only when stderr is a terminal and the
``mpplan`` logger shows INFO (the CLI's ``--quiet`` raises it to WARNING); anywhere
else the bar is a no-op, so library calls in scripts, tests and Ray workers stay
silent.  Nothing is printed to stdout.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass
class Bar:
    """A running bar, or a no-op one (``_tqdm`` None)."""

    _tqdm: Any = None

    @property
    def drawn(self) -> bool:
        return self._tqdm is not None

    def update(self, n: int = 1, *, note: str | None = None) -> None:
        """Advance by ``n``; ``note`` names what is being done now."""
        if self._tqdm is None:
            return
        if note is not None:
            self._tqdm.set_postfix_str(note, refresh=False)
        self._tqdm.update(n)


@contextmanager
def progress(desc: str, total: int, *, unit: str = "it", enabled: bool = True,
             file: TextIO | None = None) -> Iterator[Bar]:
    """A bar over ``total`` units of work, drawn only where a person is watching (see the module docstring)."""
    stream = file or sys.stderr
    watching = enabled and total > 0 and stream.isatty() and logging.getLogger("mpplan").isEnabledFor(logging.INFO)
    if not watching:
        yield Bar()
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=False)
    try:
        yield Bar(bar)
    finally:
        bar.close()

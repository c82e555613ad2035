"""Shared by the benchmark scripts: the machine header and section-wise updates of docs/benchmarks.md.

Each script owns one section between ``<!-- bench:NAME -->`` markers, so scripts can
be rerun one at a time without clobbering the others' numbers.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "docs" / "benchmarks.md"
SHARED_DATA = REPO.parent / "shared" / "data" / "checkmate_graphs"


def machine() -> str:
    """One line naming the machine, the date and the versions, for the top of every section."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
        cpu = model
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{datetime.date.today().isoformat()}, {cpu}, {os.cpu_count()} cores, {gpu}; "
        f"Python {platform.python_version()}, torch {torch.__version__}, commit {commit or '?'}"
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace (or append) the section ``name`` of ``path`` with ``body``."""
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEvery section says how to rerun it.\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...`` then ``t[0]`` is the seconds taken."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def human(n: int) -> str:
    """Bytes in binary units, precise enough to tell heuristics apart."""
    from mpplan.units import format_size

    return format_size(n)


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)

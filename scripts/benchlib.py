"""Shared by the benchmark scripts: the machine header and section-wise updates of docs/benchmarks.md.

Each script owns one section between ``<!-- bench:NAME -->`` markers, so scripts can
be rerun one at a time without clobbering the others' numbers; ``scripts/bench.py``
runs them all and writes the ``machine`` header at the top.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import math
import os
import platform
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

if TYPE_CHECKING:
    from mpplan.capture.torch_capture import CapturedProgram
    from mpplan.config import Config, Device

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "docs" / "benchmarks.md"
SHARED_DATA = REPO.parent / "shared" / "data" / "checkmate_graphs"
TITLE = "# Benchmarks\n\nEvery section says how to rerun it; `python scripts/bench.py` reruns them all.\n"
PACKAGES = ("torch", "transformers", "accelerate", "ray")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gib() -> float:
    """Total host memory in GiB (0 when /proc/meminfo is missing)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def versions() -> str:
    """``Python x, torch y, ...`` for the packages the benchmarks use (``missing`` when not installed)."""
    found = [f"Python {platform.python_version()}"]
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} missing")
    return ", ".join(found)


def commit() -> str:
    """The short commit, marked ``+ uncommitted changes`` when the tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return head + (" + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def gpu() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"


def machine() -> str:
    """The machine in one line: CPU model, cores, RAM, GPU."""
    return f"{cpu_model()}, {os.cpu_count()} cores, {ram_gib():.0f} GiB RAM, {gpu()}"


def stamp(command: str) -> str:
    """The line under every section title: when, where, at which commit, and how to rerun it."""
    return (
        f"Run {datetime.date.today().isoformat()} on {machine()}; {versions()}; commit {commit()}. "
        f"Rerun: `{command}`."
    )


def load_average() -> float:
    """The 1-minute load average (the box may be shared: timings are only as quiet as it was)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _marker(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def _sections(text: str) -> dict[str, str]:
    """Every ``name -> body`` between markers in ``text``."""
    return {m.group(1): m.group(2) for m in re.finditer(r"<!-- bench:(\S+) -->\n(.*?)\n<!-- /bench:\1 -->", text, re.S)}


def write_section(name: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace (or append) the section ``name`` of ``path`` with ``body``."""
    start, end = _marker(name)
    text = path.read_text() if path.exists() else TITLE
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_layout(names: Sequence[str], path: Path = BENCHMARKS) -> None:
    """Rewrite ``path`` as the title and the sections ``names`` in that order.

    Sections already there keep their body until rerun, new ones get a placeholder, and
    sections that only their own script writes (``bench_gpu``, ``bench_cli``, ...) stay, after
    the suite's.
    """
    old = _sections(path.read_text()) if path.exists() else {}
    blocks = [TITLE.rstrip()]
    for name in [*names, *(n for n in old if n not in names)]:
        start, end = _marker(name)
        blocks.append(f"{start}\n{old.get(name, '(not run yet)').rstrip()}\n{end}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(blocks) + "\n")


def section_main(name: str, build: Callable[[bool], str], doc: str | None) -> None:
    """The command line of a one-section script: ``[--quick]``, then write section ``name``."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smaller run (minutes)")
    args = parser.parse_args()
    write_section(name, build(args.quick))
    log(f"wrote the {name} section of {BENCHMARKS.relative_to(REPO)}")


def rerun(script: str, quick: bool) -> str:
    """The command that reruns ``script`` as this run did."""
    return f"python scripts/{script}" + (" --quick" if quick else "")


@contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...`` then ``t[0]`` is the seconds taken."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch's intra-op pool with ``n`` threads inside the block, as before after it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fit_exponent(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of log(y) against log(x): ``y ~ x^slope``."""
    if len(points) < 2:
        return float("nan")
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(max(y, 1e-9)) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def human(n: int | float) -> str:
    """Bytes in binary units, precise enough to tell heuristics apart."""
    from mpplan.units import format_size

    return format_size(n)


def ratio(a: float, b: float) -> str:
    """``a / b`` as ``1.23x`` (``inf`` when ``b`` is 0)."""
    return f"{a / b:.2f}x" if b else "inf"


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


_WRITE_GRAPH = (
    "import sys; from mpplan.capture.graph_file import save_graph; "
    "from mpplan.capture.synthetic import synthetic_graph; "
    "g = synthetic_graph('transformer', layers=int(sys.argv[1]), train=True); save_graph(g, sys.argv[2]); "
    "print(len(g.ops))"
)


def synthetic_graph_file(tree: Path, layers: int, path: Path) -> int:
    """Write the synthetic transformer training graph of ``layers`` layers to ``path`` with ``tree``'s own
    ``save_graph`` (a child process importing ``tree``'s mpplan); return its op count.

    Each tree then reads a file in the layout it writes: JSON in columns since the columnar layout,
    which a tree from before it does not read, in rows before.
    """
    done = subprocess.run([sys.executable, "-c", _WRITE_GRAPH, str(layers), str(path)], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1])


@dataclass(frozen=True)
class TorchCase:
    """A config's torch model built on CPU with its seeded inputs and captured for CPU execution."""

    label: str
    config: Config
    model: Any
    inputs: Any
    program: CapturedProgram

    @property
    def device(self) -> Device:
        """The config's first device: the single device the memory benchmarks plan for."""
        from mpplan.config import resolve_devices

        return resolve_devices(self.config)[0]


def torch_case(config: str, overrides: Sequence[str] = ()) -> TorchCase:
    """Build and capture ``configs/<config>.yaml`` (with ``--set``-style ``overrides``)."""
    import torch

    from mpplan.capture import build_torch_model
    from mpplan.config import load_config
    from mpplan.runtime import capture_for

    cfg = load_config(REPO / "configs" / f"{config}.yaml", overrides)
    spec = cfg.model.torch
    model, inputs = build_torch_model(cfg, device="cpu")
    optimizer = None if spec.optimizer == "none" else spec.optimizer
    with timer() as t:
        program = capture_for(model, inputs, torch.device("cpu"), mode=spec.mode, optimizer=optimizer, loss_fn=None)
    label = f"`{config}`" + "".join(f" `{o}`" for o in overrides)
    log(f"{label}: captured {len(program.graph.ops)} ops in {t[0]:.1f}s")
    return TorchCase(label, cfg, model, inputs, program)


def config_command(verb: str, config: str, overrides: Sequence[str] = ()) -> str:
    """The ``mpplan`` command line that runs ``configs/<config>.yaml`` with ``overrides``."""
    return f"mpplan {verb} configs/{config}.yaml" + "".join(f" --set {o}" for o in overrides)

"""Progress bars: drawn on a watched terminal, silent everywhere else."""

from __future__ import annotations

import io
import logging

import pytest

from mpplan.progress import Bar, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def info_logging():
    logger = logging.getLogger("mpplan")
    saved = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(saved)


def test_a_watched_terminal_gets_a_bar(info_logging):
    screen = Terminal()
    with progress("planning big", 3, unit="stage", file=screen) as bar:
        assert bar.drawn
        for stage in ("schedule", "place", "assign"):
            bar.update(note=stage)
        assert bar._tqdm.n == 3
    assert "planning big" in screen.getvalue()


@pytest.mark.parametrize(
    ("stream", "level", "enabled"),
    [(io.StringIO(), logging.INFO, True), (Terminal(), logging.WARNING, True), (Terminal(), logging.INFO, False)],
    ids=["not-a-terminal", "quiet", "small-work"],
)
def test_no_bar_unless_someone_watches(info_logging, stream, level, enabled):
    info_logging.setLevel(level)
    with progress("x", 5, file=stream, enabled=enabled) as bar:
        bar.update(note="y")
        assert not bar.drawn
    assert stream.getvalue() == ""


def ticks(monkeypatch) -> list[int]:
    """Record every drawn bar's updates."""
    seen: list[int] = []
    update = Bar.update

    def spy(self: Bar, n: int = 1, *, note: str | None = None) -> None:
        if self.drawn:
            seen.append(n)
        update(self, n, note=note)

    monkeypatch.setattr(Bar, "update", spy)
    return seen


def test_planning_a_large_graph_draws_stages(info_logging, monkeypatch):
    from mpplan.capture.synthetic import chain
    from mpplan.config import Device
    from mpplan import planner

    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    monkeypatch.setattr(planner, "PROGRESS_MIN_OPS", 10)
    seen = ticks(monkeypatch)
    planner.plan(chain(50), [Device("a", 1 << 40), Device("b", 1 << 40)])
    assert "planning chain" in screen.getvalue() and sum(seen) == 3 + 2  # schedule, place, copies, 2 devices


def test_capturing_a_model_ticks_per_module(info_logging, monkeypatch):
    torch = pytest.importorskip("torch")
    from mpplan.capture import torch_capture
    from mpplan.capture.torch_capture import tracing

    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    monkeypatch.setattr(tracing, "PROGRESS_MIN_MODULES", 1)  # read where the trace runs
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    seen = ticks(monkeypatch)
    torch_capture.capture(model, (torch.randn(2, 4),), mode="infer")
    assert "capturing Sequential" in screen.getvalue() and sum(seen) == 3

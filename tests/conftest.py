"""Shared builders: small graphs and devices the tests use everywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mpplan.config import Device
from mpplan.graph import Graph, Kind, Op, Tensor

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SHARED_DATA = SHARED / "data"
CHECKMATE = SHARED_DATA / "checkmate_graphs"

#: Why a test that reads the benchmark graphs skipped, and where the graphs go.  A clone has no
#: ``../shared``: these tests skip there, every other test runs.
SHARED_DATA_REASON = (
    f"needs the Checkmate/Moccasin benchmark graphs in {CHECKMATE} (not in the repository): copy the "
    "node-link JSON files of the data/ folder of github.com/haoming-codes/moccasin there "
    '(README.md, "Benchmark data")'
)

#: Marks a test (or a parametrized family) that reads ``../shared/data``: skipped, saying where to put it.
needs_shared_data = pytest.mark.skipif(not CHECKMATE.is_dir(), reason=SHARED_DATA_REASON)


def shared_data_files(pattern: str) -> list[Path]:
    """The benchmark graphs matching ``pattern`` (sorted), or none when the data is absent: parametrize
    over them under ``needs_shared_data``."""
    return sorted(CHECKMATE.glob(pattern)) if CHECKMATE.is_dir() else []


def shared_data(name: str) -> Path:
    """The benchmark graph file ``name``, or skip the calling test, saying where to put the data."""
    path = CHECKMATE / name
    if not path.is_file():
        pytest.skip(SHARED_DATA_REASON)
    return path


def chain(n: int, nbytes: int = 64) -> Graph:
    """x -> op0 -> t0 -> op1 -> t1 ... -> t{n-1} (the output), with one param per op."""
    tensors = [Tensor("x", nbytes, Kind.INPUT)]
    ops = []
    prev = "x"
    for i in range(n):
        tensors += [Tensor(f"w{i}", 16, Kind.PARAM), Tensor(f"t{i}", nbytes)]
        ops.append(Op(f"op{i}", "Linear", (prev, f"w{i}"), (f"t{i}",), cost=1.0))
        prev = f"t{i}"
    return Graph(f"chain{n}", tuple(tensors), tuple(ops), (prev,)).validate()


def diamond() -> Graph:
    """a -> (b, c) -> d: two parallel branches joined."""
    tensors = (
        Tensor("x", 8, Kind.INPUT),
        Tensor("a", 100),
        Tensor("b", 50),
        Tensor("c", 70),
        Tensor("d", 10),
    )
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("B", "f", ("a",), ("b",)),
        Op("C", "f", ("a",), ("c",)),
        Op("D", "f", ("b", "c"), ("d",)),
    )
    return Graph("diamond", tensors, ops, ("d",)).validate()


def tiny() -> Graph:
    """The graph-file example of the foundation issue: a view and an in-place op."""
    tensors = (
        Tensor("x", 64, Kind.INPUT),
        Tensor("w", 64, Kind.PARAM, shape=(4, 4), dtype="float32"),
        Tensor("h", 64),
        Tensor("hv", 0, alias_of="h"),
    )
    ops = (
        Op("fc", "Linear", ("x", "w"), ("h",), cost=2.0),
        Op("relu", "Relu", ("h",), ("h",)),
    )
    return Graph("tiny", tensors, ops, ("h",)).validate()


def device(capacity: int = 1 << 30, name: str = "gpu0") -> Device:
    return Device(name=name, capacity=capacity)


@pytest.fixture
def one_device() -> list[Device]:
    return [device()]


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """One intra-op thread for a module that runs tiny CPU kernels: on a loaded 2-core box two
    threads fight for the cores and make each step many times slower."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)

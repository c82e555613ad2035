"""The Plan record and ``plan.json`` (schema ``mpplan.plan/1``).

A plan is what users, the verifier, the executor and the search share: the op
order, the device of every op, the cross-device copies, where every dynamic
storage lives in its device's arena, and the predicted memory per device.
Every field but ``planner.seconds`` is a deterministic function of the inputs.
``module_devices`` (an extension of the DESIGN schema) maps each module path to
the device of its first forward op, in forward order: what exports need.
``settings`` and ``remat`` are typed records (``mpplan.plan_records``) that read as the
mappings ``plan.json`` holds.
``scratch`` (an extension too) maps an op to the bytes it holds outside its device's
arena while it runs (a result an op with no ``out=`` overload computes before it is
copied in, see ``mpplan.runtime.scratch``); each device's ``scratch_bytes`` is the
largest of its ops', and its peak counts it.  Both are written only when non-zero.
``blocks`` (an extension too; absent in older files, which then hold one block per
device: the whole arena, all step) cut each device's arena into allocations made
when their first buffer is and freed when their last dies (``Block``); a device's
peak is then static + the most its live blocks and one op's scratch hold at one step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from mpplan.durable import write_json
from mpplan.errors import PlanError
from mpplan.graph_hash import graph_hash_like, hash_matches
from mpplan.json_text import Table
from mpplan.plan_records import PlanSettings, RematRecord
from mpplan.reading import load_json, read_document

SCHEMA = "mpplan.plan/1"
_DICT_ONLY = frozenset({dict})

__all__ = ["SCHEMA", "Block", "Buffer", "Copy", "DevicePlan", "Plan", "PlanSettings", "RematRecord", "check_plan_graph",
           "load_plan", "save_plan", "write_json_atomic"]


@dataclass(frozen=True, slots=True)
class DevicePlan:
    """Predicted memory of one device: ``peak = static + arena + scratch``; ``lower_bound = static + LOAD``.

    ``scratch_bytes`` is memory held outside the arena for one op at a time (0 when
    every op writes its results straight into the arena).  When the plan cuts the
    arena into ``blocks``, ``arena_bytes`` is the extent of its offsets and the peak
    is static + the most the live blocks and the running op's scratch hold at one step.
    """

    name: str
    capacity_bytes: int
    static_bytes: int
    arena_bytes: int
    peak_bytes: int
    lower_bound_bytes: int
    scratch_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Buffer:
    """Where one dynamic storage (named by its root tensor) lives."""

    device: str
    offset: int
    bytes: int


#: A buffer's fields in ``plan.json`` (``buffers``), in the order they are written.
_BUFFER_FIELDS = ("device", "offset", "bytes")
_buffer_row = attrgetter(*_BUFFER_FIELDS)


@dataclass(frozen=True, slots=True)
class Block:
    """One allocation of a device's arena: its bytes ``[offset, offset + bytes)``, allocated in steps
    ``first..last`` (inclusive).

    It holds the buffers whose bytes lie within its bytes and whose lifetimes lie
    within its steps: allocated at the first step of the first of them, freed after
    the last step of any, it holds memory only while some buffer in it may.  Two
    blocks of a device may share offsets only at different steps.
    ``adopts``: the one buffer (by tensor name) whose producer allocates this block
    itself (a kernel with no ``out=`` route), kept as that buffer instead of copied
    into arena memory; its offset and bytes are that buffer's, and it may overlap
    other blocks' offsets, being memory of its own.
    """

    device: str
    offset: int
    bytes: int
    first: int
    last: int
    adopts: str | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    """A cross-device copy op ``name`` that writes ``tensor``'s bytes from ``src`` onto ``dst``."""

    name: str
    tensor: str
    src: str
    dst: str
    bytes: int


@dataclass(frozen=True, slots=True)
class Plan:
    """A complete, checkable memory plan for one graph on a set of devices."""

    graph_name: str
    graph_hash: str
    devices: tuple[DevicePlan, ...]
    schedule: tuple[str, ...]
    placement: dict[str, str]
    buffers: dict[str, Buffer]
    copies: tuple[Copy, ...] = ()
    remat: tuple[RematRecord, ...] = ()
    max_peak_bytes: int = 0
    cross_device_bytes: int = 0
    compute_overhead: float = 0.0
    settings: PlanSettings = field(default_factory=PlanSettings)
    seconds: dict[str, float] = field(default_factory=dict)
    module_devices: dict[str, str] = field(default_factory=dict)
    scratch: dict[str, int] = field(default_factory=dict)
    blocks: tuple[Block, ...] = ()

    def __post_init__(self) -> None:
        # the mapping forms (plan.json's, and older callers' dicts) become the typed records
        if not isinstance(self.settings, PlanSettings):
            object.__setattr__(self, "settings", PlanSettings.from_mapping(self.settings))
        if not all(isinstance(r, RematRecord) for r in self.remat):
            object.__setattr__(self, "remat", tuple(RematRecord.from_mapping(r) for r in self.remat))

    def device(self, name: str) -> DevicePlan:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def misfits(self) -> tuple[tuple[str, int], ...]:
        """(device, missing bytes) for every device whose peak exceeds its capacity."""
        return tuple((d.name, d.peak_bytes - d.capacity_bytes) for d in self.devices if d.peak_bytes > d.capacity_bytes)

    def to_dict(self) -> dict[str, Any]:
        # a dict display per buffer, keys from the one field list: dict(zip(...)) per buffer takes twice as long
        device, offset, size = _BUFFER_FIELDS
        rows = map(_buffer_row, self.buffers.values())
        return self._document({t: {device: d, offset: o, size: n} for t, (d, o, n) in zip(self.buffers, rows)})

    def _document(self, buffers: Any) -> dict[str, Any]:
        """``to_dict`` with ``buffers`` as given: ``save_plan`` hands a ``json_text.Table`` of the same records."""
        return {
            "schema": SCHEMA,
            "graph": {"name": self.graph_name, "hash": self.graph_hash},
            "devices": [
                {
                    "name": d.name,
                    "capacity_bytes": d.capacity_bytes,
                    "static_bytes": d.static_bytes,
                    "arena_bytes": d.arena_bytes,
                    "peak_bytes": d.peak_bytes,
                    "lower_bound_bytes": d.lower_bound_bytes,
                    **({"scratch_bytes": d.scratch_bytes} if d.scratch_bytes else {}),
                }
                for d in self.devices
            ],
            "schedule": list(self.schedule),
            "placement": dict(self.placement),
            "copies": [
                {"name": c.name, "tensor": c.tensor, "src": c.src, "dst": c.dst, "bytes": c.bytes} for c in self.copies
            ],
            "buffers": buffers,
            "remat": [r.to_dict() for r in self.remat],
            "predicted": {
                "max_peak_bytes": self.max_peak_bytes,
                "cross_device_bytes": self.cross_device_bytes,
                "compute_overhead": self.compute_overhead,
            },
            "planner": {"settings": self.settings.to_dict(), "seconds": dict(self.seconds)},
            "module_devices": dict(self.module_devices),
            **({"scratch": dict(self.scratch)} if self.scratch else {}),
            **({"blocks": [_block_dict(b) for b in self.blocks]} if self.blocks else {}),
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "<plan>") -> Plan:
        """Parse a ``plan.json`` mapping; ``PlanError`` names the file and field on bad input."""
        reader = _Reader(source)
        reader.mapping(data, "(top level)")
        if data.get("schema") != SCHEMA:
            raise PlanError(f"{source}: schema: expected {SCHEMA!r}, got {data.get('schema')!r}")
        graph = reader.mapping(data.get("graph"), "graph")
        predicted = reader.mapping(data.get("predicted", {}), "predicted")
        planner = reader.mapping(data.get("planner", {}), "planner")
        devices = tuple(
            DevicePlan(
                name=reader.string(d.get("name"), f"devices[{i}].name"),
                **{
                    key: reader.integer(d.get(key), f"devices[{i}].{key}")
                    for key in ("capacity_bytes", "static_bytes", "arena_bytes", "peak_bytes", "lower_bound_bytes")
                },
                scratch_bytes=reader.integer(d.get("scratch_bytes", 0), f"devices[{i}].scratch_bytes"),
            )
            for i, d in enumerate(reader.items(data.get("devices"), "devices"))
        )
        device, offset, size = _BUFFER_FIELDS  # as ``to_dict`` writes them; ``Buffer`` takes them in this order
        buffers = {
            str(name): Buffer(
                reader.string(b.get(device), f"buffers.{name}.{device}"),
                reader.integer(b.get(offset), f"buffers.{name}.{offset}"),
                reader.integer(b.get(size), f"buffers.{name}.{size}"),
            )
            for name, b in reader.records(data.get("buffers"), "buffers").items()
        }
        copies = tuple(
            Copy(
                name=reader.string(c.get("name"), f"copies[{i}].name"),
                tensor=reader.string(c.get("tensor"), f"copies[{i}].tensor"),
                src=reader.string(c.get("src"), f"copies[{i}].src"),
                dst=reader.string(c.get("dst"), f"copies[{i}].dst"),
                bytes=reader.integer(c.get("bytes"), f"copies[{i}].bytes"),
            )
            for i, c in enumerate(reader.items(data.get("copies", []), "copies"))
        )
        schedule = data.get("schedule")
        if not isinstance(schedule, list) or not all(isinstance(s, str) for s in schedule):
            raise PlanError(f"{source}: schedule: expected a list of op names")
        placement = reader.mapping(data.get("placement", {}), "placement")
        return cls(
            graph_name=reader.string(graph.get("name"), "graph.name"),
            graph_hash=reader.string(graph.get("hash"), "graph.hash"),
            devices=devices,
            schedule=tuple(schedule),
            placement={str(k): reader.string(v, f"placement.{k}") for k, v in placement.items()},
            buffers=buffers,
            copies=copies,
            remat=tuple(
                RematRecord.from_mapping(r, source, f"remat[{i}]")
                for i, r in enumerate(reader.items(data.get("remat", []), "remat"))
            ),
            max_peak_bytes=reader.integer(predicted.get("max_peak_bytes", 0), "predicted.max_peak_bytes"),
            cross_device_bytes=reader.integer(predicted.get("cross_device_bytes", 0), "predicted.cross_device_bytes"),
            compute_overhead=reader.number(predicted.get("compute_overhead", 0.0), "predicted.compute_overhead"),
            settings=PlanSettings.from_mapping(reader.mapping(planner.get("settings", {}), "planner.settings"), source),
            seconds={
                str(k): reader.number(v, f"planner.seconds.{k}")
                for k, v in reader.mapping(planner.get("seconds", {}), "planner.seconds").items()
            },
            module_devices={
                str(k): reader.string(v, f"module_devices.{k}")
                for k, v in reader.mapping(data.get("module_devices", {}), "module_devices").items()
            },
            scratch={
                str(k): reader.integer(v, f"scratch.{k}")
                for k, v in reader.mapping(data.get("scratch", {}), "scratch").items()
            },
            blocks=tuple(
                Block(
                    device=reader.string(b.get("device"), f"blocks[{i}].device"),
                    offset=reader.integer(b.get("offset"), f"blocks[{i}].offset"),
                    bytes=reader.integer(b.get("bytes"), f"blocks[{i}].bytes"),
                    first=reader.integer(b.get("first"), f"blocks[{i}].first"),
                    last=reader.integer(b.get("last"), f"blocks[{i}].last"),
                    adopts=None if b.get("adopts") is None else reader.string(b.get("adopts"), f"blocks[{i}].adopts"),
                )
                for i, b in enumerate(reader.items(data.get("blocks", []), "blocks"))
            ),
        )


def _block_dict(block: Block) -> dict[str, Any]:
    return {"device": block.device, "offset": block.offset, "bytes": block.bytes, "first": block.first,
            "last": block.last,
            **({"adopts": block.adopts} if block.adopts is not None else {})}


def save_plan(plan: Plan, path: str | Path) -> Path:
    """Write ``plan.json`` atomically (a temp file renamed into place): ``plan.to_dict()``, its
    buffers taken by column from the ``Buffer`` records instead of a dict made for each."""
    return write_json_atomic(plan._document(Table.of(plan.buffers, _BUFFER_FIELDS, attrgetter)), path)


def load_plan(path: str | Path) -> Plan:
    """Read and check a ``plan.json``; ``PlanError`` names the file and the field on bad input."""
    path = Path(path)
    return Plan.from_dict(read_document(path, load_json, PlanError), str(path))


def check_plan_graph(plan: Plan, graph: Any, source: str) -> None:
    """A plan made for another graph is bad input (``PlanError``, exit 2), not a failed verification."""
    if not hash_matches(plan.graph_hash, graph):
        given = graph_hash_like(plan.graph_hash, graph)
        raise PlanError(
            f"{source}: graph.hash: the plan is for graph {plan.graph_name!r} (hash {plan.graph_hash[:15]}), "
            f"the graph given is {graph.name!r} (hash {given[:15]}); plan it again for this graph"
        )


def write_json_atomic(data: Any, path: str | Path) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically and durably (``mpplan.durable``)."""
    return write_json(data, path)


@dataclass(frozen=True, slots=True)
class _Reader:
    """Type checks for plan fields with errors naming the file and the field."""

    source: str

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise PlanError(f"{self.source}: {where}: expected a mapping")
        return value

    def records(self, value: Any, where: str) -> dict[str, dict[str, Any]]:
        """A mapping of name to mapping (``buffers``); the first entry that is no mapping is named."""
        records = self.mapping(value, where)
        if not _DICT_ONLY.issuperset(map(type, records.values())):  # in C; the loop names the entry
            for name, record in records.items():
                if not isinstance(record, dict):
                    raise PlanError(f"{self.source}: {where}.{name}: expected a mapping, got {_short(record)}")
        return records

    def items(self, value: Any, where: str) -> list[dict[str, Any]]:
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise PlanError(f"{self.source}: {where}: expected a list of mappings")
        return value

    def integer(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise PlanError(f"{self.source}: {where}: expected an integer, got {_short(value)}")
        if abs(value) > 2**62:
            raise PlanError(f"{self.source}: {where}: expected an integer of at most 2**62, got {_short(value)}")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise PlanError(f"{self.source}: {where}: expected a number, got {_short(value)}")
        try:
            return float(value)
        except OverflowError:
            raise PlanError(f"{self.source}: {where}: expected a finite number, got {_short(value)}") from None

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise PlanError(f"{self.source}: {where}: expected a string, got {_short(value)}")
        return value


def _short(value: Any) -> str:
    """``repr`` cut to 40 characters: one readable error line whatever the plan holds."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:30]}...({len(text)} characters)"

"""Fuzz the verifier with tampered plans: every tampering below breaks the plan by construction,
so the verifier must reject every one (0 false accepts over 1,000 examples).

Each example plans a random graph (random DAGs with views, in-place ops and static tensors on one
to three devices, or a small training chain with recomputation), checks that the untouched plan
verifies, then applies one tampering drawn from those that apply to this plan.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mpplan.capture import synthetic
from mpplan.config import Device
from mpplan.errors import VerificationError
from mpplan.graph import Graph, Kind
from mpplan.plan import Plan
from mpplan.planner import PlannerSettings, plan, rematerialised
from mpplan.verify import Truth, verify
from strategies import graphs

#: (data, the graph the plan runs, the plan) -> a broken plan, or None when the tampering does not apply.
Tamper = Callable[[st.DataObject, Graph, Plan], Plan | None]


def _truth(p: Plan) -> Truth:
    """The facts the config gave the planner (the fuzz tampers with the plan's copies of them)."""
    s = p.settings
    return Truth(tuple((d.name, d.capacity_bytes) for d in p.devices), s["alignment"], s["parallel_safe"], s["grads"],
                 trusted=False)


def _storage_info(graph: Graph, p: Plan) -> tuple[dict[str, str], dict[str, int]]:
    tensors = {t.name: t for t in graph.tensors}
    root: dict[str, str] = {}
    for name in tensors:
        cur = name
        while tensors[cur].alias_of is not None:
            cur = tensors[cur].alias_of  # type: ignore[assignment]
        root[name] = cur
    return root, {name: tensors[name].nbytes for name in tensors}


def _graph_ops(graph: Graph, p: Plan) -> list[str]:
    names = {o.name for o in graph.ops}
    return [n for n in p.schedule if n in names]


# --- the tamperings: each returns a plan that is wrong by construction, or None when it does not apply


def move_op_without_copies(data, graph, p):
    """An op that touches a buffer or static bytes moves to another device; nothing else changes.

    Not every such move is a fault: an op may read on another device a tensor that a copy brought
    there, and its views of that input then view the copy.  So a move is drawn only where the op
    touches stored bytes that cannot be there: an output it makes or writes in place, or an input
    with no copy to that device.
    """
    if len(p.devices) < 2:
        return None
    root, size = _storage_info(graph, p)
    tensors = {t.name: t for t in graph.tensors}
    arrived = {(c.tensor, c.dst) for c in p.copies}

    def stored(t: str) -> bool:
        return root[t] in p.buffers or size[root[t]] > 0

    def stranded(op, there: str) -> bool:
        made = [t for t in op.outputs if t in op.inputs or tensors[t].alias_of is None]
        return any(map(stored, made)) or any(stored(t) and (t, there) not in arrived for t in op.inputs)

    ops = {o.name: o for o in graph.ops}
    moves = [(n, d.name) for n in _graph_ops(graph, p) for d in p.devices
             if d.name != p.placement[n] and stranded(ops[n], d.name)]
    if not moves:
        return None
    name, there = data.draw(st.sampled_from(moves))
    return replace(p, placement={**p.placement, name: there})


def overlap_live_buffers(data, graph, p):
    """Two buffers that one op touches at once (so live together) get the same offset."""
    root, _ = _storage_info(graph, p)
    pairs = []
    for o in graph.ops:
        # only buffers on the op's own device: a tensor of another device it reads through a copy
        # (the copy's buffer holds the bytes), so that tensor need not be live when the op runs
        here = p.placement.get(o.name)
        touched = sorted({root[t] for t in (*o.inputs, *o.outputs)
                          if root[t] in p.buffers and p.buffers[root[t]].device == here})
        pairs += [(a, b) for a in touched for b in touched if a < b and p.buffers[a].bytes and p.buffers[b].bytes]
    arena = {d.name: d.arena_bytes for d in p.devices}
    pairs = [(a, b) for a, b in pairs if p.buffers[a].offset + p.buffers[b].bytes <= arena[p.buffers[a].device]]
    if not pairs:
        return None
    a, b = data.draw(st.sampled_from(pairs))
    return replace(p, buffers={**p.buffers, b: replace(p.buffers[b], offset=p.buffers[a].offset)})


def change_capacity(data, graph, p):
    """A device claims another capacity (caught against the config)."""
    i = data.draw(st.integers(0, len(p.devices) - 1))
    delta = data.draw(st.integers(1, 1 << 20)) * data.draw(st.sampled_from([1, -1]))
    devices = list(p.devices)
    devices[i] = replace(devices[i], capacity_bytes=devices[i].capacity_bytes + delta)
    return replace(p, devices=tuple(devices))


def shrink_capacity_below_peak(data, graph, p):
    """A device's capacity drops below its peak (caught even on trust)."""
    fits = [i for i, d in enumerate(p.devices) if d.peak_bytes > 0]
    if not fits:
        return None
    i = data.draw(st.sampled_from(fits))
    devices = list(p.devices)
    devices[i] = replace(devices[i], capacity_bytes=data.draw(st.integers(0, devices[i].peak_bytes - 1)))
    return replace(p, devices=tuple(devices))


def rename_device(data, graph, p):
    """A device renamed everywhere in the plan (consistent, so only the config catches it)."""
    i = data.draw(st.integers(0, len(p.devices) - 1))
    old = p.devices[i].name
    new = old + "x"

    def r(name: str) -> str:
        return new if name == old else name

    return replace(
        p,
        devices=tuple(replace(d, name=r(d.name)) for d in p.devices),
        placement={k: r(v) for k, v in p.placement.items()},
        buffers={k: replace(b, device=r(b.device)) for k, b in p.buffers.items()},
        copies=tuple(replace(c, src=r(c.src), dst=r(c.dst)) for c in p.copies),
    )


def drop_copy(data, graph, p):
    """A copy vanishes (schedule, placement, buffer), its bytes taken off the total."""
    if not p.copies:
        return None
    c = data.draw(st.sampled_from(p.copies))
    return replace(
        p,
        copies=tuple(x for x in p.copies if x is not c),
        schedule=tuple(s for s in p.schedule if s != c.name),
        placement={k: v for k, v in p.placement.items() if k != c.name},
        buffers={k: v for k, v in p.buffers.items() if k != c.name},
        cross_device_bytes=p.cross_device_bytes - c.bytes,
    )


def drop_recompute(data, graph, p):
    """A recompute op leaves the schedule, or its record leaves ``remat``."""
    if not p.remat:
        return None
    record = data.draw(st.sampled_from(p.remat))
    if data.draw(st.booleans()):
        return replace(p, schedule=tuple(s for s in p.schedule if s != record["recompute_op"]))
    return replace(p, remat=tuple(r for r in p.remat if r["op"] != record["op"]))


def run_before_producer(data, graph, p):
    """An op moves to just before the op that makes one of its inputs."""
    step = {n: i for i, n in enumerate(p.schedule)}
    makers = {t: o.name for o in graph.ops for t in o.outputs if t not in o.inputs}
    late = [(o.name, makers[t]) for o in graph.ops for t in o.inputs if t in makers and makers[t] in step]
    late = [(a, b) for a, b in late if a in step]
    if not late:
        return None
    op, maker = data.draw(st.sampled_from(late))
    order = [n for n in p.schedule if n != op]
    order.insert(order.index(maker), op)
    return replace(p, schedule=tuple(order))


def write_before_reader(data, graph, p):
    """An in-place write moves before a reader of the version it overwrites."""
    root, _ = _storage_info(graph, p)
    found = []
    for i, w in enumerate(graph.ops):
        for t in w.outputs:
            if t not in w.inputs:
                continue
            for r in reversed(graph.ops[:i]):
                if any(root[x] == root[t] for x in r.outputs if x in r.inputs):
                    break  # an earlier write: readers before it read an older version anyway
                if any(root[x] == root[t] for x in r.inputs):
                    found.append((w.name, r.name))
    # a reader on another device reads a copy made before it: moving the write just before that reader
    # (after the copy) is no violation, so only same-device readers make a tampered plan
    found = [(w, r) for w, r in found if w in p.schedule and r in p.schedule and p.placement[w] == p.placement[r]]
    if not found:
        return None
    w, r = data.draw(st.sampled_from(found))
    order = [n for n in p.schedule if n != w]
    order.insert(order.index(r), w)
    return replace(p, schedule=tuple(order))


def shrink_buffer(data, graph, p):
    """A buffer shrinks below its tensor's bytes."""
    _, size = _storage_info(graph, p)
    sized = [n for n in p.buffers if size.get(n, 0) > 0]
    sized += [c.name for c in p.copies if c.bytes > 0 and c.name in p.buffers]
    if not sized:
        return None
    name = data.draw(st.sampled_from(sorted(set(sized))))
    need = size[name] if name in size else next(c.bytes for c in p.copies if c.name == name)
    return replace(p, buffers={**p.buffers, name: replace(p.buffers[name], bytes=data.draw(st.integers(0, need - 1)))})


def misreport(data, graph, p):
    """One of the predicted numbers is off."""
    field = data.draw(st.sampled_from(["peak_bytes", "lower_bound_bytes", "static_bytes", "max_peak", "cross"]))
    delta = data.draw(st.integers(1, 1 << 16)) * data.draw(st.sampled_from([1, -1]))
    if field == "max_peak":
        return replace(p, max_peak_bytes=p.max_peak_bytes + delta)
    if field == "cross":
        return replace(p, cross_device_bytes=p.cross_device_bytes + delta)
    i = data.draw(st.integers(0, len(p.devices) - 1))
    devices = list(p.devices)
    devices[i] = replace(devices[i], **{field: getattr(devices[i], field) + delta})
    return replace(p, devices=tuple(devices))


def shrink_arena(data, graph, p):
    """An arena claimed smaller than its buffers' extent, the peak kept consistent with it."""
    used: dict[str, int] = {}
    for b in p.buffers.values():
        used[b.device] = max(used.get(b.device, 0), b.offset + b.bytes)
    cut = [i for i, d in enumerate(p.devices) if used.get(d.name, 0) > 0]
    if not cut:
        return None
    i = data.draw(st.sampled_from(cut))
    devices = list(p.devices)
    d = devices[i]
    arena = data.draw(st.integers(0, used[d.name] - 1))
    devices[i] = replace(d, arena_bytes=arena, peak_bytes=d.static_bytes + arena)
    return replace(p, devices=tuple(devices), max_peak_bytes=max(x.peak_bytes for x in devices))


def misalign(data, graph, p):
    """A buffer moves off the alignment (64), or the plan claims a looser alignment."""
    if data.draw(st.booleans()):
        return replace(p, settings={**p.settings, "alignment": 1})
    moved = [n for n, b in p.buffers.items() if b.bytes]
    if not moved:
        return None
    name = data.draw(st.sampled_from(sorted(moved)))
    b = p.buffers[name]
    return replace(p, buffers={**p.buffers, name: replace(b, offset=b.offset + data.draw(st.integers(1, 63)))})


def flip_settings(data, graph, p):
    """The plan claims other correctness settings than the config's."""
    key = data.draw(st.sampled_from(["parallel_safe", "grads"]))
    value = (not p.settings["parallel_safe"]) if key == "parallel_safe" else (
        "dynamic" if p.settings["grads"] == "static" else "static")
    return replace(p, settings={**p.settings, key: value})


def other_graph(data, graph, p):
    """The plan names another graph."""
    return replace(p, graph_hash=data.draw(st.text("0123456789abcdef", min_size=1, max_size=8)))


TAMPERS: tuple[Tamper, ...] = (
    move_op_without_copies, overlap_live_buffers, change_capacity, shrink_capacity_below_peak, rename_device,
    drop_copy, drop_recompute, run_before_producer, write_before_reader, shrink_buffer, misreport, shrink_arena,
    misalign, flip_settings, other_graph,
)


@st.composite
def planned(draw: st.DrawFn) -> tuple[Graph, Plan]:
    """A random graph and a verified plan of it (alignment 64, so misalignment can be drawn)."""
    if draw(st.integers(0, 9)) == 0:
        graph = synthetic.chain(draw(st.integers(4, 9)), train=True, batch=8, width=4, seed=0)
        chosen = PlannerSettings(schedule="as_given", assign="best_fit", remat="sqrt")
        count = 1
    else:
        graph = draw(graphs(max_ops=10, max_bytes=200))
        count = draw(st.integers(1, 3))
        chosen = PlannerSettings(
            schedule=draw(st.sampled_from(["as_given", "least_peak"])),
            assign="best_fit",
            placement=draw(st.sampled_from(["pipeline", "shift"])) if count > 1 else "single",
            parallel_safe=draw(st.booleans()),
            grads=draw(st.sampled_from(["static", "dynamic"])),
        )
    devices = [Device(name=f"gpu{i}", capacity=1 << 30) for i in range(count)]
    result = plan(graph, devices, chosen)
    verify(graph, result, truth=_truth(result))
    return graph, result


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(planned(), st.data())
def test_no_tampered_plan_is_accepted(case: tuple[Graph, Plan], data: st.DataObject):
    graph, good = case
    truth = _truth(good)
    ran = rematerialised(graph, good)  # the ops the schedule runs, recomputes included: what tampers pick from
    applicable = [(t, bad) for t in TAMPERS if (bad := t(data, ran, good)) is not None]
    tamper, bad = data.draw(st.sampled_from(applicable), label="tamper")
    event(tamper.__name__)
    with pytest.raises(VerificationError):
        verify(graph, bad, truth=truth)

"""The verifier's memory checks on storage numbers (``verify.arrays``) against the checks by name.

``memory_holds`` only says yes or no; on a no the verifier runs the checks by name, which word
the first violation.  So the verifier must give, on every plan, the verdict (accepted, or the
very message) it gives with the fast path switched off; and the fast path must say yes exactly
when the memory facts hold, which a brute force below (every pair of buffers, every step) decides.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from conftest import chain, device, diamond
from mpplan.errors import VerificationError
from mpplan.graph import Graph
from mpplan.plan import Buffer, DevicePlan, Plan
from mpplan.planner import PlannerSettings, plan, rematerialised
from mpplan.verify import arrays, verify
from test_verify_fuzz import TAMPERS, _truth, planned

VERIFY = importlib.import_module("mpplan.verify")  # the module: ``mpplan.verify`` is also the function
EXACT = PlannerSettings(schedule="as_given", assign="greedy_by_size", alignment=1)


def _verdict(graph: Graph, p: Plan, **kwargs: Any) -> object:
    try:
        return verify(graph, p, **kwargs)
    except VerificationError as exc:
        return str(exc)


def _verdict_by_name(graph: Graph, p: Plan, **kwargs: Any) -> object:
    """The verdict with the fast path off: the memory checks by name, in name order, as before it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VERIFY, "memory_holds", lambda *args, **kw: False)
        return _verdict(graph, p, **kwargs)


def _fast_answers(graph: Graph, p: Plan, **kwargs: Any) -> list[bool]:
    """What ``memory_holds`` answered during one verification (nothing when an earlier check failed)."""
    answers: list[bool] = []

    def spy(*args: Any, **kw: Any) -> bool:
        answers.append(arrays.memory_holds(*args, **kw))
        return answers[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VERIFY, "memory_holds", spy)
        _verdict(graph, p, **kwargs)
    return answers


# --- the tamperings that aim at the memory checks; each returns a plan, most of them broken


def nudge_buffer(data: st.DataObject, p: Plan) -> Plan | None:
    """One buffer moves, shrinks, grows, changes device, or takes another buffer's offset."""
    if not p.buffers:
        return None
    name = data.draw(st.sampled_from(sorted(p.buffers)))
    buf = p.buffers[name]
    step = data.draw(st.sampled_from([1, 64, -64, -1]))
    other = p.buffers[data.draw(st.sampled_from(sorted(p.buffers)))]
    changed = data.draw(st.sampled_from([
        replace(buf, offset=buf.offset + step),
        replace(buf, bytes=buf.bytes + step),
        replace(buf, offset=other.offset),
        replace(buf, device=data.draw(st.sampled_from([d.name for d in p.devices] + ["nowhere"]))),
        replace(buf, offset=1 << 70),
        replace(buf, bytes=float(buf.bytes)),  # type: ignore[arg-type]  # a hand-edited plan
    ]))
    return replace(p, buffers={**p.buffers, name: changed})


def drop_or_add_buffer(data: st.DataObject, p: Plan) -> Plan | None:
    """A buffer goes missing, or one appears for a name that has none."""
    if p.buffers and data.draw(st.booleans()):
        name = data.draw(st.sampled_from(sorted(p.buffers)))
        return replace(p, buffers={k: v for k, v in p.buffers.items() if k != name})
    name = data.draw(st.sampled_from(["nobody", *sorted(p.placement)]))  # ops' names: no storage has them
    return replace(p, buffers={**p.buffers, name: Buffer(p.devices[0].name, 0, 64)})


def nudge_device(data: st.DataObject, p: Plan) -> Plan | None:
    """One device's static, arena, peak or lower-bound bytes are off (by one, or by an aligned step)."""
    i = data.draw(st.integers(0, len(p.devices) - 1))
    field = data.draw(st.sampled_from(["static_bytes", "arena_bytes", "peak_bytes", "lower_bound_bytes"]))
    delta = data.draw(st.sampled_from([1, -1, 64, -64]))
    devices = list(p.devices)
    devices[i] = replace(devices[i], **{field: getattr(devices[i], field) + delta})
    return replace(p, devices=tuple(devices))


MEMORY_TAMPERS = (nudge_buffer, drop_or_add_buffer, nudge_device)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(planned(), st.data())
def test_fast_path_gives_the_verdict_of_the_checks_by_name(case: tuple[Graph, Plan], data: st.DataObject) -> None:
    """Planner output passes the fast path itself; every tampered plan gets the same verdict, word for word."""
    graph, good = case
    truth = _truth(good)
    assert _fast_answers(graph, good, truth=truth) == [True]
    if data.draw(st.booleans()):
        tamper = data.draw(st.sampled_from(MEMORY_TAMPERS))
        bad = tamper(data, good)
    else:
        ran = rematerialised(graph, good)
        applicable = [t for t in TAMPERS if t(data, ran, good) is not None]
        tamper = data.draw(st.sampled_from(applicable))
        bad = tamper(data, ran, good)
    assume(bad is not None)  # a plan without buffers has none to nudge
    event(tamper.__name__)
    for kwargs in ({"truth": truth}, {"check_capacity": False}):
        assert _verdict(graph, bad, **kwargs) == _verdict_by_name(graph, bad, **kwargs)


# --- memory_holds on its own, against a brute force over every pair of buffers and every step


def _brute_holds(p: Plan, first: list[int], last: list[int], home: list[int], size: list[int], static: list[int],
                 alignment: int, names: list[str]) -> bool:
    """The memory facts of ``memory_holds``'s docstring, checked one by one, pair by pair, step by step."""
    touched = [s for s in range(len(names)) if home[s] >= 0]
    dynamic = [s for s in touched if s not in static]
    if set(p.buffers) != {names[s] for s in dynamic}:
        return False
    arena = {d.name: d.arena_bytes for d in p.devices}
    for s in dynamic:
        b = p.buffers[names[s]]
        if (b.device != p.devices[home[s]].name or b.bytes < size[s] or b.offset < 0 or b.offset % alignment
                or b.bytes % alignment or b.offset + b.bytes > arena[b.device]):
            return False
    for i, d in enumerate(p.devices):
        mine = [s for s in dynamic if home[s] == i]
        static_bytes = sum(size[s] for s in touched if s in static and home[s] == i)
        load = max([sum(size[s] for s in mine if first[s] <= t <= last[s]) for t in range(len(p.schedule))],
                   default=0)
        extent = max((p.buffers[names[s]].offset + p.buffers[names[s]].bytes for s in mine), default=0)
        if (d.static_bytes != static_bytes or d.arena_bytes < extent
                or d.peak_bytes != d.static_bytes + d.arena_bytes + d.scratch_bytes
                or d.lower_bound_bytes != static_bytes + load):
            return False
        for a in mine:
            for c in mine:
                x, y = p.buffers[names[a]], p.buffers[names[c]]
                if (a < c and x.bytes and y.bytes and first[a] <= last[c] and first[c] <= last[a]
                        and x.offset < y.offset + y.bytes and y.offset < x.offset + x.bytes):
                    return False
    return True


@st.composite
def storages(draw: st.DrawFn) -> tuple[Plan, list[int], list[int], list[int], list[int], list[int], int, list[str]]:
    """Storages on one or two devices, some never touched, some static, each dynamic one with a buffer at a
    random aligned offset (so overlaps are common), the devices' claims computed right or off by a little."""
    n, steps = draw(st.integers(0, 14)), draw(st.integers(1, 8))
    alignment, devices = draw(st.sampled_from([1, 4])), draw(st.integers(1, 2))
    names = [f"s{i}" for i in range(n)]
    first, last, home, size, static = [], [], [], [], []
    for s in range(n):
        f = draw(st.integers(-1, steps - 1))  # -1: never touched
        first.append(f)
        last.append(draw(st.integers(f, steps - 1)) if f >= 0 else -1)
        home.append(draw(st.integers(0, devices - 1)) if f >= 0 else -1)
        size.append(draw(st.integers(0, 9)))
        if draw(st.integers(0, 4)) == 0:
            static.append(s)
    dynamic = [s for s in range(n) if home[s] >= 0 and s not in static]
    buffers = {}
    for s in dynamic:
        nbytes = -(-size[s] // alignment) * alignment + draw(st.sampled_from([0, 0, 0, alignment, -alignment, 1]))
        offset = alignment * draw(st.integers(0, 6)) + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -alignment]))
        buffers[names[s]] = Buffer(f"gpu{home[s]}", offset, max(nbytes, 0))
    claims = []
    for i in range(devices):
        mine = [s for s in dynamic if home[s] == i]
        static_bytes = sum(size[s] for s in static if home[s] == i)
        arena = max((buffers[names[s]].offset + buffers[names[s]].bytes for s in mine), default=0)
        arena += draw(st.sampled_from([0, 0, 0, -1, alignment]))
        load = max([sum(size[s] for s in mine if first[s] <= t <= last[s]) for t in range(steps)], default=0)
        lower = static_bytes + load + draw(st.sampled_from([0, 0, 0, 0, 1]))
        claims.append(DevicePlan(f"gpu{i}", 1 << 30, static_bytes, arena, static_bytes + arena, lower))
    if dynamic and draw(st.integers(0, 5)) == 0:
        del buffers[names[draw(st.sampled_from(dynamic))]]
    p = Plan("g", "hash", tuple(claims), tuple(f"op{i}" for i in range(steps)), {}, buffers)
    return p, first, last, home, size, static, alignment, names


@settings(max_examples=1500, deadline=None)
@given(storages())
def test_memory_holds_matches_brute_force(case: tuple[Any, ...]) -> None:
    p, first, last, home, size, static, alignment, names = case
    index = {name: i for i, name in enumerate(names)}
    expected = _brute_holds(p, first, last, home, size, static, alignment, names)
    event("holds" if expected else "fails")
    assert arrays.memory_holds(p, first, last, home, size, static, alignment, index) == expected


#: (first step, steps live, offset, bytes) of each non-empty buffer: few steps and offsets, so overlaps are common.
_RECTS = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 60), st.integers(1, 9)),
                  max_size=60)


@settings(max_examples=1500, deadline=None)
@given(_RECTS)
def test_interval_tree_overlap_matches_brute_force(rects: list[tuple[int, int, int, int]]) -> None:
    """``_apart`` against every pair: long and short lifetimes, so buffers sit at every level of the tree."""
    import numpy as np

    expected = not any(f1 <= f2 + n2 and f2 <= f1 + n1 and o1 < o2 + b2 and o2 < o1 + b1
                       for i, (f1, n1, o1, b1) in enumerate(rects) for f2, n2, o2, b2 in rects[:i])
    event("apart" if expected else "overlap")
    first = np.array([f for f, _, _, _ in rects], dtype=np.int64)
    last = np.array([f + n for f, n, _, _ in rects], dtype=np.int64)
    offset = np.array([o for _, _, o, _ in rects], dtype=np.int64)
    nbytes = np.array([b for _, _, _, b in rects], dtype=np.int64)
    assert arrays._apart(first, last, offset, nbytes) == expected


# --- each check the fast path replaced, on a hand-corrupted plan: the message the checks by name give


def _diamond() -> tuple[Graph, Plan]:
    graph = diamond()
    p = plan(graph, [device()], EXACT)
    verify(graph, p)
    return graph, p


def _overlap(p: Plan, a: str, b: str) -> Plan:
    """The smaller of two buffers moved onto the larger one's offset (so it stays inside the arena)."""
    small, large = sorted((a, b), key=lambda name: p.buffers[name].bytes)
    return replace(p, buffers={**p.buffers, small: replace(p.buffers[small], offset=p.buffers[large].offset)})


def _with_device(p: Plan, **changes: int) -> Plan:
    return replace(p, devices=(replace(p.devices[0], **changes),))


@pytest.mark.parametrize("corrupt, message", [
    (lambda p: _overlap(p, "b", "c"),
     r"device gpu0: tensors '(b|c)' and '(b|c)' are live together \(steps \d+\.\.\d+ and \d+\.\.\d+\) but their "
     r"buffers overlap"),
    (lambda p: replace(p, buffers={**p.buffers, "b": replace(p.buffers["b"], bytes=p.buffers["b"].bytes - 1)}),
     r"tensor 'b': buffer of \d+ bytes holds a tensor of \d+"),
    (lambda p: replace(p, buffers={k: v for k, v in p.buffers.items() if k != "b"}),
     r"tensor 'b': dynamic storage without a buffer"),
    (lambda p: replace(p, buffers={**p.buffers, "zz": Buffer("gpu0", 0, 8)}),
     r"buffer 'zz': not a dynamic storage of the graph"),
    (lambda p: replace(p, buffers={**p.buffers, "b": replace(p.buffers["b"], offset=1 << 70)}),
     r"tensor 'b': buffer \[\d+, \d+\) overruns the \d+-byte arena of gpu0"),
    (lambda p: _with_device(p, peak_bytes=p.devices[0].peak_bytes + 1),
     r"device gpu0: peak_bytes \d+ != static \d+ \+ arena \d+ \+ scratch 0"),
    (lambda p: _with_device(p, static_bytes=p.devices[0].static_bytes + 1),
     r"device gpu0: static_bytes claimed \d+, the graph gives \d+"),
    (lambda p: _with_device(p, arena_bytes=p.devices[0].arena_bytes - 1),
     r"tensor '\w': buffer \[\d+, \d+\) overruns the \d+-byte arena of gpu0"),  # the buffer check comes first
    (lambda p: _with_device(p, lower_bound_bytes=p.devices[0].lower_bound_bytes + 1),
     r"device gpu0: lower_bound_bytes \d+ != static \d+ \+ LOAD \d+"),
    (lambda p: replace(p, schedule=(p.schedule[1], p.schedule[0], *p.schedule[2:])),
     r"schedule step 0: op '\w+' reads tensor '\w+' before it is produced"),
])
def test_each_corruption_is_worded_by_the_checks_by_name(corrupt: Any, message: str) -> None:
    graph, good = _diamond()
    bad = corrupt(good)
    with pytest.raises(VerificationError, match=message) as caught:
        verify(graph, bad)
    assert str(caught.value) == _verdict_by_name(graph, bad)


def test_too_small_capacity_named_after_the_fast_path() -> None:
    """A plan whose memory checks out but whose device is too small: the capacity message, as before."""
    graph = chain(5)
    p = plan(graph, [device()], EXACT)
    small = _with_device(p, capacity_bytes=p.devices[0].peak_bytes - 1)
    assert _fast_answers(graph, small) == [True]
    expected = f"device gpu0: peak {p.devices[0].peak_bytes} exceeds capacity {p.devices[0].peak_bytes - 1} by 1 bytes"
    with pytest.raises(VerificationError, match=expected):
        verify(graph, small)
    verify(graph, small, check_capacity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-(1 << 62) + 1, (1 << 62) - 1) | st.integers(0, 5), max_size=30))
def test_distinct_is_numpys_unique(values: list[int]) -> None:
    """``_distinct`` (by a sort) gives what ``np.unique`` (by hashing, many times slower on large plans) gives."""
    array = np.asarray(values, dtype=np.int64)
    assert arrays._distinct(array).tolist() == np.unique(array).tolist()

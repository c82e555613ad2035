"""The replay's numpy columns (``verify.sweep``) against a plain step-by-step replay written here.

``sweep`` answers a plan without copies in a few array reductions, or None, after which the
verifier runs the Python ``replay``, which words the fault.  So on random small graphs (views,
in-place writes, a name listed twice) under random orders and placements, it must give exactly
the reference's first/last steps, homes and touch order, or None exactly when the reference
finds a fault; and whatever it answers, ``replay`` must agree.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from conftest import chain, device
from mpplan.errors import VerificationError
from mpplan.graph import Graph, Op, Tensor
from mpplan.plan import DevicePlan, Plan
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from mpplan.verify.record import Numbering, Replay, numbering
from mpplan.verify.replay import op_numbers, replay
from mpplan.verify.sweep import sweep

SWEEP = importlib.import_module("mpplan.verify.sweep")
DEVICES = ("gpu0", "gpu1")


@st.composite
def cases(draw: st.DrawFn) -> tuple[Graph, tuple[str, ...], list[int], dict[str, str]]:
    """A graph of up to 7 ops (not necessarily valid: a tensor may be made twice or read unmade), an
    order of its ops, each step's device, and each tensor's storage."""
    tensors: list[Tensor] = [Tensor("x0", 4)]
    root = {"x0": "x0"}
    ops: list[Op] = []
    for k in range(draw(st.integers(0, 7))):
        names = [t.name for t in tensors]
        ins = tuple(draw(st.lists(st.sampled_from(names), max_size=3)))
        outs: list[str] = []
        for _ in range(draw(st.integers(0, 2))):
            how = draw(st.sampled_from(["new", "new", "view", "in place", "again"]))
            if how == "in place" and ins:
                outs.append(draw(st.sampled_from(ins)))
            elif how == "again":
                outs.append(draw(st.sampled_from(names)))  # made a second time, or in place when also read
            else:
                base = draw(st.sampled_from(names)) if how == "view" else None
                name = f"t{len(tensors)}"
                tensors.append(Tensor(name, 4, alias_of=base))
                root[name] = root[base] if base is not None else name
                names.append(name)
                outs.append(name)
        ops.append(Op(f"op{k}", "f", ins, tuple(outs)))
    graph = Graph("g", tuple(tensors), tuple(ops), ())
    order = tuple(draw(st.permutations([o.name for o in ops])))
    devices = [draw(st.integers(0, 1)) if draw(st.integers(0, 3)) == 0 else 0 for _ in order]
    return graph, order, devices, root


def _reference(graph: Graph, order: tuple[str, ...], devices: list[int],
               root: dict[str, str]) -> tuple[Any, ...] | None:
    """One op at a time, by name: (touch order, first, last, home) per storage, or None at a fault."""
    ops = {o.name: o for o in graph.ops}
    made = [t for o in graph.ops for t in o.outputs if t not in o.inputs]
    if len(made) != len(set(made)):
        return None
    writes = [root[t] for o in graph.ops for t in o.outputs if t in o.inputs]
    graph_place = {o.name: k for k, o in enumerate(graph.ops)}
    done: set[str] = set()
    version: dict[str, int] = {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    home: dict[str, str] = {}
    for step, name in enumerate(order):
        op, where = ops[name], DEVICES[devices[step]]
        for t in op.inputs:
            if t in made and t not in done:
                return None
            s = root[t]
            wanted = sum(root[u] == s for o in graph.ops[: graph_place[name]] for u in o.outputs if u in o.inputs)
            if s in writes and version.get(s, 0) != wanted:
                return None
        for t in (*op.inputs, *op.outputs):
            s = root[t]
            if home.setdefault(s, where) != where:
                return None
            first.setdefault(s, step)
            last[s] = step
        for t in op.outputs:
            if t in op.inputs:
                version[root[t]] = version.get(root[t], 0) + 1
            else:
                done.add(t)
    return list(first), first, last, home


def _as_names(run: Replay) -> tuple[Any, ...]:
    names = run.names
    touched = [s for s in range(len(names)) if run.home[s] is not None]
    return ([names[s] for s in run.order], {names[s]: run.first[s] for s in touched},
            {names[s]: run.last[s] for s in touched}, {names[s]: run.home[s] for s in touched})


def _plan(graph: Graph, order: tuple[str, ...], devices: list[int]) -> Plan:
    return Plan("g", "h", tuple(DevicePlan(d, 1 << 30, 0, 0, 0, 0) for d in DEVICES), order,
                {name: DEVICES[d] for name, d in zip(order, devices)}, {})


@settings(max_examples=600, deadline=None)
@given(cases())
def test_sweep_matches_a_plain_replay(case: tuple[Graph, tuple[str, ...], list[int], dict[str, str]]) -> None:
    graph, order, devices, root = case
    names, index = numbering(graph)
    root_of = [index[root[n]] for n in names]
    op_index, inputs, outputs = op_numbers(graph, names, index)
    fast = sweep(names, index, inputs, outputs, [op_index[n] for n in order], root_of, devices, DEVICES)
    expected = _reference(graph, order, devices, root)
    event("fault" if expected is None else "ok")
    assert (None if fast is None else _as_names(fast)) == expected


@settings(max_examples=300, deadline=None)
@given(cases())
def test_sweep_agrees_with_the_replay(case: tuple[Graph, tuple[str, ...], list[int], dict[str, str]]) -> None:
    """``replay`` gives the same record, or the same message, with the sweep and without it."""
    graph, order, devices, root = case
    p = _plan(graph, order, devices)
    fast = _replayed(graph, p, root)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SWEEP, "sweep", lambda *args: None)
        assert _replayed(graph, p, root) == fast


def _replayed(graph: Graph, p: Plan, root: dict[str, str]) -> Replay | str:
    try:
        names, index = numbering(graph)
        return replay(graph, p, Numbering(names, index, [index[root[n]] for n in names]), {}, dict(p.placement))
    except VerificationError as exc:
        return str(exc)


def test_sweep_answers_for_a_planned_plan() -> None:
    """The planner's plans (no copies) take the sweep: the verifier does not fall back to the loop."""
    graph = chain(6)
    p = plan(graph, [device()], PlannerSettings(alignment=1))
    answers: list[bool] = []
    real = SWEEP.sweep

    def spy(*args: Any) -> Replay | None:
        answers.append(real(*args) is not None)
        return real(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SWEEP, "sweep", spy)
        verify(graph, p)
    assert answers == [True]

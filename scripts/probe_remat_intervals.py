"""Issue 16's question from another side: is there an answer under Moccasin's 4.9% on RL250 at 0.8?

Solves the fixed-order remat problem with CP-SAT over retention intervals (the encoding of
Moccasin, Bartan et al., ICML 2023, written anew here, with up to ``--copies`` intervals per
tensor: 3 allows a tensor dropped twice), warm-started from ``remat``'s ``solver: auto``
answer.  Time is a grid of stages: stage ``t`` holds a slot for a recompute of each earlier op,
then op ``t`` (``slot``).  Each op's output is held over intervals, the first from its own
slot, each later one from a recompute's slot; an op (or a recompute) reads each input from an
interval covering its slot; CP-SAT's cumulative bounds the bytes held by the budget.

The answer is checked three ways: rebuilt as the op sequence it describes (``sim`` peak within
the budget; op costs are whole, so its cost is the objective's); made lazy (each recompute
moved to its first reader's stage, as ``apply_recompute`` anchors it) and rebuilt again; and,
lazy, expressed as ``apply_recompute``'s rounds (op names and cut points, a tensor dropped
twice as a second round), whose rewrite must fit the budget and pass ``mpplan.verify`` (the
tests hold it equal to the lazy op sequence): an answer in mpplan's own family, which the
planner records and runs.  ``--free`` drops the rules that keep answers in that family.

Scope: graphs of single-output activations at whole op costs, with no views, in-place writes,
graph inputs or static bytes (the random layered graphs).

Rerun: ``python scripts/probe_remat_intervals.py [--size 250] [--fraction 0.8] [--time-limit 60]
[--seconds 300] [--copies 3] [--workers 8] [--seed 0] [--presolve] [--free]``  (from a checkout
other than the installed one: ``PYTHONPATH=.:scripts python scripts/...``; needs ``ortools``,
the test extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

from ortools.sat.python import cp_model
from probe_remat_doubles import add_cell_arguments, auto_cell, verified_cost

from mpplan import sim
from mpplan.graph import Graph, Kind, Op
from mpplan.passes.remat.model import NEVER, SUFFIX

#: A copy of an op's output: (op position, copy number; 0 is the original).
Copy = tuple[int, int]


@dataclass(frozen=True)
class Answer:
    """Stage of each recompute copy and, per read, the copy that serves it:
    ``serves[(reader copy, input position)]`` is the input's copy number; ``rounds``: whether
    the grid puts a stage's second recomputes after its first ones (``slot``)."""

    stage: dict[Copy, int]
    serves: dict[tuple[Copy, int], int]
    rounds: bool = True


@dataclass(frozen=True)
class Program:
    """The CP-SAT model and the variables an answer is read from."""

    model: cp_model.CpModel
    present: dict[Copy, cp_model.IntVar]
    stage: dict[Copy, cp_model.IntVar]
    start: dict[Copy, Any]  # a variable for a recompute, a number for an original
    end: dict[Copy, cp_model.IntVar]
    length: dict[Copy, cp_model.IntVar]
    reads: dict[tuple[Copy, int, int], cp_model.IntVar]  # (reader copy, input position, input copy)
    rounds: bool


def check_scope(graph: Graph) -> None:
    """``ValueError`` unless every op makes one activation from earlier ops' outputs, at a
    whole cost, with no views, in-place writes or static bytes (the module docstring's scope)."""
    made = set()
    for op in graph.ops:
        if len(op.outputs) != 1 or op.in_place or any(name not in made for name in op.inputs):
            raise ValueError(f"op {op.name!r}: outside the probe's scope (one output, inputs made by earlier ops)")
        made.add(op.outputs[0])
    if any(t.alias_of or t.kind is not Kind.ACTIVATION for t in graph.tensors) or sim.static_bytes(graph):
        raise ValueError(f"graph {graph.name!r}: views, static bytes or non-activations are outside the probe's scope")
    if not all(float(op.cost).is_integer() for op in graph.ops):
        raise ValueError(f"graph {graph.name!r}: fractional op costs are outside the probe's scope (CP-SAT's integer objective)")


def inputs_of(graph: Graph) -> list[list[int]]:
    """Per op position, the positions of the ops whose outputs it reads."""
    producer = {op.outputs[0]: k for k, op in enumerate(graph.ops)}
    return [list(dict.fromkeys(producer[name] for name in op.inputs)) for op in graph.ops]


def slot(n: int, stage: Any, position: int, copy: int, rounds: bool = True, first: Any = 0) -> Any:
    """The grid's time of copy ``copy`` of op ``position`` made in ``stage``: a stage's
    recomputes, then op ``stage`` itself.  Without ``rounds`` the recomputes run in position
    order; with it, first recomputes in position order, then second ones in the order round two
    of ``apply_recompute`` emits them: by the stage of their first recompute (``first``), then
    position.  ``stage`` and ``first`` may be CP-SAT variables (the time is then an expression)."""
    width = n * n + 2 * n
    if copy == 0:
        return stage * width + n * n + n + stage
    if copy == 1 or not rounds:
        return stage * width + position
    return stage * width + n + first * n + position


def build(graph: Graph, capacity: int, copies: int, rounds: bool = True) -> Program:
    """The interval model of ``graph`` holding at most ``capacity`` bytes (module docstring).
    ``rounds`` keeps to answers ``as_rounds`` expresses: every recompute serves an original op
    (its cut point), a second recompute serves no first one, and a recompute reads its input's
    latest recompute of the same round or an earlier one, made before it or not (as
    ``apply_recompute`` re-points it); without it, a recompute may serve only other recomputes
    (a chain that ``apply_recompute``'s cut points cannot say) and read any copy held."""
    assert copies in (2, 3), "the grid has bands for two recomputes per tensor"
    n = len(graph.ops)
    preds = inputs_of(graph)
    read_by: list[list[int]] = [[] for _ in range(n)]
    for v, us in enumerate(preds):
        for u in us:
            read_by[u].append(v)
    size = {t.name: t.nbytes for t in graph.tensors}
    outputs = set(graph.outputs)
    horizon = slot(n, n, 0, 1)  # past every stage
    cp = cp_model.CpModel()
    present, stage, start, end, length, intervals, sizes = {}, {}, {}, {}, {}, [], []
    for q, op in enumerate(graph.ops):
        for c in range(copies if read_by[q] and op.outputs[0] not in outputs else 1):
            if c == 0:
                present[q, c], start[q, c] = cp.new_constant(1), slot(n, q, q, 0)
            else:
                present[q, c] = cp.new_bool_var(f"p{q}.{c}")
                stage[q, c] = cp.new_int_var(q + 1, n - 1, f"t{q}.{c}")
                start[q, c] = cp.new_int_var(0, horizon, f"s{q}.{c}")  # an interval's start: one variable
                cp.add(start[q, c] == slot(n, stage[q, c], q, c, rounds, stage.get((q, 1), 0)))
                cp.add_implication(present[q, c], present[q, c - 1])
                cp.add(end[q, c - 1] <= start[q, c]).only_enforce_if(present[q, c])
            end[q, c] = cp.new_int_var(horizon if op.outputs[0] in outputs else 0, horizon, f"e{q}.{c}")
            length[q, c] = cp.new_int_var(1, horizon, f"l{q}.{c}")
            intervals.append(cp.new_optional_interval_var(start[q, c], length[q, c], end[q, c], present[q, c],
                                                          f"i{q}.{c}"))
            sizes.append(size[op.outputs[0]])
    reads = {}
    for (v, j), here in start.items():
        for u in preds[v]:
            options = []
            for i in range(copies):
                if (u, i) not in present or (rounds and (i, j) == (2, 1)):  # round two's cut readers: original ops
                    continue
                x = reads[(v, j), u, i] = cp.new_bool_var(f"x{v}.{j}<{u}.{i}")
                cp.add_implication(x, present[u, i])
                cp.add_implication(x, present[v, j])
                cp.add(start[u, i] < here).only_enforce_if(x)
                cp.add(end[u, i] >= here + 1).only_enforce_if(x)
                if rounds and j:  # a recompute reads the input's latest recompute of its round or before
                    for later in range(i + 1, j + 1):
                        if (u, later) in present:
                            cp.add_implication(x, ~present[u, later])
                options.append(x)
            cp.add_bool_or(options).only_enforce_if(present[v, j])
    for (u, i), p in present.items():  # a recompute serves a read: with rounds, an original op's (its cut point)
        if i:
            served = [x for ((_, j), w, c), x in reads.items() if (w, c) == (u, i) and (j == 0 or not rounds)]
            cp.add_bool_or(served).only_enforce_if(p)
    cp.add_cumulative(intervals, sizes, capacity)
    cp.minimize(sum(round(graph.ops[q].cost) * p for (q, c), p in present.items() if c))
    return Program(cp, present, stage, start, end, length, reads, rounds)


def answer_of(graph: Graph, rewritten: Graph) -> Answer:
    """``apply_recompute``'s rewrite ``rewritten`` of ``graph`` as an ``Answer``: each recompute
    in the stage of the next original op, each read served by the copy whose tensor it names."""
    position = {op.name: k for k, op in enumerate(graph.ops)}
    copy_of: dict[str, Copy] = {}
    made: dict[int, int] = {}
    order: list[Copy] = []
    for op in rewritten.ops:
        q = position[op.recompute_of or op.name]
        copy_of[op.outputs[0]] = (q, made.get(q, 0))
        made[q] = made.get(q, 0) + 1
        order.append(copy_of[op.outputs[0]])
    stage: dict[Copy, int] = {}
    following = len(graph.ops) - 1
    for q, c in reversed(order):
        if c == 0:
            following = q
        else:
            stage[q, c] = following
    serves = {(copy_of[op.outputs[0]], copy_of[name][0]): copy_of[name][1] for op in rewritten.ops for name in op.inputs}
    return Answer(stage, serves)


def hint(program: Program, graph: Graph, answer: Answer) -> None:
    """Warm-start ``program`` from ``answer`` with every variable hinted (ends at the last read,
    a graph output's original at the end).  A warm start outside the model (a read it forbids,
    say) is a hint CP-SAT repairs or drops, no error."""
    n = len(graph.ops)
    cp = program.model
    outputs = {k for k, op in enumerate(graph.ops) if op.outputs[0] in graph.outputs}
    begin = {(q, c): slot(n, q if c == 0 else answer.stage.get((q, c), q + 1), q, c, program.rounds,
                          answer.stage.get((q, 1), q + 1)) for q, c in program.present}
    finish: dict[Copy, int] = {key: begin[key] + 1 for key in program.present}
    for (reader, u), i in answer.serves.items():
        finish[u, i] = max(finish[u, i], begin[reader] + 1)
    for q in outputs:
        finish[q, 0] = slot(n, n, 0, 1)
    for key, p in program.present.items():
        if key[1]:
            cp.add_hint(p, key in answer.stage)
            cp.add_hint(program.stage[key], answer.stage.get(key, key[0] + 1))
            cp.add_hint(program.start[key], begin[key])
        cp.add_hint(program.end[key], finish[key])
        cp.add_hint(program.length[key], finish[key] - begin[key])
    for (reader, u, i), x in program.reads.items():
        cp.add_hint(x, answer.serves.get((reader, u)) == i and (reader[1] == 0 or reader in answer.stage))


def solve(program: Program, seconds: float, workers: int, seed: int,
          presolve: bool = False) -> tuple[Answer, bool] | None:
    """CP-SAT's best answer in ``seconds`` and whether it is proved optimal (``None``: none
    found); presolve is off unless asked: on RL250 it ran 100 s before the first answer."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    solver.parameters.cp_model_presolve = presolve
    status = solver.solve(program.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    stage = {key: solver.value(t) for key, t in program.stage.items() if solver.boolean_value(program.present[key])}
    serves = {(reader, u): i for (reader, u, i), x in program.reads.items()
              if solver.boolean_value(x) and (reader[1] == 0 or reader in stage)}
    return Answer(stage, serves, program.rounds), status == cp_model.OPTIMAL


def cut_points(answer: Answer) -> dict[Copy, int]:
    """Per recompute, the first original op it serves: its cut point (``from_ops``) in its round."""
    first: dict[Copy, int] = {}
    for (reader, u), i in answer.serves.items():
        if i and reader[1] == 0:
            first[u, i] = min(first.get((u, i), reader[0]), reader[0])
    return first


def second_cuts(answer: Answer) -> dict[int, int]:
    """Per op dropped twice, its second recompute's cut point in round two."""
    return {u: v for (u, c), v in cut_points(answer).items() if c == 2}


def lazy(answer: Answer) -> Answer:
    """``answer`` with each recompute moved to the stage of its first reader, as
    ``apply_recompute`` anchors it (a recompute's readers come later in position, so one pass
    from the last op back settles them); a first recompute moved past the cut of its input's
    second recompute reads that second one, as round two re-points it."""
    serves, stage, cut = dict(answer.serves), dict(answer.stage), second_cuts(answer)
    for q, c in sorted(stage, reverse=True):
        stage[q, c] = min(v if j == 0 else stage[v, j] for ((v, j), u), i in serves.items() if (u, i) == (q, c))
        for (reader, u), i in list(serves.items()):
            if reader == (q, c) == (q, 1) and i == 1 and u in cut and stage[q, 1] > cut[u]:
                serves[reader, u] = 2
    return Answer(stage, serves, answer.rounds)


def rebuilt(graph: Graph, answer: Answer) -> Graph:
    """The op sequence ``answer`` describes, in ``slot`` order; copy ``c`` of op ``F`` is named
    ``F@cp<c>``."""
    n = len(graph.ops)

    def name(base: str, c: int) -> str:
        return base if c == 0 else f"{base}@cp{c}"

    by_stage: dict[int, list[Copy]] = {}
    for (q, c), t in answer.stage.items():
        by_stage.setdefault(t, []).append((q, c))
    preds = inputs_of(graph)
    tensors = {t.name: t for t in graph.tensors}
    ops, made = [], []
    for t in range(n):
        for q, c in sorted([*by_stage.get(t, []), (t, 0)],
                           key=lambda key: slot(n, t, *key, answer.rounds, answer.stage.get((key[0], 1), 0))):
            op = graph.ops[q]
            ins = tuple(name(graph.ops[u].outputs[0], answer.serves[(q, c), u]) for u in preds[q])
            out = name(op.outputs[0], c)
            made.append(dataclasses.replace(tensors[op.outputs[0]], name=out))
            ops.append(Op(name(op.name, c), op.type, ins, (out,), op.cost, recompute_of=op.name if c else None))
    return Graph(graph.name, tuple(made), tuple(ops), graph.outputs).validate()


def outside_rounds(answer: Answer) -> list[Copy]:
    """The recomputes that keep ``as_rounds`` from expressing a lazy ``answer``: those serving
    no original op (no cut point), and those reading another copy than ``apply_recompute``
    points them at (their input's latest recompute of their round or before, or its second one
    once past that one's cut)."""
    blocking = answer.stage.keys() - cut_points(answer).keys()
    cut = second_cuts(answer)
    for ((v, j), u), i in answer.serves.items():
        if j:
            latest = max(c for c in range(j + 1) if c == 0 or (u, c) in answer.stage)
            past = (u, j + 1) in answer.stage and answer.stage[v, j] > cut.get(u, NEVER)
            if i != (j + 1 if past else latest):
                blocking.add((v, j))
    return sorted(blocking)


def as_rounds(graph: Graph, answer: Answer) -> tuple[list[str], dict[str, str]]:
    """A lazy ``answer`` (up to three copies) as ``apply_recompute``'s names and cut points:
    first recomputes in round one, second ones in round two (``F@recompute`` again), each cut
    at the first original op it serves (``build`` makes each serve one)."""
    first = cut_points(answer)
    names, from_ops = [], {}
    for q, c in sorted(answer.stage, key=lambda key: key[1]):
        op = graph.ops[q]
        names.append(op.name + SUFFIX * (c - 1))
        from_ops[op.outputs[0] + SUFFIX * (c - 1)] = graph.ops[first[q, c]].name
    return names, from_ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(parser)
    parser.add_argument("--seconds", type=float, default=300.0, help="CP-SAT's seconds")
    parser.add_argument("--copies", type=int, default=3, choices=(2, 3), help="intervals per tensor at most")
    parser.add_argument("--workers", type=int, default=8, help="CP-SAT workers")
    parser.add_argument("--seed", type=int, default=0, help="CP-SAT's random seed")
    parser.add_argument("--presolve", action="store_true", help="CP-SAT's presolve on (100 s on RL250)")
    parser.add_argument("--free", action="store_true",
                        help="let a recompute serve only other recomputes (answers outside apply_recompute's rounds)")
    args = parser.parse_args()
    graph, r = auto_cell(args)
    check_scope(graph)
    total = sum(op.cost for op in graph.ops)
    assert r.budget_bytes is not None
    limit = r.budget_bytes
    program = build(graph, limit, args.copies, rounds=not args.free)
    warm = answer_of(graph, r.graph)
    if max((c for _, c in warm.stage), default=0) < args.copies:
        hint(program, graph, warm)
    clock = time.perf_counter()
    solved = solve(program, args.seconds, args.workers, args.seed, args.presolve)
    if solved is None:
        print(f"CP-SAT: no answer in {time.perf_counter() - clock:.1f}s", flush=True)
        return
    found = solved[0]
    print(f"CP-SAT: {'optimal for the model' if solved[1] else 'time limit, not proved optimal'}", flush=True)
    late = dataclasses.replace(lazy(found), rounds=True)  # in the order apply_recompute would run it
    for label, answer in (("as found", found), ("lazy", late)):
        sequence = rebuilt(graph, answer)
        cost, held = sum(op.cost for op in sequence.ops if op.recompute_of), sim.given_peak(sequence)
        print(f"CP-SAT, {label}: {100 * cost / total:.3f}% ({len(answer.stage)} recomputes, "
              f"{sum(c == 2 for _, c in answer.stage)} second ones), sim peak {held:,} of {limit:,}", flush=True)
    if held > limit:  # the lazy answer's, the loop's last
        print("made lazy, the answer no longer fits: not apply_recompute's", flush=True)
        return
    blocking = outside_rounds(late)
    if blocking:
        print("not apply_recompute's rounds (a recompute with no cut point, or reading another copy than the "
              "rewrite would): " + ", ".join(f"{graph.ops[q].name}'s recompute {c}" for q, c in blocking), flush=True)
        return
    names, from_ops = as_rounds(graph, late)
    cost = verified_cost(graph, tuple(names), from_ops, limit)
    print(f"as mpplan's rounds: {100 * cost / total:.3f}%, {time.perf_counter() - clock:.1f}s; verified: "
          f"apply_recompute's sim peak <= budget, plan passes mpplan.verify", flush=True)
    print(f"end load {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()

"""Issue 16's question: what can double drops reach on RL250 at 0.8 (fixed given order)?

Builds the cell as ``scripts/bench_remat_moccasin.py`` does (budget 0.8 of ``static + LOAD``),
takes ``remat``'s ``solver: auto`` answer and the double-drop search's (``cutmulti``) from it,
and solves the cut MILP with double-drop options (``mpplan.passes.remat.cutmilp2``) warm-started
from the cheaper one (when it lies in that MILP's family).  Prints each answer's overhead, the
MILP's best and its proved bound (for one-drop answers and double drops whose candidate
neighbours are not recomputed: ``cutmilp2``'s scope), and checks the MILP's answer: rebuilt on
the original graph by ``apply_recompute``, its ``sim`` peak within the budget and its plan
passing ``mpplan.verify``.

``--focus over`` frees only the candidates with an output live across a step whose as-given
load (no recompute) passes the budget, plus the warm start's; every other one is held not
recomputed (``restrict.Restriction``'s sub-MILP), so the optimum and bound printed are those of
that smaller family: a tensor never live across a step over the budget frees nothing there by
its own drop.  ``--focus over+inputs`` frees the producers of those candidates' inputs too (a
recompute that reads a recomputed input instead of holding it, ``cutmilp``'s chains).

Rerun: ``python scripts/probe_remat_doubles.py [--size 250] [--fraction 0.8] [--time-limit 60]
[--multi 60] [--seconds 400] [--max-nonzeros 8000000] [--focus all|over|over+inputs]``  (from a
checkout other than the installed one: ``PYTHONPATH=. python scripts/...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

from benchlib import SHARED_DATA

from mpplan import sim
from mpplan.capture.graph_file import load_graph
from mpplan.config import Device
from mpplan.graph import Graph
from mpplan.passes.remat import apply_recompute, build_model, remat
from mpplan.passes.remat.result import RematResult, result_of
from mpplan.passes.remat.cutexact import CutChoice, choice_of_point, option_of, solve_program, warm_point
from mpplan.passes.remat.cutmilp2 import DoubleProgram, double_names, double_program, neighbours
from mpplan.passes.remat.cutmulti import search_multi
from mpplan.passes.remat.evaluation import evaluate
from mpplan.passes.remat.ilp import available_backend, solve_arrays
from mpplan.passes.remat.model import SUFFIX, RematModel
from mpplan.passes.remat.restrict import Restriction
from mpplan.passes.remat.rewriting import repeated_op
from mpplan.plan import RematRecord
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify


#: ``--focus``'s choices: every candidate, those live across a step over the budget, and
#: those with their inputs' producers.
FOCUS = ("all", "over", "over+inputs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cell_arguments(parser)
    parser.add_argument("--multi", type=float, default=60.0, help="seconds of the double-drop search")
    parser.add_argument("--seconds", type=float, default=400.0, help="the MILP's seconds")
    parser.add_argument("--max-nonzeros", type=int, default=8_000_000, help="the MILP's size cap")
    parser.add_argument("--focus", choices=FOCUS, default="all", help="the candidates the MILP may recompute")
    args = parser.parse_args()
    graph, r = auto_cell(args)
    total = sum(op.cost for op in graph.ops)
    assert r.budget_bytes is not None
    limit = r.budget_bytes
    names, from_ops = tuple(repeated_op(op) for op in r.recompute_ops), dict(r.from_ops)
    clock = time.perf_counter()
    found = search_multi(graph, names, from_ops, limit, clock + args.multi)
    if found is not None:
        names, from_ops = found.names, found.from_ops
        print(f"double-drop search: {100 * found.cost / total:.2f}% ({time.perf_counter() - clock:.1f}s)", flush=True)
    model = build_model(graph)
    clock = time.perf_counter()
    program = double_program(model, limit - model.static_bytes, args.max_nonzeros)
    assert program is not None, "RL graph outside the cut model or the MILP too large"
    warm = warm_choice(model, program, names, from_ops)
    print(f"MILP: {len(program.cost)} columns, {len(program.row_lo)} rows, {len(program.values_nz)} nonzeros, "
          f"{sum(map(len, program.doubles))} double options, built in {time.perf_counter() - clock:.1f}s; "
          f"warm start {'taken' if warm is not None else 'outside the family'}", flush=True)
    clock = time.perf_counter()
    if args.focus == "all":
        choice = solve_program(program, args.seconds, warm)
    else:
        free = focus_candidates(model, limit, args.focus == "over+inputs") | (warm or {}).keys()
        print(f"focus {args.focus}: {len(free)} of {model.num_candidates} candidates free", flush=True)
        choice = solve_focused(program, free, warm or {}, args.seconds)
    seconds = time.perf_counter() - clock
    if choice is None:
        print(f"MILP: no answer in {seconds:.1f}s", flush=True)
        return
    cost = check(graph, model, program, choice.chosen, limit)
    bound = "-" if choice.bound is None or not math.isfinite(choice.bound) else f"{100 * choice.bound / total:.2f}%"
    twice = sum(k >= program.singles[i] for i, k in choice.chosen.items())
    print(f"MILP: {100 * cost / total:.2f}% ({twice} tensors dropped twice) {choice.status}, proved >= {bound} "
          f"for its family, {seconds:.1f}s; verified: sim peak <= budget, plan passes mpplan.verify", flush=True)
    print(f"end load {os.getloadavg()}", flush=True)


def add_cell_arguments(parser: argparse.ArgumentParser) -> None:
    """The cell's options, shared by the probes: graph size, budget fraction, ``remat``'s seconds."""
    parser.add_argument("--size", default="250", help="random_layered_n<size>")
    parser.add_argument("--fraction", type=float, default=0.8, help="budget as a fraction of static + LOAD")
    parser.add_argument("--time-limit", type=float, default=60.0, help="remat's seconds (solver: auto)")


def auto_cell(args: argparse.Namespace) -> tuple[Graph, RematResult]:
    """The cell's graph and ``remat``'s ``solver: auto`` answer on it, printed with the time and load."""
    (path,) = SHARED_DATA.glob(f"random_layered_n{args.size}_*.json")
    graph = load_graph(path)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} load {os.getloadavg()}", flush=True)
    clock = time.perf_counter()
    r = remat(graph, "budget", budget=args.fraction, solver="auto", time_limit_s=args.time_limit)
    print(f"auto: {100 * r.compute_overhead:.2f}% ({r.solver}, {time.perf_counter() - clock:.1f}s)", flush=True)
    return graph, r


def focus_candidates(model: RematModel, limit: int, inputs: bool) -> set[int]:
    """The candidates with an output live across a step whose as-given load passes ``limit``
    (``static + LOAD``, no recompute), and with ``inputs`` the producers of their inputs."""
    profile = evaluate(model, ()).profile  # LOAD at each step of the as-given order
    over = [p for p, held in enumerate(profile) if held + model.static_bytes > limit]
    found = {i for i, outputs in enumerate(model.cand_outputs)
             if any(model.start[j] < p <= model.last[j] for j in outputs for p in over)}
    if inputs:
        found |= {model.producer[j] for i in found for j in model.cand_inputs[i] if model.producer[j] >= 0}
    return found


def solve_focused(program: DoubleProgram, free: set[int], warm: dict[int, int], seconds: float) -> CutChoice | None:
    """``solve_program``'s answer with only ``free`` candidates and those ``warm`` recomputes
    decided, every other one not recomputed (so the sub-MILP's cost is the whole answer's)."""
    restriction = Restriction(program)
    sub = restriction.sub_milp(warm, set(free) | warm.keys())
    backend = available_backend()
    if sub is None or backend is None:
        return None
    start = restriction.restrict(sub, warm_point(program, warm)) if warm else None
    status, x, _, bound = solve_arrays(sub, backend, seconds, start)
    return choice_of_point(program, status, None if x is None else restriction.expand(sub, x), bound)


def warm_choice(model: RematModel, program: DoubleProgram, names: tuple[str, ...],
                from_ops: dict[str, str]) -> dict[int, int] | None:
    """``names`` cut at ``from_ops`` (``cutmulti.joint_names``' form) as ``program``'s choice
    (candidate -> option), or ``None`` when it lies outside the program's family."""
    topo = model.graph.topology
    index = {model.graph.ops[k].name: i for i, k in enumerate(model.cand_op)}
    dropped = {n.removesuffix(SUFFIX) for n in names if n.endswith(SUFFIX)}
    chosen: dict[int, int] = {}
    for op in dropped:
        i, t = index[op], model.graph.ops[topo.op_index[op]].outputs[0]
        b1, b2 = topo.op_index[from_ops[t]], topo.op_index[from_ops[t + SUFFIX]]
        match = [k for k, d in enumerate(program.doubles[i]) if (d.b1, d.b2) == (b1, b2)]
        if not match:
            return None
        chosen[i] = program.singles[i] + match[0]
    rest = option_of(model, [n for n in names if n.removesuffix(SUFFIX) not in dropped],
                     {t: o for t, o in from_ops.items() if SUFFIX not in t})
    if rest is None:
        return None
    chosen.update(rest)
    if any(c in chosen for i in chosen if chosen[i] >= program.singles[i] for c in neighbours(model, i)):
        return None
    return chosen


def check(graph: Graph, model: RematModel, program: DoubleProgram, chosen: dict[int, int], limit: int) -> float:
    """The added cost of ``chosen`` rebuilt on ``graph`` (``verified_cost``)."""
    return verified_cost(graph, *double_names(model, program, chosen), limit)


def verified_cost(graph: Graph, names: tuple[str, ...], from_ops: dict[str, str], limit: int) -> float:
    """The added cost of ``apply_recompute(graph, names, from_ops)``, after asserting that its
    ``sim`` peak fits ``limit`` and that its plan passes the verifier."""
    rewritten = apply_recompute(graph, names, from_ops)
    assert sim.given_peak(rewritten) <= limit
    result = result_of(graph, names, "budget", sim.given_peak(graph), 0.0, from_ops=from_ops)
    inner = plan(result.graph, [Device("cuda:0", 1 << 40)], PlannerSettings(schedule="as_given", alignment=1))
    verify(graph, dataclasses.replace(inner, graph_hash=graph.content_hash, graph_name=graph.name,
                                      remat=tuple(RematRecord.from_mapping(x) for x in result.plan_records())))
    return sum(op.cost for op in rewritten.ops if op.recompute_of is not None)


if __name__ == "__main__":
    main()

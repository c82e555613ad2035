"""Moccasin's protocol on its random layered graphs, fixed given order: the remat pass alone.

Budget = 0.9 and 0.8 of ``static + LOAD`` of the graph's given order; overhead = recomputed
op cost / the graph's total op cost (Moccasin, ICML 2023: 0.9, 4.9% on RL250; 0.7, 3.4% on
RL1000).  Prints one line per graph and budget: overhead, peak / no-remat peak, what decided
(``+cuts``: late regions start at cut points the solver chose, ``+rounds``: a second round,
``+search``: the local search on cut points, ``mpplan.passes.remat.cutsearch``),
seconds, recomputes, and how many records state a cut (``from_op``).

``--milp SECONDS`` then solves the cut-choosing MILP (``mpplan.passes.remat.cutexact``: one
recompute per tensor, each cut at any gap), started from that answer when it is one round, and
prints its best overhead and the overhead it proves no choice of that model goes under.
``--lns SECONDS`` runs the large-neighbourhood search on that MILP (``mpplan.passes.remat.cutlns``)
from the cell's answer, when it is one round, and prints its overhead.  ``--multi SECONDS`` runs
the double-drop search (``mpplan.passes.remat.cutmulti``) from the cell's answer for that long, when
it is one round or double drops, and prints its overhead (what ``solver: auto`` ran in its last
quarter before the neighbourhood LNS took it).  ``--local SECONDS`` runs that LNS
(``mpplan.passes.remat.cutwindow``: each sub-MILP built for its window) from the cell's answer,
when it is one round, and prints its overhead (``solver: auto`` runs it in the last ``LOCAL_SHARE``).
``--lns2 SECONDS`` then runs the large-neighbourhood search on the double-drop
MILP (``mpplan.passes.remat.cutlns2``) from the cell's answer, or from the double-drop search's
when ``--multi`` ran and found one, for that long, building the whole MILP past
``formulation.MAX_NONZEROS``, and prints its overhead, the build's seconds and when it found it.
``--own`` then plans the graph in mpplan's own order (``schedule: auto``, no recompute) and runs
the same ``remat`` call on that order at the cell's budget in bytes, ``static + LOAD`` bounded as
in the cell: the issue's "with mpplan's own order" beside the given order.

Rerun: ``python scripts/bench_remat_moccasin.py [--sizes 250,1000] [--fractions 0.9,0.8] [--time-limit 60]
[--milp 60] [--lns 120] [--multi 60] [--lns2 150] [--local 120] [--own]``.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchlib import SHARED_DATA

from mpplan import sim
from mpplan.capture.graph_file import load_graph
from mpplan.config import Device
from mpplan.errors import InfeasibleError
from mpplan.graph import Graph, reordered
from mpplan.passes.remat import apply_recompute, build_model, remat
from mpplan.passes.remat.cutexact import choice_names, option_of, solve_cuts
from mpplan.passes.remat.cutlns import lns_cuts
from mpplan.passes.remat.cutlns2 import choice_of, lns_doubles
from mpplan.passes.remat.cutmilp2 import double_program
from mpplan.passes.remat.cutmulti import search_multi
from mpplan.passes.remat.cutmilp import cut_options
from mpplan.passes.remat.cutsearch import Improve
from mpplan.passes.remat.cutwindow import lns_local
from mpplan.passes.remat.cuts import CutFit
from mpplan.passes.remat.model import SUFFIX, RematModel
from mpplan.passes.remat.result import RematResult
from mpplan.passes.remat.rewriting import repeated_op
from mpplan.planner import PlannerSettings, plan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250,1000", help="comma-separated graph sizes (random_layered_n<size>)")
    parser.add_argument("--fractions", default="0.9,0.8", help="comma-separated budgets (fractions of the peak)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per budget (soft)")
    parser.add_argument("--milp", type=float, default=0.0, help="seconds for the cut MILP after each cell (0: none)")
    parser.add_argument("--lns", type=float, default=0.0, help="seconds for the cut LNS after each cell (0: none)")
    parser.add_argument("--multi", type=float, default=0.0,
                        help="seconds for the double-drop search after each cell (0: none)")
    parser.add_argument("--lns2", type=float, default=0.0,
                        help="seconds for the double-drop MILP's LNS after each cell (0: none)")
    parser.add_argument("--local", type=float, default=0.0,
                        help="seconds for the neighbourhood LNS after each cell (0: none)")
    parser.add_argument("--own", action="store_true",
                        help="also each cell in mpplan's own order (the planner's schedule), the same budget in bytes")
    args = parser.parse_args()
    for size in args.sizes.split(","):
        (path,) = SHARED_DATA.glob(f"random_layered_n{size}_*.json")
        graph = load_graph(path)
        for fraction in map(float, args.fractions.split(",")):
            clock = time.perf_counter()
            try:
                r = remat(graph, "budget", budget=fraction, solver="auto", time_limit_s=args.time_limit)
            except InfeasibleError as exc:
                print(f"RL{size} {fraction}: refused after {time.perf_counter() - clock:.1f}s: {exc}", flush=True)
                continue
            print(f"RL{size} {fraction}: {100 * r.compute_overhead:.3f}% peak "
                  f"{r.peak_bytes / r.baseline_peak_bytes:.3f} {r.solver} {time.perf_counter() - clock:.1f}s "
                  f"recomputes {len(r.recompute_ops)} cuts {len(r.from_ops)}", flush=True)
            if args.milp > 0:
                print(f"  cut MILP: {milp_line(graph, r, args.milp)}", flush=True)
            if args.lns > 0:
                print(f"  cut LNS: {lns_line(graph, r, args.lns)}", flush=True)
            if args.local > 0:
                print(f"  neighbourhood LNS: {lns_line(graph, r, args.local, lns_local)}", flush=True)
            multi = None
            if args.multi > 0:
                line, multi = multi_line(graph, r, args.multi)
                print(f"  double drops: {line}", flush=True)
            if args.lns2 > 0:
                print(f"  double-drop LNS: {lns2_line(graph, r, multi, args.lns2)}", flush=True)
            if args.own:
                print(f"  own order: {own_line(graph, r.budget_bytes, args.time_limit)}", flush=True)


def own_line(graph: Graph, budget: int | None, time_limit_s: float) -> str:
    """The cell in the planner's own order (its schedule without recomputes), ``static + LOAD``
    bounded by the same ``budget`` bytes: nothing recomputed when the order alone fits."""
    assert budget is not None
    made = plan(graph, [Device("cuda:0", 1 << 40)], PlannerSettings(schedule="auto"))
    index = {op.name: k for k, op in enumerate(graph.ops)}
    order = [index[name] for name in made.schedule]
    own = reordered(graph, order, [graph.ops[k] for k in order])
    alone = sim.given_peak(own) / budget
    if alone <= 1:
        return f"fits alone, peak {alone:.3f} of the budget"
    clock = time.perf_counter()
    r = remat(own, "budget", budget=budget, solver="auto", time_limit_s=time_limit_s)
    return (f"{100 * r.compute_overhead:.3f}% {r.solver} {time.perf_counter() - clock:.1f}s (no-remat peak "
            f"{alone:.3f} of the budget)")


def one_round(model: RematModel, r: RematResult) -> dict[int, int] | None:
    """``r``'s answer as the cut MILP's choice (candidate -> option), or ``None`` when it is
    not one round of the cut model."""
    names = [repeated_op(op) for op in r.recompute_ops]
    return None if any(SUFFIX in n for n in names) else option_of(model, names, r.from_ops)


def lns_line(graph: Graph, r: RematResult, seconds: float, search: Improve = lns_cuts) -> str:
    """The overhead of ``search`` (``lns_cuts``, or ``lns_local``) started from ``r`` within
    ``seconds``, its plan's peak checked by ``sim`` on the rewritten graph."""
    clock = time.perf_counter()
    model = build_model(graph)
    start, options = one_round(model, r), cut_options(model)
    if r.budget_bytes is None or start is None or options is None:
        return "not one round of the cut model"
    found = search(model, options, start, r.budget_bytes, clock + seconds)
    names, from_ops = choice_names(model, found)
    rewritten = apply_recompute(graph, names, from_ops)
    fits = sim.given_peak(rewritten) <= r.budget_bytes
    total = sum(op.cost for op in graph.ops)
    return (f"{100 * sum(model.cand_cost[i] for i in found) / total:.2f}% fits {fits}, "
            f"{time.perf_counter() - clock:.1f}s")


def multi_line(graph: Graph, r: RematResult, seconds: float) -> tuple[str, CutFit | None]:
    """The overhead of ``search_multi`` started from ``r`` within ``seconds``, its answer's
    peak checked by ``sim`` on the rewrite rebuilt from its names; and that answer."""
    clock = time.perf_counter()
    if r.budget_bytes is None:
        return "no budget", None
    names = [repeated_op(op) for op in r.recompute_ops]
    found = search_multi(graph, names, r.from_ops, r.budget_bytes, clock + seconds)
    if found is None:
        return f"nothing cheaper (or not a cut answer), {time.perf_counter() - clock:.1f}s", None
    rewritten = apply_recompute(graph, found.names, found.from_ops)
    fits = sim.given_peak(rewritten) <= r.budget_bytes
    total = sum(op.cost for op in graph.ops)
    twice = sum(SUFFIX + SUFFIX in op.name for op in rewritten.ops)
    return (f"{100 * found.cost / total:.2f}% fits {fits}, {twice} tensors dropped twice, "
            f"{time.perf_counter() - clock:.1f}s"), found


def lns2_line(graph: Graph, r: RematResult, multi: CutFit | None, seconds: float) -> str:
    """The overhead of ``lns_doubles`` started from ``multi`` (else ``r``) within ``seconds``
    (the double-drop MILP's build included, past the nonzero cap), its answer's peak checked
    by ``sim`` on the rewrite rebuilt from its names."""
    clock = time.perf_counter()
    model = build_model(graph)
    if r.budget_bytes is None:
        return "no budget"
    names, from_ops = (multi.names, multi.from_ops) if multi is not None else (
        [repeated_op(op) for op in r.recompute_ops], r.from_ops)
    program = double_program(model, r.budget_bytes - model.static_bytes, max_nonzeros=sys.maxsize)
    start = None if program is None else choice_of(program, names, from_ops)
    if program is None or start is None:
        return f"not an answer of the double-drop MILP, {time.perf_counter() - clock:.1f}s"
    built = time.perf_counter() - clock
    found = lns_doubles(graph, program, start, r.budget_bytes, clock + seconds)
    if found is None:
        return f"nothing cheaper, built in {built:.1f}s, {time.perf_counter() - clock:.1f}s"
    fits = sim.given_peak(apply_recompute(graph, found.names, found.from_ops)) <= r.budget_bytes
    total = sum(op.cost for op in graph.ops)
    return (f"{100 * found.cost / total:.2f}% fits {fits}, built in {built:.1f}s, "
            f"{time.perf_counter() - clock:.1f}s")


def milp_line(graph: Graph, r: RematResult, seconds: float) -> str:
    """The cut MILP's best overhead and proved lower bound for ``r``'s budget, warm-started
    from ``r`` when it is one round."""
    clock = time.perf_counter()
    if r.budget_bytes is None:
        return "no budget"
    model = build_model(graph)
    warm = one_round(model, r)
    found = solve_cuts(model, r.budget_bytes - model.static_bytes, seconds, warm=warm)
    if found is None:
        return f"no answer (outside the model, too large, or none in time) {time.perf_counter() - clock:.1f}s"
    total = sum(op.cost for op in graph.ops)
    best = sum(model.cand_cost[i] for i in found.chosen)
    bound = "-" if found.bound is None else f"{100 * found.bound / total:.2f}%"
    return (f"{100 * best / total:.2f}% {found.status}, proved >= {bound}, warm {warm is not None}, "
            f"{time.perf_counter() - clock:.1f}s")


if __name__ == "__main__":
    main()

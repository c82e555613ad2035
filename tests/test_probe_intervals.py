"""``scripts/probe_remat_intervals.py``: CP-SAT over retention intervals, and its answers
rebuilt as op sequences and as ``apply_recompute``'s rounds.

On tiny single-output graphs: every answer's op sequence fits the budget (the model is not
looser than ``sim``); made lazy and expressed as rounds, ``apply_recompute``'s rewrite holds
the same bytes and costs the same (the mapping is faithful); with two copies the optimum equals
brute force over every stage of every recompute (the model is exact for its family); and a
rewrite read back as an answer (the warm start) rebuilds to itself."""

from __future__ import annotations

import dataclasses
import itertools
import sys

from conftest import REPO
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ortools.sat.python import cp_model
from test_remat_cuts import peak

from mpplan import sim
from mpplan.graph import Graph, Op, Tensor
from mpplan.passes.remat import apply_recompute

sys.path.insert(0, str(REPO / "scripts"))

import probe_remat_intervals as probe  # noqa: E402


@st.composite
def layered(draw: st.DrawFn, max_ops: int = 8) -> Graph:
    """Random DAGs of four to ``max_ops`` single-output ops, the first reading nothing, each
    later one reading its predecessor and up to two older outputs (the random layered graphs'
    shape: skip connections hold tensors across ops that a recompute can free)."""
    n = draw(st.integers(4, max_ops))
    tensors = [Tensor(f"t{k}", draw(st.integers(1, 100))) for k in range(n)]
    ops = [Op("O0", "f", (), ("t0",), float(draw(st.integers(1, 3))))]
    for k in range(1, n):
        reads = {k - 1, *draw(st.lists(st.integers(0, k - 1), max_size=2))}
        ops.append(Op(f"O{k}", "f", tuple(f"t{u}" for u in sorted(reads)), (f"t{k}",), float(draw(st.integers(1, 3)))))
    return Graph("layered", tuple(tensors), tuple(ops), (f"t{n - 1}",)).validate()


def budget_of(graph: Graph, fraction: float) -> int:
    """A budget ``fraction`` of the way from the largest op's working set (no recompute goes
    under it) to the no-remat peak; ``assume`` there is room between them."""
    floor, top = sim.max_op_working_set(graph), peak(graph)
    assume(floor < top)
    return int(floor + fraction * (top - floor))


def cost(graph: Graph) -> float:
    return sum(op.cost for op in graph.ops if op.recompute_of is not None)


def solved(graph: Graph, budget: int, copies: int) -> tuple[probe.Answer, bool] | None:
    probe.check_scope(graph)
    return probe.solve(probe.build(graph, budget, copies), 20.0, workers=1, seed=0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered(), st.floats(0.0, 0.99), st.sampled_from([2, 3]))
def test_answers_fit_and_map_onto_rounds_faithfully(graph: Graph, fraction: float, copies: int) -> None:
    budget = budget_of(graph, fraction)
    found = solved(graph, budget, copies)
    if found is None:
        return
    answer, _ = found
    assert peak(probe.rebuilt(graph, answer)) <= budget
    lazy = probe.lazy(answer)
    sequence = probe.rebuilt(graph, lazy)
    assert not probe.outside_rounds(lazy)
    names, from_ops = probe.as_rounds(graph, lazy)
    rewritten = apply_recompute(graph, names, from_ops)
    assert (peak(rewritten), cost(rewritten)) == (peak(sequence), cost(sequence))
    assert probe.answer_of(graph, rewritten) == lazy  # the same stages, each read served by the same copy


def chain(reads: dict[int, list[int]], sizes: list[int]) -> Graph:
    n = len(reads)
    return Graph("chain", tuple(Tensor(f"t{k}", sizes[k]) for k in range(n)),
                 tuple(Op(f"O{k}", "f", tuple(f"t{u}" for u in reads[k]), (f"t{k}",), 1.0) for k in range(n)),
                 (f"t{n - 1}",)).validate()


def agrees_with_the_rewrite(graph: Graph, answer: probe.Answer) -> None:
    """``answer`` is one ``build`` accepts at its own peak, and made lazy it maps onto rounds
    whose rewrite reads back as itself, at the same peak and cost."""
    budget = peak(probe.rebuilt(graph, answer))
    program = probe.build(graph, budget, 3)
    for key, present in program.present.items():
        if key[1]:
            program.model.add(present == int(key in answer.stage))
            if key in answer.stage:
                program.model.add(program.stage[key] == answer.stage[key])
    for (reader, u, i), x in program.reads.items():
        if reader[1] == 0 or reader in answer.stage:
            program.model.add(x == int(answer.serves[reader, u] == i))
    assert probe.solve(program, 10.0, workers=1, seed=0) is not None
    lazy = probe.lazy(answer)
    assert not probe.outside_rounds(lazy)
    rewritten = apply_recompute(graph, *probe.as_rounds(graph, lazy))
    assert probe.answer_of(graph, rewritten) == lazy
    assert (peak(rewritten), cost(rewritten)) == (peak(probe.rebuilt(graph, lazy)), cost(probe.rebuilt(graph, lazy)))


def test_second_recomputes_of_a_stage_run_in_round_twos_order() -> None:
    """Two tensors dropped twice, their second recomputes in one stage: round two emits them in
    its graph's order (by their first recomputes' stages), not by position."""
    graph = chain({0: [], 1: [], 2: [0], 3: [1], 4: [2, 3], 5: [4], 6: [5, 3], 7: [6, 2], 8: [7], 9: [8, 2, 3]},
                  [30, 1, 10, 50, 1, 1, 1, 1, 100, 1])
    stage = {(2, 1): 7, (3, 1): 6, (2, 2): 9, (3, 2): 9}
    served = {(6, 3): 1, (7, 2): 1, (9, 2): 2, (9, 3): 2}
    serves = {((v, 0), u): served.get((v, u), 0) for v in range(10) for u in probe.inputs_of(graph)[v]}
    serves |= {((q, c), u): 0 for q, c in stage for u in probe.inputs_of(graph)[q]}
    agrees_with_the_rewrite(graph, probe.Answer(stage, serves))


def test_a_first_recompute_moved_past_a_second_cut_reads_the_second() -> None:
    """Made lazy, the first recompute of O1 moves past the cut of t0's second recompute: round
    two re-points it to that second recompute, and so must ``lazy``."""
    graph = chain({0: [], 1: [0], 2: [1], 3: [2, 0], 4: [3], 5: [4, 0], 6: [5, 1]}, [50, 50, 10, 10, 10, 10, 10])
    answer = probe.Answer({(0, 1): 3, (1, 1): 3, (0, 2): 5},
                          {((1, 0), 0): 0, ((2, 0), 1): 0, ((3, 0), 2): 0, ((3, 0), 0): 1, ((4, 0), 3): 0,
                           ((5, 0), 4): 0, ((5, 0), 0): 2, ((6, 0), 5): 0, ((6, 0), 1): 1, ((1, 1), 0): 1})
    assert probe.lazy(answer).stage[1, 1] == 6 and probe.lazy(answer).serves[(1, 1), 0] == 2
    agrees_with_the_rewrite(graph, answer)


def least_interval_cost(graph: Graph, budget: int) -> float | None:
    """Brute force over the two-copy model: every op recomputed in no stage or in any later
    one, an op's read served by the latest copy made before it (as ``build``'s ordered copies
    must) and a recompute's by its input's recompute where there is one (``build``'s rounds),
    a recompute serving no original op left out; the least cost whose op sequence fits."""
    n = len(graph.ops)
    preds = probe.inputs_of(graph)
    read = [q for q in range(n) if any(q in us for us in preds)]
    best = None
    for combo in itertools.product(*[[None, *range(q + 1, n)] for q in read]):
        stage = {(q, 1): t for q, t in zip(read, combo) if t is not None}

        def when(copy: tuple[int, int]) -> int:
            return probe.slot(n, copy[0] if copy[1] == 0 else stage[copy], copy[0], copy[1])

        readers = [(v, 0) for v in range(n)] + list(stage)
        # an op reads the copy made last before it; a recompute, its input's recompute if any
        serves = {(r, u): int((u, 1) in stage and (r[1] == 1 or when((u, 1)) < when(r)))
                  for r in readers for u in preds[r[0]]}
        if any(i and when((u, 1)) >= when(r) for (r, u), i in serves.items()):
            continue
        if any(not any(serves[(v, 0), u] for v in range(n) if u in preds[v]) for u, _ in stage):
            continue
        sequence = probe.rebuilt(graph, probe.Answer(stage, serves))
        if peak(sequence) <= budget:
            best = cost(sequence) if best is None else min(best, cost(sequence))
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered(max_ops=7), st.floats(0.0, 0.99))
def test_two_copies_equal_brute_force_over_the_model(graph: Graph, fraction: float) -> None:
    budget = budget_of(graph, fraction)
    exact = least_interval_cost(graph, budget)
    found = solved(graph, budget, 2)
    assert (found is None) == (exact is None)
    if found is not None:
        assert found[1] and cost(probe.rebuilt(graph, found[0])) == exact


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered(), st.floats(0.0, 0.99))
def test_a_rewrite_read_back_rebuilds_to_itself(graph: Graph, fraction: float) -> None:
    budget = budget_of(graph, fraction)
    found = solved(graph, budget, 3)
    if found is None:
        return
    lazy = probe.lazy(found[0])
    rewritten = apply_recompute(graph, *probe.as_rounds(graph, lazy))
    back = probe.answer_of(graph, rewritten)
    assert (peak(probe.rebuilt(graph, back)), cost(probe.rebuilt(graph, back))) == (peak(rewritten), cost(rewritten))


def test_a_free_answer_is_checked_in_the_order_the_rewrite_runs() -> None:
    """Without rounds the grid runs a stage's recomputes in position order, so a second
    recompute may precede a first one; the rewrite runs round one first.  The answer the probe
    fits and maps is the lazy one in the rewrite's order: its peak is the rewrite's."""
    graph = chain({0: [], 1: [0], 2: [1], 3: [], 4: [3, 2], 5: [4, 1], 6: [5], 7: [6], 8: [7, 1, 3]},
                  [30, 50, 1, 40, 1, 1, 1, 1, 1])
    serves = {((v, 0), u): 0 for v in range(9) for u in probe.inputs_of(graph)[v]}
    serves |= {((5, 0), 1): 1, ((8, 0), 1): 2, ((8, 0), 3): 1, ((1, 1), 0): 0, ((1, 2), 0): 0}
    free = probe.Answer({(1, 1): 5, (1, 2): 8, (3, 1): 8}, serves, rounds=False)
    late = dataclasses.replace(probe.lazy(free), rounds=True)
    assert not probe.outside_rounds(late)
    rewritten = apply_recompute(graph, *probe.as_rounds(graph, late))
    assert peak(rewritten) == peak(probe.rebuilt(graph, late)) != peak(probe.rebuilt(graph, free))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered(), st.floats(0.0, 0.99), st.booleans())
def test_a_rewrite_is_a_warm_start_either_model_takes(graph: Graph, fraction: float, rounds: bool) -> None:
    """A rewrite read back (``answer_of``), hinted with its recomputes fixed, completes to a
    solution of the model with rounds and without (whose grid orders a stage differently)."""
    budget = budget_of(graph, fraction)
    found = solved(graph, budget, 3)
    if found is None:
        return
    rewritten = apply_recompute(graph, *probe.as_rounds(graph, probe.lazy(found[0])))
    program = probe.build(graph, peak(rewritten), 3, rounds=rounds)
    probe.hint(program, graph, probe.answer_of(graph, rewritten))
    solver = cp_model.CpSolver()
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.num_workers = 1
    assert solver.solve(program.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)

"""The cut MILP with double drops (``mpplan.passes.remat.cutmilp2``).

Held equal to a brute force over the same family on tiny graphs: every subset of
candidates, each recomputed once at any cut or (single-output ops) dropped at any two of
its gaps with no candidate neighbour (consumer, producer of an input) recomputed, each
rewritten by ``apply_recompute`` and measured by ``sim``.  Every answer's rewrite fits,
costs what the MILP says, and plans into a plan the verifier passes.
"""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_remat_cutmilp import small_dags, unlinked
from test_remat_cutmulti import least_multi_cost, twice_read
from test_remat_cuts import cut_options, gapped_graphs, least_cut_cost, peak, planned_with

from mpplan import sim
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.passes.remat import RECOMPUTES_ONLY, apply_recompute, build_model
from mpplan.passes.remat.result import result_of
from mpplan.passes.remat.cutexact import option_of, solve_program
from mpplan.passes.remat.cutmilp import cut_options as cut_options_of
from mpplan.passes.remat.cutmilp2 import DoubleProgram, double_names, double_program, neighbours
from mpplan.passes.remat.cutmulti import Drop, drops_of, joint_names
from mpplan.passes.remat.model import storage_users
from mpplan.verify import verify

#: Brute-force combinations past which a drawn graph is not checked (seconds each).
MAX_COMBOS = 3000


def milp2_cost(graph: Graph, budget: int, links: bool = True) -> float | None:
    """The double-drop MILP's least cost for ``budget`` (``None``: nothing fits), after
    checking its answer's rewrite fits, costs what it says and passes the verifier;
    without ``links``, no candidate is a chain link (``RECOMPUTES_ONLY``)."""
    model = build_model(graph)
    options = cut_options_of(model)
    assert options is not None
    program = DoubleProgram(model, options if links else unlinked(options), budget - model.static_bytes)
    assert not program.too_large
    found = solve_program(program, 20.0)
    if found is None:
        return None
    assert found.status == "optimal"
    names, from_ops = double_names(model, program, found.chosen)
    rewritten = apply_recompute(graph, names, from_ops)
    assert peak(rewritten) <= budget
    cost = sum(op.cost for op in rewritten.ops if op.recompute_of is not None)
    assert abs(cost - sum(program.cost[program.y_cols[i][k]] for i, k in found.chosen.items())
               * max(model.cand_cost)) < 1e-6
    assert found.bound is not None and found.bound <= cost + 1e-6
    if names:
        verify(graph, planned_with(graph, result_of(graph, names, "budget", peak(graph), 0.0, from_ops=from_ops)))
    return cost


def family(graph: Graph) -> list[list[object]]:
    """Per candidate: not recomputed (``None``), each one-drop cut (a dict), each double drop."""
    names = build_model(graph).candidate_names()
    uses = storage_users(graph)
    return [[None, *cut_options(graph, name), *drops_of(graph, uses, [name])] for name in names]


def least_family_cost(graph: Graph, budget: int, links: bool = True) -> float | None:
    """Brute force over cuts and double drops, a double drop's neighbours left alone (the
    model's scope); without ``links``, no chain link (``RECOMPUTES_ONLY``)."""
    model = build_model(graph)

    def in_scope(combo: tuple[object, ...]) -> bool:
        doubled = [i for i, c in enumerate(combo) if isinstance(c, Drop)]
        linked = any(isinstance(c, dict) and RECOMPUTES_ONLY in c.values() for c in combo)
        return all(combo[c] is None for i in doubled for c in neighbours(model, i)) and (links or not linked)

    return least_multi_cost(graph, budget, in_scope)


def test_the_milp_drops_the_cheap_tensor_twice_where_one_drop_costs_more() -> None:
    """``twice_read`` at 410 bytes: one recompute per tensor costs 5 (``B``); ``A`` dropped
    twice (after ``C1``'s and ``D``'s gaps) costs 2, and the MILP finds it."""
    graph = twice_read()
    assert least_cut_cost(graph, 410) == 5.0
    assert milp2_cost(graph, 410) == 2.0
    model = build_model(graph)
    program = double_program(model, 410 - model.static_bytes)
    assert program is not None
    found = solve_program(program, 20.0)
    assert found is not None
    assert double_names(model, program, found.chosen) == (("A", "A@recompute"), {"a": "C1", "a@recompute": "D"})
    for budget in (409, 400, 310, 300):
        assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


def test_a_warm_start_from_a_one_drop_answer_is_taken() -> None:
    graph = twice_read()
    model = build_model(graph)
    program = double_program(model, 410 - model.static_bytes)
    warm = option_of(model, ["B"], {"b": "D"})
    assert program is not None and warm is not None
    found = solve_program(program, 20.0, warm)
    assert found is not None and found.status == "optimal" and double_names(model, program, found.chosen)[0] == (
        "A", "A@recompute")


def test_a_built_program_keeps_none_of_its_build_caches() -> None:
    """Only the build reads ``aux``'s, ``_later``'s, the early uses' and ``_double_cols``'
    caches: the program drops them once built (they were most of RL250's program)."""
    graph = twice_read()
    model = build_model(graph)
    program = double_program(model, 410 - model.static_bytes)
    assert program is not None and program.aux_bounds and any(program.doubles)  # the caches were filled
    assert not (program._aux_cache or program._aux_seen or program._later_cache or program._early_last
                or program._double_cache)
    found = solve_program(program, 20.0)
    assert found is not None and double_names(model, program, found.chosen)[0] == ("A", "A@recompute")


def combos(graph: Graph) -> int:
    return len(list(itertools.islice(itertools.product(*family(graph)), MAX_COMBOS + 1)))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gapped_graphs(), st.floats(0.7, 0.99))
def test_the_milp_equals_brute_force_over_cuts_and_double_drops(graph: Graph, fraction: float) -> None:
    if combos(graph) > MAX_COMBOS:  # past what the brute force enumerates in seconds
        return
    budget = int(fraction * peak(graph))
    assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_dags(), st.floats(0.7, 0.99))
def test_the_milp_equals_brute_force_on_dags_with_chains_and_multi_output_ops(graph: Graph,
                                                                             fraction: float) -> None:
    if combos(graph) > MAX_COMBOS:
        return
    budget = int(fraction * peak(graph))
    assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


def read_from_kept(sizes: dict[str, int] | None = None) -> Graph:
    """``twice_read`` with ``A`` reading ``w`` (50 bytes, made by ``W``, read by nothing else)
    and the first stretch lighter (``big1`` 250 bytes), or the tensor sizes ``sizes``: each
    recompute of ``A`` reads ``w`` again, so a double drop keeps ``w`` through the heavy
    second stretch to ``D``."""
    base = twice_read()
    nbytes = {"w": 50, "big1": 250, **(sizes or {})}
    tensors = tuple(dataclasses.replace(t, nbytes=nbytes.get(t.name, t.nbytes))
                    for t in (base.tensors[0], Tensor("w", 0), *base.tensors[1:]))
    ops = (Op("W", "f", ("x",), ("w",), 1.0), Op("A", "f", ("w",), ("a",), 1.0), *base.ops[1:])
    return Graph("read_from_kept", tensors, ops, ("d",)).validate()


def test_a_double_drop_keeps_its_inputs_until_its_second_recompute() -> None:
    graph = read_from_kept()
    assert peak(apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D")], (), {}))) == 460
    assert least_family_cost(graph, 460) == 2.0 and least_family_cost(graph, 459) == 5.0
    for budget in (460, 459, 450, 410, 400):
        assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({t: st.integers(1, 400) for t in ("w", "a", "b", "big1", "q1", "big2", "q2", "d")}),
       st.floats(0.6, 1.0))
def test_the_milp_equals_brute_force_on_double_drops_reading_kept_inputs(sizes: dict[str, int],
                                                                         fraction: float) -> None:
    """``read_from_kept`` with random sizes: the second recompute's own step (its inputs and
    its output live) or the stretches its input is kept across can hold the peak."""
    graph = read_from_kept(sizes)
    budget = int(fraction * peak(graph))
    assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


def test_the_second_copy_counts_at_its_own_recompute() -> None:
    """Rule: the second copy is live at ``R2``'s own step.  ``read_from_kept`` with ``a``
    300 bytes and a light second stretch (``big2`` 150, ``q2`` 100): the double drop of
    ``A`` peaks at 559 at ``A@recompute@recompute``, where the new ``a`` meets ``w`` (read
    again), ``b``, ``q2`` and ``c1``; at 558 nothing in the family fits, and a model that
    left the copy out of that step would call the double drop (cost 2) a fit."""
    graph = read_from_kept({"a": 300, "big2": 150, "q2": 100})
    twice = apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D")], (), {}))
    profile = sim.order_profile(twice, range(len(twice.ops)))
    assert peak(twice) == 559 and twice.ops[profile.index(max(profile))].name == "A@recompute@recompute"
    assert least_family_cost(graph, 559) == 2.0 and least_family_cost(graph, 558) is None
    for budget in (559, 558):
        assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


def two_read_across_two_stretches(name: str, sizes: dict[str, int], a_reads: tuple[str, ...],
                                   b_reads: tuple[str, ...]) -> Graph:
    """``a`` (made by ``A`` from ``a_reads``) and ``b`` (by ``B`` from ``b_reads``) both read by
    ``C0``, ``C1`` and ``D`` across two heavy stretches (``P1``/``Q1``, ``P2``/``Q2``); ``w1`` and
    ``w2`` made from ``x``; ``sizes`` gives every tensor's bytes but ``x``'s (8) and the chain's (1)."""
    act, n = Tensor, sizes
    tensors = (Tensor("x", 8, Kind.INPUT), act("w1", n["w1"]), act("w2", n["w2"]), act("a", n["a"]), act("b", n["b"]),
               act("c0", 1), act("big1", n["big1"]), act("q1", n["q1"]), act("c1", 1), act("big2", n["big2"]),
               act("q2", n["q2"]), Tensor("d", n["d"], Kind.OUTPUT))
    ops = (Op("W1", "f", ("x",), ("w1",), 1.0), Op("W2", "f", ("x",), ("w2",), 1.0),
           Op("A", "f", a_reads, ("a",), 1.0), Op("B", "f", b_reads, ("b",), 1.0),
           Op("C0", "f", ("a", "b"), ("c0",), 1.0), Op("P1", "f", ("x",), ("big1",), 1.0),
           Op("Q1", "f", ("big1",), ("q1",), 1.0), Op("C1", "f", ("a", "b", "q1", "c0"), ("c1",), 1.0),
           Op("P2", "f", ("x",), ("big2",), 1.0), Op("Q2", "f", ("big2",), ("q2",), 1.0),
           Op("D", "f", ("a", "b", "q2", "c1"), ("d",), 1.0))
    return Graph(name, tensors, ops, ("d",)).validate()


def read_before_a_tail() -> Graph:
    """``twice_read`` with a tail after ``D``, the last reader of ``a``: ``P3`` makes ``big3``
    (350 bytes) and ``E`` reads it and ``d``."""
    base = twice_read()
    tensors = (*base.tensors[:-1], Tensor("d", 1), Tensor("big3", 350), Tensor("e", 1, Kind.OUTPUT))
    ops = (*base.ops, Op("P3", "f", ("x",), ("big3",), 1.0), Op("E", "f", ("big3", "d"), ("e",), 1.0))
    return Graph("read_before_a_tail", tensors, ops, ("e",)).validate()


def test_the_second_copy_dies_after_its_last_reader() -> None:
    """Rule: the second copy is live up to its tensor's last use (``p <= model.last[j]`` in
    ``DoubleProgram._versions``), not to the end.  ``A`` dropped twice fits 410 (cost 2), the tail
    holding 352 bytes (``big3``, ``d``, ``e``); a model that kept the copy (100 bytes) live past ``D``
    counts it there too, calls the double drop a misfit and settles for ``B`` recomputed (cost 5).
    No other test failed with that bound removed."""
    graph = read_before_a_tail()
    twice = apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D")], (), {}))
    profile = sim.order_profile(twice, range(len(twice.ops)))
    assert peak(twice) == 410 and max(profile[-2:]) == 352
    assert least_family_cost(graph, 410) == 2.0
    for budget in (410, 409):
        assert milp2_cost(graph, budget) == least_family_cost(graph, budget)


def read_from_two_kept() -> Graph:
    """``a`` (200 bytes, from ``w1``, 10) and ``b`` (200, from ``w2``, 150) both read by ``C0``,
    ``C1`` and ``D`` across two heavy stretches, ``q2`` 100 bytes: with both dropped twice,
    ``A``'s and then ``B``'s second recompute run before ``D``."""
    sizes = {"w1": 10, "w2": 150, "a": 200, "b": 200, "big1": 350, "q1": 1, "big2": 300, "q2": 100, "d": 1}
    return two_read_across_two_stretches("read_from_two_kept", sizes, ("w1",), ("w2",))


def test_second_recomputes_before_one_op_run_in_order() -> None:
    """Rule: second recomputes before one op run in ``(b1, i)`` order, each seeing the ones
    before it as run.  Both tensors dropped twice peak at 659 at ``B``'s second recompute,
    where ``A``'s new copy (200) is already live and ``w2`` (150) is read again; ``w1`` is
    gone.  A model that ran them in the other order, or let neither see the other, puts
    ``w1`` (10) there in place of ``a`` and calls the pair (cost 4) a fit at 610, where
    nothing in the family fits."""
    graph = read_from_two_kept()
    both = apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D"), Drop("B", "b", "C1", "D")], (), {}))
    profile = sim.order_profile(both, range(len(both.ops)))
    assert [op.name for op in both.ops[12:14]] == ["A@recompute@recompute", "B@recompute@recompute"]
    assert peak(both) == 659 and both.ops[profile.index(max(profile))].name == "B@recompute@recompute"
    assert least_family_cost(graph, 620) == 2.0 and least_family_cost(graph, 610, links=False) is None
    for budget in (659, 620, 610):
        assert milp2_cost(graph, budget, links=False) == least_family_cost(graph, budget, links=False)
    assert milp2_cost(graph, 610) == least_family_cost(graph, 610) == 4.0  # chain links fit it otherwise


def cut_apart() -> Graph:
    """Three heavy stretches: ``a`` (200 bytes, from ``w1``, 150) read by ``C0``, ``C2`` and
    ``D``, ``b`` (200, from ``w2``, 10) by ``C0``, ``C1`` and ``D``, ``q3`` 100 bytes: dropped
    twice, ``b`` is cut first (at ``C1``), ``a`` at ``C2``, both again at ``D``."""
    act = Tensor
    tensors = (Tensor("x", 8, Kind.INPUT), act("w1", 150), act("w2", 10), act("a", 200), act("b", 200), act("c0", 1),
               act("big1", 400), act("q1", 1), act("c1", 1), act("big2", 400), act("q2", 1), act("c2", 1),
               act("big3", 300), act("q3", 100), Tensor("d", 1, Kind.OUTPUT))
    ops = (Op("W1", "f", ("x",), ("w1",), 1.0), Op("W2", "f", ("x",), ("w2",), 1.0),
           Op("A", "f", ("w1",), ("a",), 1.0), Op("B", "f", ("w2",), ("b",), 1.0),
           Op("C0", "f", ("a", "b"), ("c0",), 1.0), Op("P1", "f", ("x",), ("big1",), 1.0),
           Op("Q1", "f", ("big1",), ("q1",), 1.0), Op("C1", "f", ("b", "q1", "c0"), ("c1",), 1.0),
           Op("P2", "f", ("x",), ("big2",), 1.0), Op("Q2", "f", ("big2",), ("q2",), 1.0),
           Op("C2", "f", ("a", "q2", "c1"), ("c2",), 1.0), Op("P3", "f", ("x",), ("big3",), 1.0),
           Op("Q3", "f", ("big3",), ("q3",), 1.0), Op("D", "f", ("a", "b", "q3", "c2"), ("d",), 1.0))
    return Graph("cut_apart", tensors, ops, ("d",)).validate()


def test_second_recomputes_before_one_op_run_in_the_order_of_their_first_cuts() -> None:
    """Rule: the ``(b1, i)`` order puts ``b1`` first.  ``B``'s second recompute (first cut
    at ``C1``) runs before ``A``'s (at ``C2``) though ``A`` comes first; both dropped twice
    peak at 659 at ``A``'s, where ``b``'s new copy is live and ``w1`` (150) read again.  A
    model ordering them by candidate alone counts ``w2`` (10) there in place of ``b`` and
    calls the pair (cost 4) a fit at 610, where nothing in the family without chain links
    fits."""
    graph = cut_apart()
    both = apply_recompute(graph, *joint_names([Drop("A", "a", "C2", "D"), Drop("B", "b", "C1", "D")], (), {}))
    profile = sim.order_profile(both, range(len(both.ops)))
    assert [op.name for op in both.ops[15:17]] == ["B@recompute@recompute", "A@recompute@recompute"]
    assert peak(both) == 659 and both.ops[profile.index(max(profile))].name == "A@recompute@recompute"
    assert least_family_cost(graph, 620) == 2.0 and least_family_cost(graph, 610, links=False) is None
    for budget in (620, 610):
        assert milp2_cost(graph, budget, links=False) == least_family_cost(graph, budget, links=False)


def sharing_an_input() -> Graph:
    """``A`` and ``B`` both read ``w2`` (83 bytes) and are read by ``C0``, ``C1`` and ``D``
    across two heavy stretches (found by a random search against the brute force)."""
    sizes = {"w1": 68, "w2": 83, "a": 56, "b": 150, "big1": 330, "q1": 24, "big2": 322, "q2": 51, "d": 22}
    return two_read_across_two_stretches("sharing_an_input", sizes, ("x", "w2"), ("w2", "x"))


def test_an_input_read_by_two_second_recomputes_counts_once() -> None:
    """Both ``A`` and ``B`` dropped twice keep ``w2`` once, to ``B``'s second recompute:
    peak 465 (at ``Q2``: ``w2``, ``big2``, ``q2``, ``c1``), cost 4.  ``DoubleProgram._versions``
    bounds ``w2``'s "a second recompute still to come" once per reader; one sum over both
    candidates' double columns counted 2 * 83 bytes (or needed an auxiliary at least 2), and the
    MILP found nothing under 520."""
    graph = sharing_an_input()
    both = apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D"), Drop("B", "b", "C1", "D")], (), {}))
    assert peak(both) == 465 and least_family_cost(graph, 465) == 4.0
    assert milp2_cost(graph, 465) == 4.0


def resized(graph: Graph, sizes: dict[str, int]) -> Graph:
    """``graph`` with the tensors named in ``sizes`` of those sizes."""
    tensors = tuple(dataclasses.replace(t, nbytes=sizes.get(t.name, t.nbytes)) for t in graph.tensors)
    return Graph(graph.name, tensors, graph.ops, graph.outputs).validate()


def test_the_second_copy_counts_at_the_op_that_reads_it() -> None:
    """Rule: the second copy is live at ``b2`` itself, the op its recompute runs before.
    ``twice_read`` with ``d`` 400 bytes peaks at 610 at ``D`` (``a``, ``b``, ``q2``, ``c1``
    and ``d``), with or without ``A`` dropped twice: nothing fits 609.  A model that counted
    the second copy only after ``D`` calls the double drop (cost 2) a fit at 609."""
    graph = resized(twice_read(), {"d": 400})
    twice = apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D")], (), {}))
    profile = sim.order_profile(twice, range(len(twice.ops)))
    assert peak(graph) == peak(twice) == 610 and twice.ops[profile.index(max(profile))].name == "D"
    assert least_family_cost(graph, 609) is None
    assert milp2_cost(graph, 609) is None


def test_the_first_copy_counts_at_its_last_reader() -> None:
    """Rule: the first copy dies after ``a2``, not at it.  ``twice_read`` with ``q1`` 50,
    ``c1`` 400 and ``big2`` 10 bytes peaks at 659 at ``C1`` (``a``, ``b``, ``c0``, ``q1`` and
    ``c1``), with or without ``A`` dropped twice at ``C1`` and ``D`` (where ``C1`` is ``a2``
    too); at 658 only ``B`` recomputed (5) fits.  A model that let the first copy die at
    ``a2`` calls the double drop (cost 2) a fit at 658."""
    graph = resized(twice_read(), {"q1": 50, "c1": 400, "big2": 10})
    twice = apply_recompute(graph, *joint_names([Drop("A", "a", "C1", "D")], (), {}))
    profile = sim.order_profile(twice, range(len(twice.ops)))
    assert peak(graph) == peak(twice) == 659 and twice.ops[profile.index(max(profile))].name == "C1"
    assert least_family_cost(graph, 658) == 5.0
    assert milp2_cost(graph, 658) == 5.0


def shared_producer() -> Graph:
    """``w0`` (190 bytes, ``W0``: cost 2) read by ``A0``, ``A1`` and ``C2``; ``a1`` (222, ``A1``:
    cost 1) read across four stretches (found by a random search with the producer rule broken)."""
    act = Tensor
    sizes = {"w0": 190, "a0": 41, "a1": 222, "big0": 128, "q0": 38, "c0": 16, "big1": 268, "q1": 67, "c1": 11,
             "big2": 208, "q2": 11, "c2": 29, "big3": 100, "q3": 69, "c3": 17}
    tensors = (Tensor("x", 8, Kind.INPUT), *(act(name, size) for name, size in sizes.items()),
               Tensor("out", 24, Kind.OUTPUT))
    ops = (Op("W0", "f", ("x",), ("w0",), 2.0), Op("A0", "f", ("w0",), ("a0",), 2.0),
           Op("A1", "f", ("w0",), ("a1",), 1.0),
           Op("P0", "dropout", ("x",), ("big0",), 1.0), Op("Q0", "dropout", ("big0",), ("q0",), 1.0),
           Op("C0", "dropout", ("a0", "a1", "q0"), ("c0",), 1.0),
           Op("P1", "dropout", ("x",), ("big1",), 1.0), Op("Q1", "dropout", ("big1",), ("q1",), 1.0),
           Op("C1", "dropout", ("a0", "a1", "q1", "c0"), ("c1",), 1.0),
           Op("P2", "dropout", ("x",), ("big2",), 1.0), Op("Q2", "dropout", ("big2",), ("q2",), 1.0),
           Op("C2", "dropout", ("a0", "a1", "w0", "q2", "c1"), ("c2",), 1.0),
           Op("P3", "dropout", ("x",), ("big3",), 1.0), Op("Q3", "dropout", ("big3",), ("q3",), 1.0),
           Op("C3", "dropout", ("a1", "q3", "c2"), ("c3",), 1.0),
           Op("OUT", "dropout", ("a0", "a1", "c3"), ("out",), 1.0))
    return Graph("shared_producer", tensors, ops, ("out",)).validate()


def test_a_double_drop_leaves_the_producers_of_its_inputs_alone() -> None:
    """Rule: a double option excludes recomputing the candidates that make its inputs.  At 580
    bytes nothing in the family fits; ``A1`` dropped twice (at ``C1`` and ``C2``) with ``W0``
    recomputed (cut at ``C2``, cost 4) fits, but its second recompute reads a recomputed input,
    a chain outside the model.  Without the producer rows the MILP returns that pair."""
    graph = shared_producer()
    pair = apply_recompute(graph, *joint_names([Drop("A1", "a1", "C1", "C2")], ("W0",), {"w0": "C2"}))
    assert milp2_cost(graph, 580) is None
    assert peak(pair) <= 580 and least_family_cost(graph, 580) is None


def consumed_twice() -> Graph:
    """``w0`` (156 bytes, ``W0``) read by ``W1``, ``A1`` and ``C2``, its consumers ``W1`` and ``A1``
    candidates too (found by a random search with the consumer rule broken)."""
    act = Tensor
    sizes = {"w0": 156, "w1": 158, "a0": 109, "a1": 86, "big0": 101, "q0": 22, "c0": 14, "big1": 256, "q1": 90,
             "c1": 26, "big2": 254, "q2": 43, "c2": 3, "big3": 101, "q3": 8, "c3": 18}
    tensors = (Tensor("x", 8, Kind.INPUT), *(act(name, size) for name, size in sizes.items()),
               Tensor("out", 18, Kind.OUTPUT))
    ops = (Op("W0", "f", ("x",), ("w0",), 3.0), Op("W1", "f", ("x", "w0"), ("w1",), 2.0),
           Op("A0", "f", ("w1",), ("a0",), 1.0), Op("A1", "f", ("w0", "a0"), ("a1",), 3.0),
           Op("P0", "dropout", ("x",), ("big0",), 1.0), Op("Q0", "dropout", ("big0",), ("q0",), 1.0),
           Op("C0", "dropout", ("a1", "a0", "w1", "q0"), ("c0",), 1.0),
           Op("P1", "dropout", ("x",), ("big1",), 1.0), Op("Q1", "dropout", ("big1",), ("q1",), 1.0),
           Op("C1", "dropout", ("a0", "q1", "c0"), ("c1",), 1.0),
           Op("P2", "dropout", ("x",), ("big2",), 1.0), Op("Q2", "dropout", ("big2",), ("q2",), 1.0),
           Op("C2", "dropout", ("a0", "w0", "q2", "c1"), ("c2",), 1.0),
           Op("P3", "dropout", ("x",), ("big3",), 1.0), Op("Q3", "dropout", ("big3",), ("q3",), 1.0),
           Op("C3", "dropout", ("a1", "q3", "c2"), ("c3",), 1.0), Op("OUT", "dropout", ("a1", "c3"), ("out",), 1.0))
    return Graph("consumed_twice", tensors, ops, ("out",)).validate()


def test_a_double_drop_leaves_its_candidate_consumers_alone() -> None:
    """Rule: a double option excludes recomputing its candidate consumers.  At 516 bytes
    nothing in the family fits; ``W0`` dropped twice (at ``A1`` and ``C2``) with its consumers
    ``W1`` and ``A1`` recomputed peaks at 539 (the recomputes read copies the model does not
    track).  Without the consumer rows the MILP calls that choice a fit at 516."""
    graph = consumed_twice()
    chain = apply_recompute(graph, *joint_names([Drop("W0", "w0", "A1", "C2")], ("W1", "A1"),
                                                {"w1": "C0", "a1": "C3"}))
    assert milp2_cost(graph, 516) is None
    assert peak(chain) == 539 and least_family_cost(graph, 516) is None


def after_the_first_round() -> Graph:
    """``a0`` (165 bytes) and ``a1`` (181) read by ``C0``, ``C1`` and ``OUT`` around two stretches,
    ``W0`` writing two outputs (found by a random search with the rule below broken)."""
    act = Tensor
    sizes = {"w0": 154, "v0": 78, "a0": 165, "a1": 181, "big0": 83, "q0": 7, "c0": 9, "big1": 313, "q1": 12, "c1": 13}
    tensors = (Tensor("x", 8, Kind.INPUT), *(act(name, size) for name, size in sizes.items()),
               Tensor("out", 12, Kind.OUTPUT))
    ops = (Op("W0", "f", ("x",), ("w0", "v0"), 3.0), Op("A0", "f", ("w0",), ("a0",), 1.0),
           Op("A1", "f", ("v0", "x"), ("a1",), 2.0),
           Op("P0", "dropout", ("x",), ("big0",), 1.0), Op("Q0", "dropout", ("big0",), ("q0",), 1.0),
           Op("C0", "f", ("a0", "a1", "q0"), ("c0",), 1.0),
           Op("P1", "dropout", ("x",), ("big1",), 1.0), Op("Q1", "dropout", ("big1",), ("q1",), 1.0),
           Op("C1", "dropout", ("a0", "a1", "w0", "q1", "c0"), ("c1",), 1.0),
           Op("OUT", "dropout", ("a0", "a1", "c1"), ("out",), 1.0))
    return Graph("after_the_first_round", tensors, ops, ("out",)).validate()


def test_a_second_recompute_runs_after_the_first_round_recomputes_before_its_op() -> None:
    """Rule: ``R2`` runs after every first-round recompute placed before ``b2``.  ``A0`` dropped
    twice (at ``C0`` and ``C1``) with ``A1`` recomputed at ``C1`` (cost 4) fits 602: at
    ``A1@recompute`` the second ``a0`` is not made yet.  A model that ran ``R2`` first counts
    it there and finds nothing at 602."""
    graph = after_the_first_round()
    names, cuts = joint_names([Drop("A0", "a0", "C0", "C1")], ("A1",), {"a1": "C1"})
    rewritten = apply_recompute(graph, names, cuts)
    assert [op.name for op in rewritten.ops[9:12]] == ["A1@recompute", "A0@recompute@recompute", "C1"]
    assert peak(rewritten) == 602 and least_family_cost(graph, 602) == 4.0
    assert milp2_cost(graph, 602) == 4.0

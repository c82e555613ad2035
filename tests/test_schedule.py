"""schedule: every method gives a valid order; exact is optimal; auto is never worse than a heuristic.

Oracles: ``brute_force_load`` tries every topological order of graphs of up to 8
ops; ``mpplan.sim.order_load`` scores every order, so the schedulers' own scoring
(``_Memory``, the local search's incremental profile) is checked against it too.
"""

from __future__ import annotations

import dataclasses
import doctest
import random
from collections import Counter
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import graphs, layered_graph, random_order

from mpplan.capture.synthetic import synthetic_graph
from mpplan.errors import ConfigError
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.liveness import check_order, live_ranges
from mpplan.passes import schedule as schedule_module
from mpplan.passes.schedule import SCHEDULERS, SearchLimitError, schedule
from mpplan.passes.schedule import heuristics, searching
from mpplan.passes.schedule.climber import Budget, Climber
from mpplan.passes.schedule.frontiers import exact_search
from mpplan.passes.schedule.given import keeps_given_order, queue_keeps_given_order
from mpplan.passes.schedule import memory as memory_module
from mpplan.passes.schedule.memory import Memory
from mpplan.sim import live_profile, order_load
from mpplan.topo import topological_order

HEURISTICS = ("as_given", "longest_path", "greedy_free", "least_peak", "dfs", "bfs")


def brute_force_load(graph: Graph) -> int:
    """The least LOAD over every topological order, enumerated one by one.

    Written apart from the schedulers: a storage is allocated when its first toucher
    runs and freed after its last one unless it is a graph output.  Branches that
    cannot beat the best order found so far are cut, which changes no result.
    """
    topo = graph.topology
    n = topo.num_ops
    storages = [[s for s in ids if not topo.is_static[s]] for ids in topo.op_storages]
    touches = Counter(s for ids in storages for s in ids)
    seen: Counter = Counter()
    best = [sum(topo.nbytes[s] for s in touches) + 1]

    def visit(done: set[int], live: int, peak: int) -> None:
        if peak >= best[0]:
            return
        if len(done) == n:
            best[0] = peak
            return
        for k in range(n):
            if k in done or not done.issuperset(topo.preds[k]):
                continue
            step = live + sum(topo.nbytes[s] for s in storages[k] if not seen[s])
            seen.update(storages[k])
            freed = sum(topo.nbytes[s] for s in storages[k] if seen[s] == touches[s] and s not in topo.output_storages)
            visit(done | {k}, step - freed, max(peak, step))
            seen.subtract(storages[k])

    visit(set(), 0, 0)
    return best[0] if n else 0


def loads(graph: Graph) -> dict[str, int]:
    result = {}
    for name, method in SCHEDULERS.items():
        order = method(graph)
        check_order(graph, order)
        result[name] = order_load(graph, order)
    return result


# --- properties on random graphs ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(graphs(max_ops=8))
def test_exact_equals_brute_force_and_no_method_beats_it(graph: Graph) -> None:
    best = brute_force_load(graph)
    got = loads(graph)
    assert got["exact"] == best
    assert all(load >= best for load in got.values()), got


@settings(max_examples=300, deadline=None)
@given(graphs(max_ops=12))
def test_auto_equals_exact_and_beats_every_heuristic(graph: Graph) -> None:
    got = loads(graph)
    assert got["auto"] == got["exact"], got
    assert all(got["auto"] <= got[name] for name in HEURISTICS), got


@settings(max_examples=60, deadline=None)
@given(graphs(max_ops=30, min_ops=13))
def test_auto_never_worse_than_a_heuristic_on_larger_graphs(graph: Graph) -> None:
    auto = schedule(graph, "auto")
    check_order(graph, auto)
    assert all(order_load(graph, auto) <= order_load(graph, schedule(graph, name)) for name in HEURISTICS)


@settings(max_examples=100, deadline=None)
@given(graphs(max_ops=30), st.randoms(use_true_random=False))
def test_memory_model_scores_like_the_simulator(graph: Graph, rng: random.Random) -> None:
    mem = Memory.of(graph)
    order = tuple(random_order(graph, rng))
    assert mem.profile(order) == live_profile(live_ranges(graph, order).ranges, len(order))
    assert mem.load(order) == order_load(graph, order)


@settings(max_examples=100, deadline=None)
@given(graphs(max_ops=30, min_ops=0, max_bytes=2**40), st.randoms(use_true_random=False))
def test_profiles_by_columns_are_the_simulator_profiles(graph: Graph, rng: random.Random) -> None:
    """``Memory.profiles`` (numpy columns for whole orders) equals the simulator on each order."""
    mem = Memory.of(graph)
    orders = [tuple(random_order(graph, rng)) for _ in range(3)]
    expected = [live_profile(live_ranges(graph, order).ranges, len(order)) for order in orders]
    assert mem.profiles(orders) == expected
    assert all(type(step) is int for profile in mem.profiles(orders) for step in profile)


@settings(max_examples=100, deadline=None)
@given(graphs(max_ops=12, min_ops=1, max_bytes=2**20), st.data())
def test_profiles_of_orders_that_repeat_or_skip_ops_are_the_step_by_step_profiles(graph: Graph,
                                                                                 data: st.DataObject) -> None:
    """Orders that run some op twice, or an op out of range, are no permutation: ``profiles``
    gives what ``profile`` gives for them (the columns would read steps never written)."""
    mem = Memory.of(graph)
    n = mem.num_ops
    order = data.draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
    if len(set(order)) == n:
        order[0] = order[-1] if n > 1 else order[0]
    orders = [tuple(order), tuple(range(n))]
    assert mem.profiles(orders) == [mem.profile(o) for o in orders]


@settings(max_examples=200, deadline=None)
@given(graphs(max_ops=30, min_ops=0, max_bytes=2**40))
def test_memory_model_by_arrays_is_the_one_by_loops(graph: Graph) -> None:
    """The numpy construction of the memory model (``of``'s fast path) equals the loop, field by field."""
    assert Memory.by_arrays(graph) == Memory.by_loops(graph)


def test_memory_model_of_sums_huge_sizes_by_loops() -> None:
    """Sizes whose sums could overflow int64 take the loop, exact in Python ints."""
    huge = 2**70
    graph = Graph(
        "huge",
        (Tensor("x", 8, Kind.INPUT), Tensor("a", huge), Tensor("b", huge)),
        (Op("A", "f", ("x",), ("a",)), Op("B", "f", ("a",), ("b",))),
        outputs=("b",),
    )
    mem = Memory.of(graph)
    assert mem == Memory.by_loops(graph)
    assert mem.start_allocated == (huge, 2 * huge) and mem.load((0, 1)) == 2 * huge
    assert mem.profiles([(0, 1), (0,)]) == [[huge, 2 * huge], [huge]]  # by loops: past int64, and a prefix


def list_schedule_by_rescoring(mem: Memory, peak_first: bool) -> tuple[int, ...]:
    """The greedy list schedulers' definition, scored from scratch at every step (quadratic).

    Each step runs the ready op of least key: ``greedy_free`` (net, id), ``least_peak``
    (allocated, net, id), where an op allocates its storages that no op has touched yet
    and frees those (not outputs) whose only unrun touches are its own single one.
    """
    n = mem.num_ops
    done = [False] * n
    started: set[int] = set()
    order: list[int] = []

    def key(t: int) -> tuple[int, ...]:
        allocated = sum(mem.nbytes[s] for s in mem.storages[t] if s not in started)
        freed = sum(mem.nbytes[s] for s in mem.storages[t]
                    if not mem.to_end[s] and [u for u in mem.touchers[s] if not done[u]] == [t])
        net = allocated - freed
        return (allocated, net, t) if peak_first else (net, t)

    while len(order) < n:
        ready = [k for k in range(n) if not done[k] and all(done[p] for p in mem.preds[k])]
        k = min(ready, key=key)
        done[k] = True
        order.append(k)
        started.update(mem.storages[k])
    return tuple(order)


@settings(max_examples=300, deadline=None)
@given(graphs(max_ops=25, min_ops=0))
def test_list_schedulers_equal_their_definition_rescored_each_step(graph: Graph) -> None:
    """The heap-based schedulers (lazy entries, re-pushed only when an op's key changes) pick
    the same op at every step as a scan that rescores every ready op."""
    mem = Memory.of(graph)
    assert schedule(graph, "greedy_free") == list_schedule_by_rescoring(mem, peak_first=False)
    assert schedule(graph, "least_peak") == list_schedule_by_rescoring(mem, peak_first=True)


@settings(max_examples=100, deadline=None)
@given(graphs(max_ops=30, min_ops=2), st.randoms(use_true_random=False))
def test_local_search_moves_keep_the_profile_exact(graph: Graph, rng: random.Random) -> None:
    """Incremental scoring (single-op moves, exact segment reorders, undo) agrees with the simulator."""
    mem = Memory.of(graph)
    climber = Climber(mem, tuple(random_order(graph, rng)))
    n = len(climber.order)
    undo = []
    for _ in range(20):
        if rng.random() < 0.2:
            lo = rng.randrange(n)
            move = climber.reorder(
                lo, min(n - 1, lo + rng.randrange(1, 8)), Budget(10**9, float("inf"))
            )
            if move is None:
                continue
        else:
            k = rng.randrange(n)
            lo, hi = climber.window(k)
            j = rng.randint(lo, hi)
            if j == climber.pos[k]:
                continue
            move = climber.evaluate(k, j)
        undo.append(climber.apply(move))
        check_order(graph, climber.order)
        profile = live_profile(live_ranges(graph, climber.order).ranges, n)
        assert climber.profile == profile
        assert move.score[:2] == climber.score[:2] == (max(profile), profile.count(max(profile)))
    for move in reversed(undo):
        climber.apply(move)
    assert climber.profile == live_profile(live_ranges(graph, climber.order).ranges, n)


@settings(max_examples=30, deadline=None)
@given(graphs(max_ops=30), st.integers(0, 3))
def test_auto_is_deterministic_for_a_seed(graph: Graph, seed: int) -> None:
    assert schedule(graph, seed=seed) == schedule(graph, seed=seed)


# --- named cases --------------------------------------------------------------------------------------


def _graph(name: str, sizes: dict[str, int], ops: list[tuple[str, tuple[str, ...], tuple[str, ...]]], outputs) -> Graph:
    tensors = [Tensor("x", 8, Kind.INPUT)] + [Tensor(t, b) for t, b in sizes.items()]
    return Graph(name, tuple(tensors), tuple(Op(o, "f", i, out) for o, i, out in ops), tuple(outputs)).validate()


def names(graph: Graph, order) -> list[str]:
    return [graph.ops[k].name for k in order]


def test_blob_read_by_several_ops_is_freed_only_after_its_last_reader() -> None:
    # B reads 'a' but C still needs it: running B frees nothing, D frees 'd'.
    g = _graph(
        "multi_reader",
        {"a": 100, "d": 60, "b": 1, "c": 1, "e": 1},
        [
            ("A", ("x",), ("a",)),
            ("M", ("x",), ("d",)),
            ("B", ("a",), ("b",)),
            ("D", ("d",), ("e",)),
            ("C", ("a", "b"), ("c",)),
        ],
        ("c", "e"),
    )
    order = names(g, schedule(g, "greedy_free"))
    assert order.index("D") < order.index("B")
    mem = Memory.of(g)
    given_order = tuple(range(5))  # A M B D C: 'a' lives through C at step 4
    assert mem.profile(given_order) == [100, 160, 161, 162, 103]
    assert mem.profile(given_order) == live_profile(live_ranges(g, given_order).ranges, 5)


def test_in_place_chain_keeps_one_buffer() -> None:
    tensors = (Tensor("x", 8, Kind.INPUT), Tensor("w", 8, Kind.PARAM), Tensor("h", 64), Tensor("hv", 0, alias_of="h"))
    ops = (
        Op("fc", "linear", ("x", "w"), ("h",)),
        Op("relu_", "relu", ("h",), ("h",)),
        Op("view", "view", ("h",), ("hv",)),
        Op("mul_", "mul", ("hv", "w"), ("hv",)),
        Op("add_", "add", ("h", "x"), ("h",)),
    )
    g = Graph("in_place", tensors, ops, ("h",)).validate()
    for name, load in loads(g).items():
        assert load == 64, name
    for name in SCHEDULERS:
        assert schedule(g, name) == (0, 1, 2, 3, 4), name  # the versions force the order


def test_in_place_write_waits_for_readers_of_the_old_version() -> None:
    # 'r' reads h before the in-place update; every method must keep it before 'inc_'.
    g = _graph(
        "war",
        {"h": 50, "r": 5, "y": 5},
        [("mk", ("x",), ("h",)), ("r", ("h",), ("r",)), ("inc_", ("h",), ("h",)), ("y", ("h", "r"), ("y",))],
        ("y",),
    )
    for name in SCHEDULERS:
        order = names(g, schedule(g, name))
        assert order.index("r") < order.index("inc_") < order.index("y"), name


def test_parallel_branches_greedy_free_beats_as_given() -> None:
    # As given, both large branch heads are live together; finishing one branch first halves the peak.
    g = _graph(
        "branches",
        {"a1": 100, "b1": 100, "a2": 1, "b2": 1, "j": 1},
        [
            ("A1", ("x",), ("a1",)),
            ("B1", ("x",), ("b1",)),
            ("A2", ("a1",), ("a2",)),
            ("B2", ("b1",), ("b2",)),
            ("J", ("a2", "b2"), ("j",)),
        ],
        ("j",),
    )
    got = loads(g)
    assert got["as_given"] == 201
    assert got["greedy_free"] == got["exact"] == got["auto"] == 102


def ladder(rungs: int) -> Graph:
    """Memonger's back-and-forth model: blobs pass left and right at every rung."""
    sizes: dict[str, int] = {"l0": 30, "r0": 10}
    ops = [("L0", ("x",), ("l0",)), ("R0", ("x",), ("r0",))]
    for i in range(1, rungs):
        sizes[f"l{i}"] = 30 if i % 2 else 10
        sizes[f"r{i}"] = 10 if i % 2 else 30
        ops.append((f"L{i}", (f"l{i - 1}", f"r{i - 1}"), (f"l{i}",)))
        ops.append((f"R{i}", (f"r{i - 1}", f"l{i - 1}"), (f"r{i}",)))
    sizes["out"] = 1
    ops.append(("out", (f"l{rungs - 1}", f"r{rungs - 1}"), ("out",)))
    return _graph(f"ladder{rungs}", sizes, ops, ("out",))


def test_ladder_model() -> None:
    g = ladder(5)
    got = loads(g)
    assert got["exact"] == brute_force_load(g)
    assert got["auto"] == got["exact"]
    assert all(got["exact"] <= load for load in got.values())


def test_longest_path_runs_the_source_with_the_longer_path_first() -> None:
    g = _graph(
        "two_sources",
        {"s": 4, "l0": 4, "l1": 4, "l2": 4, "j": 4},
        [
            ("short", ("x",), ("s",)),
            ("long0", ("x",), ("l0",)),
            ("long1", ("l0",), ("l1",)),
            ("long2", ("l1",), ("l2",)),
            ("join", ("s", "l2"), ("j",)),
        ],
        ("j",),
    )
    assert names(g, schedule(g, "longest_path")) == ["long0", "long1", "long2", "short", "join"]


@settings(max_examples=300, deadline=None)
@given(graphs(max_ops=25, min_ops=0))
def test_longest_path_orders_the_sources_as_memongers_tree_reads_them(graph: Graph) -> None:
    """The sources ``_by_longest_path`` orders are the tree's leaves, each once; one source is
    its own only leaf, which is why ``_longest_path`` skips the heights then."""
    mem = Memory.of(graph)
    sources = [v for v in range(mem.num_ops) if not mem.preds[v]]
    ordered = heuristics._by_longest_path(mem, sources)
    assert sorted(ordered) == sources
    assert heuristics._longest_path(mem) == heuristics._reverse_postorder(mem, ordered)


def test_longest_path_of_a_one_source_graph_computes_no_heights(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step with one source (the synthetic transformer's) has nothing to order by
    height: the depth-first walk from that source is the whole heuristic.  Each half fails alone:
    the heights are never computed (``_by_longest_path`` refuses), and the order is still the one
    they would give, on a graph whose given order is not that walk's (``branches``: ``c`` runs
    before ``b``), so a shortcut that skipped the walk as well fails there."""
    branches = _graph("branches", {"s": 4, "a": 4, "b": 4, "c": 4, "d": 4, "e": 4},
                      [("src", ("x",), ("s",)), ("A", ("s",), ("a",)), ("B", ("s",), ("b",)),
                       ("C", ("a",), ("c",)), ("D", ("b",), ("d",)), ("E", ("c", "d"), ("e",))], ("e",))
    mems = [Memory.of(synthetic_graph("transformer", layers=2, train=True)), Memory.of(branches)]
    assert [sum(not p for p in mem.preds) for mem in mems] == [1, 1]  # op 0 is the one source
    with_heights = [heuristics._reverse_postorder(mem, heuristics._by_longest_path(mem, [0])) for mem in mems]
    assert names(branches, with_heights[1]) == ["src", "A", "C", "B", "D", "E"]

    def refuse(mem: Memory, sources: list[int]) -> list[int]:
        raise AssertionError("heights computed for one source")

    monkeypatch.setattr(heuristics, "_by_longest_path", refuse)
    assert [heuristics._longest_path(mem) for mem in mems] == with_heights


def test_traversals_break_ties_by_id() -> None:
    g = _graph(
        "fan",
        {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1},
        [
            ("A", ("x",), ("a",)),
            ("B", ("x",), ("b",)),
            ("C", ("a",), ("c",)),
            ("D", ("b",), ("d",)),
            ("E", ("c", "d"), ("e",)),
        ],
        ("e",),
    )
    assert names(g, schedule(g, "bfs")) == ["A", "B", "C", "D", "E"]
    assert names(g, schedule(g, "dfs")) == ["A", "C", "B", "D", "E"]


def test_static_storage_plays_no_part() -> None:
    tensors = (Tensor("w", 1000, Kind.PARAM), Tensor("a", 5), Tensor("b", 7))
    ops = (Op("A", "f", ("w",), ("a",)), Op("B", "f", ("w", "a"), ("b",)))
    g = Graph("static", tensors, ops, ("b",)).validate()
    assert {load for load in loads(g).values()} == {12}


def test_empty_graph() -> None:
    g = Graph("empty", (Tensor("x", 8, Kind.INPUT),), (), ()).validate()
    assert all(schedule(g, name) == () for name in SCHEDULERS)


# --- errors and fallbacks -----------------------------------------------------------------------------


def test_unknown_method_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="expected one of"):
        schedule(ladder(2), "fastest")


def test_exact_past_its_limits_raises_and_auto_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    g = layered_graph(60, width=6)
    with pytest.raises(SearchLimitError):
        exact_search(g, state_limit=5)
    with pytest.raises(SearchLimitError, match="more than"):
        schedule(layered_graph(2500), "exact")
    monkeypatch.setattr(searching, "AUTO_EXACT_SMALL_STATES", 1)
    small = ladder(4)
    order = schedule(small, "auto")
    check_order(small, order)
    assert order_load(small, order) <= min(order_load(small, schedule(small, h)) for h in HEURISTICS)


def test_docstring_example() -> None:
    assert doctest.testmod(schedule_module, raise_on_error=True).attempted > 0


# --- scale ---------------------------------------------------------------------------------------------


def test_auto_schedules_a_100k_op_graph() -> None:
    g = layered_graph(100_000)
    check_order(g, schedule(g, "auto"))


def _checked_walk(mem: Memory, ready: Literal["fifo", "lifo"]) -> bool | None:
    """``queue_keeps_given_order``, held to the topological sort itself wherever it answers."""
    answer = queue_keeps_given_order(mem, ready)
    if answer is not None:
        walked = topological_order(mem.succs, [len(p) for p in mem.preds], ready=ready)
        assert answer == (walked == list(range(mem.num_ops)))
    return answer


def _checked_given(mem: Memory, peak_first: bool) -> bool | None:
    """``keeps_given_order``, held to the rescoring definition wherever it answers."""
    answer = keeps_given_order(mem, peak_first)
    if answer is not None:
        assert answer == (list_schedule_by_rescoring(mem, peak_first) == tuple(range(mem.num_ops)))
    return answer


@settings(max_examples=300, deadline=None)
@given(graphs(max_ops=25, min_ops=0), st.data())
def test_the_given_order_check_agrees_with_the_list_schedulers(graph: Graph, data: st.DataObject) -> None:
    """Wherever ``keeps_given_order`` answers, it answers whether the scheduler (by its quadratic
    definition) runs the given order, and ``queue_keeps_given_order`` whether BFS and DFS do; a
    chain through about three ops in four (each one on the op before it) leaves few rivals, so about
    60% of the examples are answered, both ways (counted on 300 examples)."""
    chained = {k for k in range(1, len(graph.ops)) if data.draw(st.integers(0, 3), label=f"chain {k}")}
    ops = [dataclasses.replace(op, inputs=(*op.inputs, graph.ops[k - 1].outputs[0]))
           if k in chained and graph.ops[k - 1].outputs and graph.ops[k - 1].outputs[0] not in op.inputs else op
           for k, op in enumerate(graph.ops)]
    graph = dataclasses.replace(graph, ops=tuple(ops)).validate()
    mem = Memory.of(graph)
    for peak_first in (False, True):
        _checked_given(mem, peak_first)
    for ready in ("fifo", "lifo"):
        _checked_walk(mem, ready)


def test_the_given_order_check_answers_on_a_transformer_and_skips_the_run() -> None:
    """The synthetic transformer's training step (one choice: ``loss`` or ``loss.backward``) is
    answered by the check, and the schedulers then return the given order without running."""
    graph = synthetic_graph("transformer", layers=2, train=True)
    mem = Memory.of(graph)
    rivals = mem.rivals
    assert rivals is not None and 0 < sum(map(len, rivals.values())) <= 2
    assert _checked_given(mem, False) is True and _checked_given(mem, True) is True
    assert _checked_walk(mem, "fifo") is True and _checked_walk(mem, "lifo") is True


def test_auto_finds_the_rivals_once_for_its_four_given_order_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` runs greedy_free, least_peak, DFS and BFS on one ``Memory``; each asks whether it keeps
    the given order, and the rivals those checks read are found once and kept on the model."""
    graph = synthetic_graph("transformer", layers=2, train=True)
    found: list[tuple[int, ...]] = []

    def counted(ready_from: tuple[int, ...]) -> dict[int, tuple[int, ...]] | None:
        found.append(ready_from)
        return rivals_of(ready_from)

    rivals_of = memory_module._rivals
    monkeypatch.setattr(memory_module, "_rivals", counted)
    order = searching.auto(graph)
    check_order(graph, order)
    assert len(found) == 1
    mem = Memory.of(graph)
    assert mem.rivals is mem.rivals and len(found) == 2


def test_the_given_order_check_says_no_where_a_rival_allocates_less() -> None:
    """Two ops ready at the start: the given first one allocates a big temporary, its rival a
    small one, so greedy_free runs the rival first; the check says so at the first step."""
    g = Graph("g", (
        Tensor("x", 8, Kind.INPUT), Tensor("a", 4), Tensor("big", 64), Tensor("b", 4),
    ), (
        Op("make_big", "f", ("x",), ("big",)),
        Op("first", "f", ("x",), ("a",)),
        Op("second", "f", ("big",), ("b",)),
    ), ("a", "b")).validate()
    mem = Memory.of(g)
    assert mem.rivals == {0: (1,), 1: (2,)}
    assert _checked_given(mem, False) is False
    assert schedule(g, "greedy_free")[0] == 1
    # after make_big, DFS runs what make_big enabled; BFS what was ready before
    assert _checked_walk(mem, "lifo") is False and schedule(g, "dfs") == (0, 2, 1)
    assert _checked_walk(mem, "fifo") is True and schedule(g, "bfs") == (0, 1, 2)


def test_the_given_order_check_says_no_where_bfs_runs_an_older_op() -> None:
    """``b`` (given second) is enabled by ``a``, while ``c`` was ready from the start: BFS runs ``c`` first."""
    g = Graph("g", (Tensor("x", 8, Kind.INPUT), Tensor("a", 4), Tensor("b", 4), Tensor("c", 4)), (
        Op("a", "f", ("x",), ("a",)),
        Op("b", "f", ("a",), ("b",)),
        Op("c", "f", ("x",), ("c",)),
    ), ("b", "c")).validate()
    mem = Memory.of(g)
    assert _checked_walk(mem, "fifo") is False and schedule(g, "bfs") == (0, 2, 1)
    assert _checked_walk(mem, "lifo") is True and schedule(g, "dfs") == (0, 1, 2)


def test_the_given_order_check_counts_what_a_rival_frees() -> None:
    """After ``p``, ``q`` (given next) allocates 16 bytes and ``r`` 32, but ``r`` is the last toucher
    of ``p``'s 64-byte ``h``: freeing it makes ``r`` greedy_free's pick, and the check must see that."""
    g = Graph("g", (
        Tensor("x", 8, Kind.INPUT), Tensor("h", 64), Tensor("g", 1), Tensor("c", 16), Tensor("d", 32),
    ), (
        Op("p", "f", ("x",), ("h", "g")),
        Op("q", "f", ("g",), ("c",)),
        Op("r", "f", ("h",), ("d",)),
    ), ("c", "d")).validate()
    mem = Memory.of(g)
    assert mem.rivals == {1: (2,)}
    assert _checked_given(mem, False) is False
    assert schedule(g, "greedy_free") == (0, 2, 1)

"""Every plan the planner makes passes the verifier; the memonger history's cases by name."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import device
from mpplan import sim
from mpplan.config import Device
from mpplan.graph import Graph, Kind, Op, Tensor
from mpplan.planner import PlannerSettings, plan
from mpplan.verify import verify
from strategies import graphs

SCHEDULES = ("as_given", "longest_path", "greedy_free", "least_peak", "dfs", "bfs", "auto")
ASSIGNERS = ("auto", "greedy_by_size", "best_fit", "shared_greedy", "shared_dp")


@settings(max_examples=400, deadline=None)
@given(
    graph=graphs(max_ops=12),
    schedule=st.sampled_from(SCHEDULES),
    assign=st.sampled_from(ASSIGNERS),
    alignment=st.sampled_from((1, 8, 64)),
    parallel_safe=st.booleans(),
)
def test_every_plan_verifies(graph, schedule, assign, alignment, parallel_safe):
    settings_ = PlannerSettings(schedule=schedule, assign=assign, alignment=alignment, parallel_safe=parallel_safe)
    p = plan(graph, [device()], settings_)
    verify(graph, p)
    dev = p.devices[0]
    assert dev.peak_bytes >= dev.lower_bound_bytes
    if assign == "auto" and alignment == 1 and not parallel_safe:
        assert dev.peak_bytes == dev.lower_bound_bytes, "small instances reach the lower bound"


@settings(max_examples=150, deadline=None)
@given(graph=graphs(max_ops=10), placement=st.sampled_from(("pipeline", "shift", "auto")))
def test_every_multi_device_plan_verifies(graph, placement):
    devices = [Device("g0", 1 << 20), Device("g1", 1 << 20)]
    p = plan(graph, devices, PlannerSettings(placement=placement, alignment=1))
    verify(graph, p)


def planned(graph: Graph, **kwargs) -> tuple[int, int]:
    p = plan(graph, [device()], PlannerSettings(alignment=1, **kwargs))
    verify(graph, p)
    return p.devices[0].arena_bytes, sim.order_load(graph, range(len(graph.ops)))


def test_blob_read_by_several_ops_is_freed_after_its_last_reader():
    t = (Tensor("x", 4, Kind.INPUT), Tensor("a", 100), Tensor("b", 10), Tensor("c", 10), Tensor("d", 100))
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("B", "f", ("a",), ("b",)),
        Op("C", "f", ("a", "b"), ("c",)),
        Op("D", "f", ("c",), ("d",)),
    )
    graph = Graph("multi_reader", t, ops, ("d",)).validate()
    p = plan(graph, [device()], PlannerSettings(schedule="as_given", alignment=1))
    verify(graph, p)
    # a is live through C (its last reader), so it cannot share with c; d may reuse a.
    assert p.buffers["a"].offset != p.buffers["c"].offset or p.buffers["c"].bytes == 0
    assert p.devices[0].arena_bytes == 120


def test_in_place_op_next_to_a_fresh_output_keeps_its_buffer():
    """relu_ writes a in place and add makes a fresh b in the same step; b must not take a's bytes."""
    t = (Tensor("x", 4, Kind.INPUT), Tensor("a", 64), Tensor("b", 64), Tensor("y", 4))
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("R", "relu_", ("a",), ("a",)),
        Op("B", "add", ("a",), ("b",)),
        Op("Y", "f", ("a", "b"), ("y",)),
    )
    graph = Graph("inplace_next", t, ops, ("y",)).validate()
    p = plan(graph, [device()], PlannerSettings(alignment=1))
    verify(graph, p)
    assert p.buffers["a"].offset != p.buffers["b"].offset


def test_parallel_branches_share_only_when_not_parallel_safe():
    t = (Tensor("x", 4, Kind.INPUT), Tensor("a", 100), Tensor("ya", 4), Tensor("b", 100), Tensor("yb", 4))
    ops = (
        Op("A", "f", ("x",), ("a",)),
        Op("A2", "f", ("a",), ("ya",)),
        Op("B", "f", ("x",), ("b",)),
        Op("B2", "f", ("b",), ("yb",)),
    )
    graph = Graph("branches", t, ops, ("ya", "yb")).validate()
    serial = plan(graph, [device()], PlannerSettings(schedule="as_given", alignment=1))
    safe = plan(graph, [device()], PlannerSettings(schedule="as_given", alignment=1, parallel_safe=True))
    verify(graph, serial)
    verify(graph, safe)
    assert serial.devices[0].arena_bytes < safe.devices[0].arena_bytes


def ladder(rungs: int) -> Graph:
    """Memonger's back-and-forth model: a forward chain, then a backward chain reading it in reverse."""
    tensors = [Tensor("x", 4, Kind.INPUT)]
    ops = []
    prev = "x"
    for i in range(rungs):
        tensors.append(Tensor(f"f{i}", 50 + i))
        ops.append(Op(f"F{i}", "f", (prev,), (f"f{i}",)))
        prev = f"f{i}"
    for i in reversed(range(rungs)):
        tensors.append(Tensor(f"g{i}", 30))
        ops.append(Op(f"G{i}", "g", (prev, f"f{i}"), (f"g{i}",), backward_of=f"F{i}"))
        prev = f"g{i}"
    return Graph("ladder", tuple(tensors), tuple(ops), (prev,)).validate()


def test_ladder_reaches_the_lower_bound():
    graph = ladder(6)
    arena, load = planned(graph)
    assert arena == load


def test_input_read_by_several_ops_is_static_and_never_shared():
    t = (Tensor("x", 64, Kind.INPUT), Tensor("a", 32), Tensor("b", 32), Tensor("y", 4))
    ops = (Op("A", "f", ("x",), ("a",)), Op("B", "f", ("x",), ("b",)), Op("Y", "f", ("a", "b", "x"), ("y",)))
    graph = Graph("input_fanout", t, ops, ("y",)).validate()
    p = plan(graph, [device()], PlannerSettings(alignment=1))
    verify(graph, p)
    assert "x" not in p.buffers and p.devices[0].static_bytes == 64


def _param_step() -> Graph:
    """A parameter, its gradient (made by backward) and an in-place update: the grads setting matters."""
    tensors = (
        Tensor("x", 64, Kind.INPUT), Tensor("w", 256, Kind.PARAM), Tensor("y", 512),
        Tensor("gw", 256, Kind.GRAD, grad_of="w"),
    )
    ops = (Op("fwd", "mm", ("x", "w"), ("y",)), Op("bwd", "mm", ("y", "x"), ("gw",), backward_of="fwd"),
           Op("sgd", "add_", ("w", "gw"), ("w",)))
    return Graph("step", tensors, ops, ("w",)).validate()


def test_gradients_are_dynamic_by_default_and_static_on_request() -> None:
    """The default holds ``gw`` as eager holds ``.grad`` (from backward on, in the arena); ``static``
    keeps it resident all step; both verify."""
    from mpplan.config import PlannerSection

    graph = _param_step()
    assert PlannerSettings().grads == PlannerSection().grads == "dynamic"
    dynamic = plan(graph, [Device("gpu0", 1 << 20)], PlannerSettings(alignment=1))
    static = plan(graph, [Device("gpu0", 1 << 20)], PlannerSettings(alignment=1, grads="static"))
    verify(graph, dynamic)
    verify(graph, static)
    assert "gw" in dynamic.buffers and "gw" not in static.buffers
    assert static.devices[0].static_bytes == dynamic.devices[0].static_bytes + 256


def test_a_plan_that_records_no_grads_setting_is_read_as_static() -> None:
    """Plans written before ``planner.grads`` existed had static gradients; they still verify as such."""
    import dataclasses

    from mpplan.planner import rematerialised

    graph = _param_step()
    static = plan(graph, [Device("gpu0", 1 << 20)], PlannerSettings(grads="static"))
    legacy = dataclasses.replace(static, settings={k: v for k, v in static.settings.items() if k != "grads"})
    assert rematerialised(graph, legacy) is graph
    verify(graph, legacy)


# --- PlannerSettings is the config's planner: section, flattened ---------------------------------------


def _section_leaves(section: object, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    import dataclasses

    leaves = []
    for f in dataclasses.fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        path = (*prefix, f.name)
        leaves += _section_leaves(value, path) if dataclasses.is_dataclass(value) else [path]
    return leaves


def test_planner_settings_cover_the_planner_section_exactly():
    import dataclasses

    from mpplan.config import PlannerSection
    from mpplan.planner import SECTION_PATHS

    paths = {f.name: SECTION_PATHS.get(f.name, (f.name,)) for f in dataclasses.fields(PlannerSettings)}
    assert sorted(paths.values()) == sorted(_section_leaves(PlannerSection()))
    assert PlannerSettings.from_config(PlannerSection()) == PlannerSettings()


def test_planner_settings_round_trip_through_the_config():
    from mpplan.config import load_config

    overrides = [
        "planner.schedule=dfs",
        "planner.assign=shared_dp",
        "planner.alignment=256",
        "planner.parallel_safe=true",
        "planner.placement=shift",
        "planner.shift.activations=[a, b]",
        "planner.shift.from=cuda:1",
        "planner.remat.policy=budget",
        "planner.remat.budget=0.5",
        "planner.no_split=[blocks.0]",
    ]
    config = load_config("configs/quickstart.yaml", overrides)
    settings_ = PlannerSettings.from_config(config.planner)
    picked = (settings_.schedule, settings_.shift_from, settings_.remat, settings_.no_split)
    assert picked == ("dfs", "cuda:1", "budget", ("blocks.0",))
    recorded = settings_.to_dict()
    assert recorded["shift"] == {"activations": ["a", "b"], "from": "cuda:1", "to": None}
    assert recorded["remat"]["policy"] == "budget" and recorded["no_split"] == ["blocks.0"]
    # what plan.json records is a planner: section that reads back as the same settings
    from mpplan.config import parse_config

    raw = {"model": {"synthetic": {"kind": "transformer", "layers": 2}}, "devices": [{"count": 2, "capacity": 2**20}]}
    assert PlannerSettings.from_config(parse_config({**raw, "planner": recorded}).planner) == settings_

"""Synthetic graphs: valid, deterministic, autograd-shaped backward passes, precise argument errors."""

from __future__ import annotations

import doctest
import math
from collections import Counter

import pytest

from mpplan.capture import nodelink, synthetic
from mpplan.capture.graph_file import load_graph, save_graph
from mpplan.capture.synthetic import GENERATORS, synthetic_graph
from mpplan.graph import Graph, Kind

SMALL = {
    "chain": {"n": 6},
    "residual_cnn": {"blocks": 5},
    "transformer": {"layers": 2, "seq": 64, "hidden": 64, "heads": 4, "vocab": 100},
    "unet": {"depth": 3, "image": 32},
    "random_layered": {"n": 60},
}
KINDS = sorted(SMALL)


def build(kind: str, **kwargs) -> Graph:
    return synthetic_graph(kind, **{**SMALL[kind], **kwargs})


def test_every_generator_has_a_small_case():
    assert sorted(GENERATORS) == KINDS


@pytest.mark.parametrize("optimizer", [None, "sgd", "momentum", "adam"])
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_graphs_validate_with_exact_sizes(kind, train, optimizer):
    g = build(kind, train=train, optimizer=optimizer).validate()
    for t in g.tensors:
        assert isinstance(t.nbytes, int) and t.nbytes >= 0
        if t.alias_of is not None:
            assert t.nbytes == 0
        elif t.shape is not None:
            assert t.nbytes == math.prod(t.shape) * {"float32": 4, "int64": 8}[t.dtype]
    topo = g.topology
    for t in g.tensors:
        static = topo.is_static[topo.tensor_index[t.name]]
        if t.kind in (Kind.PARAM, Kind.INPUT, Kind.OPTIMIZER_STATE):
            assert static, t.name
    assert all(o.cost >= 0 for o in g.ops)
    assert g.outputs == (("loss",) if train else g.outputs)
    assert g.outputs and all(name in topo.tensor_index for name in g.outputs)


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic(kind):
    assert build(kind, train=True) == build(kind, train=True)
    assert build(kind, seed=3) == build(kind, seed=3)
    assert build(kind, seed=3).content_hash == build(kind, seed=3).content_hash


@pytest.mark.parametrize("kind", ["chain", "residual_cnn", "transformer", "unet"])
def test_a_seed_jitters_costs_within_a_fifth(kind):
    plain, seeded = build(kind), build(kind, seed=1)
    if kind != "chain":  # a chain's seed also draws its widths
        assert [(o.name, o.inputs, o.outputs) for o in plain.ops] == [(o.name, o.inputs, o.outputs) for o in seeded.ops]
        assert plain.tensors == seeded.tensors
        for a, b in zip(plain.ops, seeded.ops):
            assert 0.79 * a.cost <= b.cost <= 1.21 * a.cost
    assert [o.cost for o in plain.ops] != [o.cost for o in seeded.ops]
    assert build(kind, seed=1) != build(kind, seed=2)


def test_random_layered_depends_on_its_seed():
    a, b = build("random_layered", seed=0), build("random_layered", seed=1)
    assert [o.inputs for o in a.ops] != [o.inputs for o in b.ops]


def test_chain_seed_varies_widths():
    widths = {t.shape[1] for t in build("chain", seed=4, n=20).tensors if t.kind is Kind.ACTIVATION}
    assert len(widths) > 5 and all(512 <= w <= 2048 for w in widths)


@pytest.mark.parametrize("optimizer", [None, "adam"])
@pytest.mark.parametrize("kind", KINDS)
def test_train_graphs_have_one_static_grad_per_param(kind, optimizer):
    g = build(kind, train=True, optimizer=optimizer).validate()
    topo = g.topology
    params = [t.name for t in g.tensors if t.kind is Kind.PARAM]
    assert params
    grads = Counter(t.grad_of for t in g.tensors if t.kind is Kind.GRAD and t.grad_of in set(params))
    assert grads == Counter(params)
    for t in g.tensors:
        static = topo.is_static[topo.tensor_index[t.name]]
        if t.kind is Kind.GRAD:
            assert static == (t.grad_of in grads), t.name
    states = Counter(t.name.rsplit(".", 1)[0] for t in g.tensors if t.kind is Kind.OPTIMIZER_STATE)
    assert states == (Counter({p: 2 for p in params}) if optimizer == "adam" else Counter())
    steps = [o for o in g.ops if o.type.endswith("Step")]
    assert len(steps) == (len(params) if optimizer else 0)
    for o in steps:
        assert o.in_place == o.outputs and o.module is not None


@pytest.mark.parametrize("kind", KINDS)
def test_backward_ops_mirror_forward_ops(kind):
    g = build(kind, train=True).validate()
    names = {o.name for o in g.ops}
    position = {o.name: k for k, o in enumerate(g.ops)}
    backward = [o for o in g.ops if o.backward_of is not None]
    assert backward
    assert len({o.backward_of for o in backward}) == len(backward), "one backward op per forward op"
    for o in backward:
        assert o.backward_of in names and position[o.backward_of] < position[o.name]
        assert o.name == f"{o.backward_of}.backward"
        assert all(g.tensor(t).kind is Kind.GRAD for t in o.outputs)
    first_backward = min(position[o.name] for o in backward)
    assert g.ops[first_backward].name == "loss.backward"
    # Every activation gradient is dynamic and names what it differentiates.
    topo = g.topology
    for t in g.tensors:
        if t.kind is Kind.GRAD and g.tensor(t.grad_of).kind is not Kind.PARAM:
            assert not topo.is_static[topo.tensor_index[t.name]]


def test_partial_gradients_are_summed():
    g = build("residual_cnn", train=True)
    sums = [o for o in g.ops if o.type == "AddN"]
    assert sums
    for o in sums:
        (out,) = o.outputs
        assert o.name == f"{out}.sum" and len(o.inputs) >= 2
        assert all(g.tensor(p).grad_of == g.tensor(out).grad_of for p in o.inputs)


def test_residual_cnn_shape():
    g = build("residual_cnn", batch=2, train=True)
    relus = [o for o in g.ops if o.type == "ReLU"]
    assert relus and all(o.in_place for o in relus), "torchvision's ReLUs work in place"
    assert g.op("layer2.0.downsample.0").module == "layer2.0.downsample.0"
    assert g.tensor("conv1").shape == (2, 64, 112, 112)
    assert g.tensor("fc").shape == (2, 1000)
    assert g.tensor("flatten").alias_of == "avgpool"
    # 5 blocks over 4 stages: 2, 1, 1, 1
    assert {
        o.module.split(".")[0] + "." + o.module.split(".")[1]
        for o in g.ops
        if o.module and o.module.startswith("layer")
    } == {"layer1.0", "layer1.1", "layer2.0", "layer3.0", "layer4.0"}


def test_transformer_shape():
    g = synthetic_graph("transformer", layers=2, batch=2, seq=16, hidden=32, heads=4, vocab=50, train=True)
    assert g.op("layers.1.attn.scores").module == "layers.1.attn"
    assert g.op("layers.1.attn.qkv").module == "layers.1.attn.qkv"
    assert g.tensor("layers.1.attn.scores").nbytes == 2 * 4 * 16 * 16 * 4
    assert [g.tensor(f"layers.0.attn.{x}").alias_of for x in "qkv"] == ["layers.0.attn.qkv"] * 3
    assert g.tensor("lm_head").shape == (2, 16, 50)
    add = g.op("layers.0.add1.backward")
    assert all(g.tensor(t).alias_of == add.inputs[0] for t in add.outputs), "an add passes its gradient on as views"
    assert g.op("layers.0.attn.split.backward").outputs == ("layers.0.attn.qkv.grad",)


def test_unet_skips_live_across_the_network():
    g = synthetic_graph("unet", depth=3, image=32, batch=1)
    assert g.op("up.0.cat").inputs == ("up.0.upconv", "down.0.conv2")
    assert g.tensor("mid.conv2").shape == (1, 512, 4, 4)
    assert g.tensor("head").shape == (1, 2, 32, 32)
    deep = synthetic_graph("unet", depth=12, image=64, max_channels=128)
    assert deep.tensor("mid.conv2").shape == (4, 128, 1, 1)


def test_random_layered_shape():
    g = synthetic_graph("random_layered", n=300, seed=5, param_prob=0.0)
    assert len(g.ops) == 300 and all(o.type == "Node" for o in g.ops)
    assert not [t for t in g.tensors if t.kind is Kind.PARAM]
    sizes = [t.nbytes for t in g.tensors if t.kind is Kind.ACTIVATION]
    assert min(sizes) >= 1 << 16 and max(sizes) <= 1 << 26
    read = {t for o in g.ops for t in o.inputs}
    assert set(g.outputs) == {o.name for o in g.ops} - read
    assert max(len(o.inputs) for o in g.ops) > 1


@pytest.mark.parametrize("kind", KINDS)
def test_train_graph_round_trips_through_a_file(kind, tmp_path):
    g = build(kind, train=True, optimizer="momentum", seed=7)
    assert load_graph(save_graph(g, tmp_path / "g.json")) == g


def test_costs_follow_the_arithmetic():
    g = synthetic_graph("transformer", layers=1)
    assert g.op("layers.0.mlp.fc1").cost > 10 * g.op("layers.0.ln2").cost
    assert g.op("layers.0.attn.split").cost == 0.0
    assert min(o.cost for o in g.ops if o.type != "Split") >= 1.0


@pytest.mark.parametrize(
    "kind, kwargs, message",
    [
        (
            "mlp",
            {},
            "unknown synthetic graph kind 'mlp'; "
            "expected one of chain, residual_cnn, transformer, unet, random_layered",
        ),
        (
            "transformer",
            {"layers": 2, "layer": 3},
            "transformer: unknown argument 'layer'; "
            "expected one of layers, batch, seq, hidden, heads, ffn, vocab, dtype, train, optimizer, seed, name",
        ),
        (
            "transformer",
            {},
            "transformer: missing argument 'layers'; "
            "expected one of layers, batch, seq, hidden, heads, ffn, vocab, dtype, train, optimizer, seed, name",
        ),
        ("transformer", {"layers": 0}, "transformer: layers: expected a positive integer, got 0"),
        (
            "transformer",
            {"layers": 2, "hidden": 10, "heads": 4},
            "transformer: hidden (10) must be a multiple of heads (4)",
        ),
        ("chain", {"n": "5"}, "chain: n: expected a positive integer, got '5'"),
        ("chain", {"n": True}, "chain: n: expected a positive integer, got True"),
        ("chain", {"n": 3, "train": "yes"}, "chain: train: expected true or false, got 'yes'"),
        (
            "chain",
            {"n": 3, "optimizer": "rmsprop"},
            "chain: optimizer: expected one of none, sgd, momentum, adam, got 'rmsprop'",
        ),
        (
            "unet",
            {"depth": 2, "dtype": "float42"},
            "unet: dtype: expected one of " + ", ".join(synthetic.DTYPE_BYTES) + ", got 'float42'",
        ),
        ("residual_cnn", {"blocks": 2, "seed": 1.5}, "residual_cnn: seed: expected an integer, got 1.5"),
        ("residual_cnn", {"blocks": 2, "name": ""}, "residual_cnn: name: expected a non-empty string, got ''"),
        ("random_layered", {"n": 5, "seed": None}, "random_layered: seed: expected an integer, got None"),
        ("random_layered", {"n": 5, "param_prob": 2}, "random_layered: param_prob: expected a number in [0, 1], got 2"),
        (
            "random_layered",
            {"n": 5, "min_bytes": 10, "max_bytes": 5},
            "random_layered: min_bytes (10) exceeds max_bytes (5)",
        ),
    ],
)
def test_argument_errors_name_the_bad_value(kind, kwargs, message):
    with pytest.raises(ValueError) as info:
        synthetic_graph(kind, **kwargs)
    assert str(info.value) == message


def test_optimizer_none_string_means_no_optimizer():
    assert build("chain", train=True, optimizer="none") == build("chain", train=True)


def test_names_and_dtypes():
    g = synthetic_graph("chain", n=2, dtype="bfloat16", name="mine")
    assert g.name == "mine" and g.tensor("layers.0").nbytes == 32 * 1024 * 2
    assert build("transformer").name == "transformer2"


def test_docstring_examples_run():
    for module in (synthetic, nodelink):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0


def test_twenty_thousand_ops_build_and_validate():
    g = synthetic_graph("transformer", layers=720, seq=16, hidden=32, heads=4, vocab=50, train=True)
    g.validate()
    assert len(g.ops) > 20_000


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, kwargs",
    [("chain", {"n": 100_000}), ("transformer", {"layers": 3_700, "train": True})],
)
def test_hundred_thousand_ops_build(kind, kwargs):
    g = synthetic_graph(kind, **kwargs)
    g.validate()
    assert len(g.ops) >= 100_000

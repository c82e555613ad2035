"""The model zoo: factories, example inputs, the registry, and building on the meta device."""

from __future__ import annotations

import pytest
import torch

from mpplan import zoo
from mpplan.zoo import cnn, convattn, mlp, transformer


@pytest.mark.parametrize(
    "name, kwargs, inputs, out_shape",
    [
        ("mlp", {"in_features": 6, "hidden": 5, "out_features": 3, "layers": 3}, {"in_features": 6}, (2, 3)),
        ("resnet", {"blocks": (1, 2), "width": 4, "num_classes": 7}, {"image_size": 8}, (2, 7)),
        (
            "convattn",
            {"stages": 2, "width": 8, "n_heads": 2, "groups": 4, "num_classes": 5},
            {"image_size": 8},
            (2, 5),
        ),
        (
            "gpt",
            {"vocab_size": 50, "max_seq_len": 8, "d_model": 16, "n_heads": 2},
            {"seq_len": 8, "vocab_size": 50},
            (2, 8, 50),
        ),
    ],
)
def test_registry_builds_models_that_run(name: str, kwargs: dict, inputs: dict, out_shape: tuple[int, ...]) -> None:
    model = zoo.build(name, **kwargs)
    x = zoo.example_inputs(name, batch=2, **inputs)
    with torch.no_grad():
        assert model(*x).shape == out_shape


def test_mlp_layout() -> None:
    model = mlp.MLP(4, 8, 2, layers=3)
    linears = [m for m in model.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 8), (8, 8), (8, 2)]
    assert isinstance(mlp.MLP(4, 8, 2, layers=1).net[0], torch.nn.Linear)
    with pytest.raises(ValueError, match="layers >= 1"):
        mlp.MLP(4, 8, 2, layers=0)


def test_resnet_downsamples_with_projection_shortcuts() -> None:
    model = cnn.resnet((1, 1, 1), width=4)
    shortcuts = [type(s.shortcut).__name__ for stage in model.stages for s in stage]
    assert shortcuts == ["Identity", "Sequential", "Sequential"]
    assert model.fc.in_features == 16


def test_gpt_ties_and_math_attention_agree_with_sdpa() -> None:
    torch.manual_seed(0)
    sdpa = transformer.gpt(vocab_size=32, max_seq_len=8, d_model=16, n_heads=2, n_layers=1)
    assert sdpa.head.weight is sdpa.tok_emb.weight
    math_attention = transformer.gpt(vocab_size=32, max_seq_len=8, d_model=16, n_heads=2, n_layers=1, attention="math")
    math_attention.load_state_dict(sdpa.state_dict())
    (idx,) = transformer.example_inputs(batch=2, seq_len=8, vocab_size=32)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(idx), math_attention(idx), rtol=1e-4, atol=1e-5)
    untied = transformer.gpt(vocab_size=32, max_seq_len=8, d_model=16, n_heads=2, n_layers=1, tie_weights=False)
    assert untied.head.weight is not untied.tok_emb.weight


def test_convattn_has_conv_attention_and_skips_that_carry_gradients() -> None:
    """The held-out style: convolutions, attention over pixels, and a long skip whose weights train."""
    model = convattn.convattn(stages=2, width=8, n_heads=2, groups=4)
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"ConvBlock", "PixelAttention", "Conv2d"} <= kinds
    (x,) = convattn.example_inputs(batch=2, image_size=8)
    model(x).sum().backward()
    assert model.skip.weight.grad is not None and model.skip.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="divisible by n_heads"):
        convattn.convattn(width=5, n_heads=4, groups=1)  # attention runs on 10 channels


def test_factories_follow_the_ambient_device() -> None:
    with torch.device("meta"):
        models = [mlp.mlp(), cnn.resnet(), transformer.gpt(), convattn.convattn()]
    assert all(p.device.type == "meta" for m in models for p in m.parameters())
    assert all(p.device.type == "meta" for p in mlp.mlp(device="meta").parameters())


def test_resolve_errors() -> None:
    assert zoo.resolve("mpplan.zoo.mlp:mlp") is mlp.mlp
    with pytest.raises(ValueError, match="expected 'package.module:attribute'"):
        zoo.resolve("mpplan.zoo.mlp")
    with pytest.raises(ValueError, match="cannot import module"):
        zoo.resolve("mpplan.zoo.nothing:mlp")
    with pytest.raises(ValueError, match="no callable 'nope'"):
        zoo.resolve("mpplan.zoo.mlp:nope")
    with pytest.raises(ValueError, match="unknown zoo model 'vgg'"):
        zoo.build("vgg")


def test_gpt2_configs_build_on_meta() -> None:
    pytest.importorskip("transformers")
    from mpplan.zoo import gpt2

    model = gpt2.gpt2("gpt2-xl", device="meta")
    assert sum(p.numel() for p in model.parameters()) == 1_557_611_200
    assert model.config.use_cache is False
    small = gpt2.gpt2("gpt2", device="meta", n_layer=2, attn_implementation="eager")
    assert small.config.n_layer == 2 and small.config._attn_implementation == "eager"
    assert gpt2.example_inputs(batch=4, seq_len=512)["input_ids"].shape == (4, 512)
    with pytest.raises(ValueError, match="unknown config_name 'gpt3'"):
        gpt2.gpt2("gpt3")

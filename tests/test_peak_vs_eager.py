"""Issue 14: a plan needs no more memory than eager PyTorch at the same batch.

Eager (``zero_grad(set_to_none=True)``, forward, backward, ``optimizer.step()``) is
measured on a virtual device, every live storage counted; the plan is the planner's
default (``planner.grads: dynamic``).  The comparison is made with 1-byte alignment,
because eager's meter counts raw storage bytes while the default 64-byte alignment pads
each buffer (tens of bytes on these models); the default plan is also executed, and its
measured peak must be what it predicts.  ``planner.grads: static`` (memonger's model)
is the control: it keeps every gradient all step, and on the zoo MLP trained with SGD, whose
gradients are a large share of its memory, it needs more than eager, so the test can fail.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from mpplan import zoo  # noqa: E402
from mpplan.config import Device  # noqa: E402
from mpplan.planner import PlannerSettings, plan  # noqa: E402
from mpplan.runtime import capture_for, evaluate_program  # noqa: E402
from mpplan.verify import verify  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")

#: name -> (factory kwargs, example-input kwargs, batch, optimizer): small versions of configs/zoo_*.yaml.
MODELS = {
    "mlp": ({}, {"in_features": 64}, 32, "sgd"),
    "resnet": ({"blocks": (1, 1), "width": 8}, {"image_size": 16}, 8, "adam"),
    "gpt": ({"vocab_size": 128, "max_seq_len": 32, "d_model": 32, "n_heads": 2, "n_layers": 2},
            {"seq_len": 32, "vocab_size": 128}, 4, "adam"),
    "convattn": ({"stages": 2, "width": 16, "n_heads": 2, "groups": 4}, {"image_size": 8}, 4, "adam"),
}
DEVICE = Device("cuda:0", 1 << 40)


def _case(name: str):
    kwargs, input_kwargs, batch, optimizer = MODELS[name]
    torch.manual_seed(0)
    model = zoo.build(name, **kwargs)
    inputs = zoo.example_inputs(name, batch=batch, **input_kwargs)
    program = capture_for(model, inputs, torch.device("cpu"), mode="train", optimizer=optimizer, loss_fn=None)
    return model, inputs, program


@pytest.mark.parametrize("name", sorted(MODELS))
def test_default_plan_needs_no_more_than_eager(name: str) -> None:
    model, inputs, program = _case(name)
    settings = PlannerSettings(placement="single")
    assert settings.grads == "dynamic"  # what a user's loop holds is the default
    planned = plan(program.graph, [DEVICE], settings)
    verify(program.graph, planned)
    measured = evaluate_program(program, planned, model, inputs, steps=1, warmup=1, devices="virtual")
    assert measured.numerics is not None and measured.numerics.ok
    assert measured.eager is not None
    eager = measured.eager.devices[0].measured_peak_bytes
    device = measured.devices[0]
    # arena mode: the plan's peak, plus the one result an op computes outside the arena (scratch)
    assert device.measured_peak_bytes == device.predicted_peak_bytes == planned.max_peak_bytes + device.scratch_bytes
    unpadded = plan(program.graph, [DEVICE], dataclasses.replace(settings, alignment=1))
    verify(program.graph, unpadded)
    assert unpadded.max_peak_bytes <= eager


def test_static_grads_need_more_than_eager_on_the_mlp() -> None:
    """The control: memonger's resident gradients cost the MLP more than eager holds."""
    model, inputs, program = _case("mlp")
    static = plan(program.graph, [DEVICE], PlannerSettings(placement="single", grads="static", alignment=1))
    verify(program.graph, static)
    measured = evaluate_program(program, static, model, inputs, steps=1, warmup=1, devices="virtual")
    assert measured.eager is not None
    assert static.max_peak_bytes > measured.eager.devices[0].measured_peak_bytes

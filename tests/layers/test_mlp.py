"""linvit.layers.Mlp: timm's Mlp, whose GELU runs in place without autograd, with the same outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from timm.layers import Mlp as TimmMlp
from torch import nn
from torch.profiler import ProfilerActivity, profile

from linvit.layers import Mlp


def _pair(approximate: str = "none") -> tuple[Mlp, TimmMlp]:
    torch.manual_seed(0)
    ours = Mlp(16, 48, act_layer=lambda: nn.GELU(approximate=approximate))
    theirs = TimmMlp(16, 48, act_layer=lambda: nn.GELU(approximate=approximate))
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _aten_ops(module: nn.Module, x: torch.Tensor) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        module(x)
    return {event.key for event in prof.key_averages()}


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_without_autograd_the_gelu_runs_in_place_with_timms_output(approximate):
    ours, theirs = _pair(approximate)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        expected = theirs(x)
        assert torch.equal(ours(x), expected)
        ops = _aten_ops(ours, x)
    assert "aten::gelu_" in ops and "aten::gelu" not in ops
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_with_autograd_it_is_timms_mlp_gradients_included():
    ours, theirs = _pair()
    x = torch.randn(2, 10, 16, requires_grad=True)
    out = ours(x)
    assert torch.equal(out, theirs(x))
    assert "aten::gelu_" not in _aten_ops(ours, x)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (expected,) = torch.autograd.grad(theirs(x).square().sum(), x)
    torch.testing.assert_close(grad, expected)


def test_another_activation_takes_timms_path():
    torch.manual_seed(0)
    mlp = Mlp(16, 48, act_layer=nn.ReLU)
    with torch.no_grad():
        ops = _aten_ops(mlp, torch.randn(2, 10, 16))
    assert "aten::gelu_" not in ops and "aten::relu" in ops


@pytest.mark.parametrize("watched", ["fc1", "act"])
def test_a_hook_on_fc1_or_the_activation_sees_what_timms_mlp_shows_it(watched):
    ours, theirs = _pair()
    seen = {}

    def keep(name):
        return lambda module, inputs, output: seen.setdefault(name, output)  # a reference, as hooks keep them

    getattr(ours, watched).register_forward_hook(keep("ours"))
    getattr(theirs, watched).register_forward_hook(keep("theirs"))
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        ours(x), theirs(x)
    assert torch.equal(seen["ours"], seen["theirs"])

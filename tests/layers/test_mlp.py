"""linvit.layers.Mlp: timm's Mlp, with fc1 + GELU fused (oneDNN) or the GELU in place without autograd, with the
same outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from timm.layers import Mlp as TimmMlp
from torch import nn
from torch.profiler import ProfilerActivity, profile

from linvit.layers import Mlp
from linvit.ops.onednn import _onednn_op

FUSED_OP = "mkldnn::_linear_pointwise"


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
def test_without_autograd_or_onednn_the_gelu_runs_in_place_with_timms_output(approximate):
    ours, theirs = _pair(approximate)
    x = torch.randn(2, 10, 16)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        expected = theirs(x)
        assert torch.equal(ours(x), expected)
        ops = _aten_ops(ours, x)
    assert "aten::gelu_" in ops and "aten::gelu" not in ops and FUSED_OP not in ops
    assert list(ours.state_dict()) == list(theirs.state_dict())


@pytest.mark.skipif(not _onednn_op("_linear_pointwise"), reason="this torch has no oneDNN fused linear")
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_without_autograd_fc1_and_gelu_run_as_one_onednn_op_with_timms_output(approximate):
    ours, theirs = _pair(approximate)
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        expected = theirs(x)
        torch.testing.assert_close(ours(x), expected, rtol=1e-5, atol=1e-6)
        ops = _aten_ops(ours, x)
    assert FUSED_OP in ops and not {"aten::gelu", "aten::gelu_", "aten::addmm"} & ops


def test_with_autograd_it_is_timms_mlp_gradients_included():
    ours, theirs = _pair()
    x = torch.randn(2, 10, 16, requires_grad=True)
    out = ours(x)
    assert torch.equal(out, theirs(x))
    assert not {"aten::gelu_", FUSED_OP} & _aten_ops(ours, x)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (expected,) = torch.autograd.grad(theirs(x).square().sum(), x)
    torch.testing.assert_close(grad, expected)


def test_another_activation_takes_timms_path():
    torch.manual_seed(0)
    mlp = Mlp(16, 48, act_layer=nn.ReLU)
    with torch.no_grad():
        ops = _aten_ops(mlp, torch.randn(2, 10, 16))
    assert not {"aten::gelu_", "aten::gelu"} & ops and "aten::relu" in ops


@pytest.mark.parametrize("watched", ["fc1", "act", "fc2"])
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

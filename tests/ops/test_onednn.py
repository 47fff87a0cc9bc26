"""linvit.ops.onednn: oneDNN's fused linear (bias, GELU) where only the result is asked for, F.linear elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from linvit.ops.onednn import _onednn_op, bf16_native, linear, linear_gelu, onednn_linear_ready

FUSED_OP = "mkldnn::_linear_pointwise"
needs_onednn = pytest.mark.skipif(not _onednn_op("_linear_pointwise"), reason="this torch has no oneDNN fused linear")
needs_bf16 = pytest.mark.skipif(
    not (_onednn_op("_linear_pointwise") and bf16_native()), reason="oneDNN would emulate bf16 on this CPU"
)


def _ops(fn, *args) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return {event.key for event in prof.key_averages()}


def _operands(shape=(2, 10, 16), out_features=24, bias=True, dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=generator, dtype=dtype)
    weight = torch.randn(out_features, shape[-1], generator=generator, dtype=dtype)
    b = torch.randn(out_features, generator=generator, dtype=dtype) if bias else None
    return x, weight, b


@needs_onednn
@pytest.mark.parametrize("shape", [(16,), (7, 16), (2, 10, 16), (2, 3, 5, 16)])
@pytest.mark.parametrize("bias", [True, False])
def test_fused_linear_agrees_with_f_linear(shape, bias):
    x, weight, b = _operands(shape, bias=bias)
    with torch.no_grad():
        assert onednn_linear_ready(x, weight, b)
        assert FUSED_OP in _ops(linear, x, weight, b)
        torch.testing.assert_close(linear(x, weight, b), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@needs_onednn
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fused_gelu_agrees_with_gelu_of_f_linear(approximate):
    x, weight, b = _operands((3, 40, 16), out_features=64)
    with torch.no_grad():
        ops = _ops(linear_gelu, x, weight, b, approximate)
        out = linear_gelu(x, weight, b, approximate)
    assert FUSED_OP in ops and "aten::gelu" not in ops and "aten::addmm" not in ops
    torch.testing.assert_close(out, F.gelu(F.linear(x, weight, b), approximate=approximate), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_strided_input_agrees():
    x, weight, b = _operands((2, 20, 16))
    x = x[:, ::2]  # every other token: not contiguous
    with torch.no_grad():
        torch.testing.assert_close(linear(x, weight, b), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_with_autograd_it_is_f_linear_gradients_included():
    x, weight, b = _operands()
    weight.requires_grad_(True)
    out = linear_gelu(x, weight, b)
    assert out.grad_fn is not None
    (grad,) = torch.autograd.grad(out.square().sum(), weight)
    (expected,) = torch.autograd.grad(F.gelu(F.linear(x, weight, b)).square().sum(), weight)
    torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("why", ["onednn off", "float64", "bias in float64", "weight not contiguous", "no tokens"])
def test_falls_back_to_f_linear(why):
    x, weight, b = _operands(dtype=torch.float64 if why == "float64" else torch.float32)
    if why == "bias in float64":
        b = b.double()
    if why == "weight not contiguous":
        weight = weight.t().contiguous().t()
    if why == "no tokens":
        x = x[:, :0]
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=why != "onednn off"):
        assert not onednn_linear_ready(x, weight, b)
        if why == "bias in float64":
            return  # F.linear's own answer to mixed dtypes is what the caller gets
        assert FUSED_OP not in _ops(linear, x, weight, b)
        torch.testing.assert_close(linear(x, weight, b), F.linear(x, weight, b))


def test_a_flop_counter_sees_the_linear_layer():
    x, weight, b = _operands()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        linear_gelu(x, weight, b)
    assert counter.get_total_flops() == 2 * x.shape[0] * x.shape[1] * weight.shape[0] * weight.shape[1]


def test_traced_symbolic_and_exported_graphs_hold_the_standard_linear():
    x, weight, b = _operands()

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(weight), nn.Parameter(b)  # FX makes parameters proxies too

        def forward(self, x):
            return linear_gelu(x, self.weight, self.bias)

    with torch.no_grad():
        traced = torch.jit.trace(Layer(), x)
        exported = torch.export.export(Layer(), (x,))
        symbolic = torch.fx.symbolic_trace(Layer())  # FX proxies: no branch on them, F.linear recorded
    assert "linear" in str(symbolic.graph) and "mkldnn" not in str(symbolic.graph)
    assert "aten::linear" in str(traced.graph) and "mkldnn" not in str(traced.graph)
    assert "aten.linear" in str(exported.graph) and "mkldnn" not in str(exported.graph)
    torch.testing.assert_close(exported.module()(x), F.gelu(F.linear(x, weight, b)))


@needs_bf16
def test_bf16_autocast_runs_the_product_in_bf16_like_f_linear():
    x, weight, b = _operands((2, 30, 32), out_features=48)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert FUSED_OP in _ops(linear, x, weight, b)
        out, expected = linear(x, weight, b), F.linear(x, weight, b)
        fused_gelu = linear_gelu(x, weight, b)
    assert out.dtype == expected.dtype == fused_gelu.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(fused_gelu.float(), F.gelu(expected.float()), rtol=2e-2, atol=3e-2)


@needs_bf16
def test_bf16_tensors_run_fused():
    x, weight, b = _operands(dtype=torch.bfloat16)
    with torch.no_grad():
        assert FUSED_OP in _ops(linear, x, weight, b)
        out = linear(x, weight, b)
    torch.testing.assert_close(out.float(), F.linear(x, weight, b).float(), rtol=2e-2, atol=5e-2)


@needs_onednn
def test_window_attention_projects_through_the_fused_op_with_the_plain_output():
    from linvit.attention import create_attention

    torch.manual_seed(0)
    attention = create_attention("window", 32, 4).eval()
    x, hw = torch.randn(2, 64, 32), (8, 8)
    expected = attention(x, hw).detach()  # autograd on: the plain layers
    with torch.no_grad():
        ops = _ops(attention, x, hw)
        torch.testing.assert_close(attention(x, hw), expected, rtol=1e-5, atol=1e-5)
    assert FUSED_OP in ops and "aten::addmm" not in ops

"""Half-precision behaviour (autocast bf16/fp16 with large activations) and float64 gradients."""

import pytest
import torch

from linvit.attention import ATTENTION_NAMES, FocusedLinearAttention, create_attention, linear_attention

HW = (6, 7)


def _module(name, **kwargs):
    torch.manual_seed(0)
    if name == "focused":
        kwargs.setdefault("pos_size", (4, 4))
    if name in ("window", "hybrid"):
        kwargs.setdefault("window_size", 4)
        kwargs.setdefault("shift_size", 2)
    return create_attention(name, 32, 2, **kwargs).eval()


@pytest.mark.parametrize("name", ATTENTION_NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_large_inputs_stay_finite_and_close(name, dtype):
    """Inputs of std 16 under CPU autocast: q**3 would overflow fp16, the float32 core must not."""
    module = _module(name)
    x = torch.randn(2, HW[0] * HW[1], 32, generator=torch.Generator().manual_seed(1)) * 16
    with torch.no_grad():
        reference = module(x, HW)
        with torch.autocast("cpu", dtype=dtype):
            out = module(x, HW)
    assert torch.isfinite(out).all()
    error = (out.float() - reference).norm() / reference.norm()
    assert error < 0.05, f"{name} under {dtype} autocast: relative error {error:.4f}"


def test_focused_windowed_autocast_with_padding():
    module = _module("focused", window_size=4)
    x = torch.randn(1, HW[0] * HW[1], 32) * 16
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        out = module(x, HW)
    assert torch.isfinite(out).all()


def test_focused_in_pure_float16_stays_finite():
    """Parameters and inputs in fp16 (no autocast): the kernel map and S/z are still float32 inside."""
    module = _module("focused").half()
    x = (torch.randn(1, HW[0] * HW[1], 32) * 16).half()
    with torch.no_grad():
        out = module(x, HW)
        reference = module.float()(x.float(), HW)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert (out.float() - reference).norm() / reference.norm() < 0.05


def test_linear_attention_half_inputs_return_half_from_float32_math():
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.rand(1, 2, 300, 8, generator=generator) * 38 for _ in range(2))
    v = torch.randn(1, 2, 300, 8, generator=generator)
    q, k = q.half() ** 3, k.half() ** 3  # finite fp16 features near the top of the range (38³ ≈ 55k)
    assert torch.isinf(q[0, 0] @ k[0, 0].transpose(0, 1)).any()  # a half-precision product would overflow
    out = linear_attention(q, k, v.half())
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), linear_attention(q.float(), k.float(), v), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("focused", {"pos_size": (3, 3)}),
        ("focused", {"window_size": 2, "pos_encoding": "conv"}),
        ("linear", {}),
        ("elu", {"dwc_kernel_size": 3}),
        ("favor", {}),
        ("taylor", {}),
        ("window", {"window_size": 2, "shift_size": 1}),
        ("softmax", {}),
        ("hybrid", {"window_size": 2, "shift_size": 1}),
    ],
)
def test_gradcheck_float64(name, kwargs):
    torch.manual_seed(0)
    module = create_attention(name, 8, 2, dtype=torch.float64, **kwargs).eval()
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    hw = (3, 3)
    x = torch.randn(1, 9, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: module(t, hw), (x,), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_every_parameter_gets_a_gradient():
    module = FocusedLinearAttention(16, 2, pos_size=(4, 4), window_size=4)
    module(torch.randn(2, 30, 16), (5, 6)).sum().backward()
    missing = [name for name, p in module.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing

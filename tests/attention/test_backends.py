"""Attention modules and whole models give the same outputs and gradients on every backend of linvit.ops.

The Triton backend runs compiled on a CUDA machine and through Triton's interpreter on the CPU (tests/conftest.py),
so the shapes here are small.
"""

from __future__ import annotations

import importlib.util

import pytest
import timm
import torch

import linvit  # noqa: F401  (registers the models)
from linvit.attention import FocusedLinearAttention, create_attention
from linvit.ops import use_backend

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed (PyTorch's CUDA wheels bring it)"
)

MODULES = {
    "global_focused": ("focused", {"pos_size": (6, 5)}, (6, 5)),
    "windowed_focused_padded": ("focused", {"window_size": 4}, (6, 5)),  # padded windows: the key-mask path
    "conv_positions": ("focused", {"pos_encoding": "conv", "window_size": (3, 4)}, (5, 7)),
    "relu_with_dwc": ("linear", {"dwc_kernel_size": 3}, (5, 4)),
    "elu": ("elu", {}, (4, 6)),
    "hybrid": ("hybrid", {"window_size": 3, "shift_size": 1}, (6, 5)),
    # 128 channels in 2 heads of 64: the fused kernels split the heads into groups (norms and cross-head passes)
    "global_focused_head_groups": ("focused", {"pos_size": (4, 5), "dim": 128}, (4, 5)),
}


def _randomised(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return module


def _outputs_and_grads(module: torch.nn.Module, x: torch.Tensor, hw, backend: str):
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    with use_backend(backend):
        out = module(x, hw)
    out.square().sum().backward()
    grads = {name: p.grad.detach().clone() for name, p in module.named_parameters()}
    return out.detach(), x.grad, grads


def _assert_close(got: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Within 1e-5 of the largest magnitude (fp32 sums in another order; both are ~3e-7 from a float64 run)."""
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * float(expected.abs().max()), msg=what or None)


@needs_triton
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_on_triton_equals_torch_in_value_and_gradients(name):
    attention, kwargs, hw = MODULES[name]
    kwargs = dict(kwargs)
    dim = kwargs.pop("dim", 32)
    module = _randomised(create_attention(attention, dim, 2, **kwargs)).to(DEVICE)
    x = torch.randn(2, hw[0] * hw[1], dim, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    expected = _outputs_and_grads(module, x, hw, "torch")
    got = _outputs_and_grads(module, x, hw, "triton")
    _assert_close(got[0], expected[0])
    _assert_close(got[1], expected[1])
    assert got[2].keys() == expected[2].keys()
    for key in expected[2]:
        _assert_close(got[2][key], expected[2][key], key)


def test_module_backend_argument_wins_over_the_process_default():
    module = _randomised(FocusedLinearAttention(32, 2, pos_size=(3, 3), backend="naive"))
    x = torch.randn(1, 9, 32)
    with use_backend("torch"):
        naive_out = module(x, (3, 3))
    module.backend = "torch"
    torch.testing.assert_close(naive_out, module(x, (3, 3)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="valid backends are auto, torch, triton, naive"):
        FocusedLinearAttention(32, 2, pos_size=(3, 3), backend="cuda")


def test_prefix_tokens_take_part_in_attention_without_position():
    """num_prefix_tokens: the class token attends and is attended to, but has no positional term and no DWC."""
    module = _randomised(FocusedLinearAttention(32, 2, pos_size=(3, 4), num_prefix_tokens=1))
    x = torch.randn(2, 1 + 12, 32)
    out = module(x, (3, 4))
    assert out.shape == (2, 13, 32)
    changed = x.clone()
    changed[:, 0] += 1.0  # the class token's key/value moves every patch output
    assert not torch.allclose(module(changed, (3, 4))[:, 1:], out[:, 1:])
    with pytest.raises(ValueError, match="global attention"):
        FocusedLinearAttention(32, 2, window_size=4, num_prefix_tokens=1)


@needs_triton
# FLatten-DeiT (a class token through the kernels, ~14 s in the interpreter) in the slow tier
@pytest.mark.parametrize(
    "model_name, size",
    [("linvit_nano", 32), pytest.param("flatten_deit_tiny_patch16_224", 48, marks=pytest.mark.slow)],
)
def test_whole_model_on_triton_equals_torch(model_name, size):
    """The models take the fused path with no change of their own: the process-wide backend switches them all."""
    torch.manual_seed(0)
    model = timm.create_model(model_name, num_classes=5, img_size=size).to(DEVICE).eval()
    x = torch.randn(2, 3, size, size, device=DEVICE)
    with torch.no_grad(), use_backend("torch"):
        expected = model(x)
    with torch.no_grad(), use_backend("triton"):
        got = model(x)
    _assert_close(got, expected)

"""The benchmarks' baselines compute what they claim, and linvit's focused attention equals the authors' one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linvit.bench.baselines import AuthorsFocusedLinearAttention, GlobalSoftmaxSDPA, SwinWindowSoftmax


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial values everywhere (zero-initialised scale/positional encoding would hide mistakes)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


def _focused_attention_materialised(module: AuthorsFocusedLinearAttention, x: torch.Tensor, hw) -> torch.Tensor:
    """The published math, spelled out with the N×N matrix (reference notes, section 1); slow and obvious."""
    B, N, C = x.shape
    h = module.num_heads
    d = C // h
    q, k, v = module.qkv(x).split(C, dim=-1)
    k = k + module.positional_encoding
    s = F.softplus(module.scale)
    p = module.focusing_factor

    def focus(t):
        t = (torch.relu(t) + 1e-6) / s
        powered = t**p
        return powered * (t.norm(p=2, dim=-1, keepdim=True) / powered.norm(p=2, dim=-1, keepdim=True))

    q, k = focus(q), focus(k)
    out = torch.empty(B, N, C, dtype=x.dtype)
    for head in range(h):
        sl = slice(head * d, (head + 1) * d)
        weights = q[..., sl] @ k[..., sl].transpose(1, 2)  # (B, N, N), non-negative
        # mean form of the normaliser, with the authors' eps: (A v / N) / (mean_j A_ij + 1e-6)
        out[..., sl] = (weights @ v[..., sl] / N) / (weights.mean(-1, keepdim=True) + 1e-6)
        v_image = v[..., sl].transpose(1, 2).reshape(B, d, *hw)
        out[..., sl] += module.dwc(v_image).reshape(B, d, N).transpose(1, 2)
    return module.proj(out)


def test_authors_formulation_matches_the_published_math():
    torch.manual_seed(0)
    hw = (6, 6)
    module = AuthorsFocusedLinearAttention(24, 3, hw).double()
    _randomise(module)
    module.double()
    x = torch.randn(2, 36, 24, dtype=torch.float64)
    torch.testing.assert_close(module(x, hw), _focused_attention_materialised(module, x, hw), rtol=1e-5, atol=1e-6)


def test_authors_formulation_refuses_another_map():
    module = AuthorsFocusedLinearAttention(16, 2, (4, 4))
    with pytest.raises(ValueError, match="fixed to map"):
        module(torch.randn(1, 25, 16), (5, 5))


def test_linvit_focused_attention_equals_the_authors_on_the_same_weights():
    attention = pytest.importorskip("linvit.attention")
    if not hasattr(attention, "FocusedLinearAttention"):
        pytest.skip("linvit.attention.FocusedLinearAttention has not landed")
    hw = (7, 7)
    linvit_module = attention.FocusedLinearAttention(32, 2, pos_size=hw).double().eval()
    _randomise(linvit_module, seed=1)
    authors = AuthorsFocusedLinearAttention(32, 2, hw).double().eval()
    authors.load_state_dict(linvit_module.state_dict(), strict=True)  # same keys and shapes as the checkpoints
    x = torch.randn(2, 49, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(linvit_module(x, hw), authors(x, hw), rtol=1e-6, atol=1e-8)


def test_swin_window_softmax_sdpa_equals_eager_and_pads_odd_maps():
    torch.manual_seed(0)
    fused = SwinWindowSoftmax(16, 2, window_size=7, fused=True)
    eager = SwinWindowSoftmax(16, 2, window_size=7, fused=False)
    eager.load_state_dict(fused.state_dict())
    hw = (9, 11)  # pads to 14×14
    x = torch.randn(2, 99, 16)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, hw), eager(x, hw), rtol=1e-4, atol=1e-5)


def test_swin_window_softmax_sees_only_its_window():
    torch.manual_seed(0)
    module = SwinWindowSoftmax(8, 1, window_size=7).eval()
    hw = (14, 14)
    x = torch.randn(1, 196, 8)
    changed = x.clone().view(1, 14, 14, 8)
    changed[:, 10, 10] += 5.0  # inside the bottom-right window only
    with torch.no_grad():
        a = module(x, hw).view(14, 14, 8)
        b = module(changed.view(1, 196, 8), hw).view(14, 14, 8)
    torch.testing.assert_close(a[:7, :7], b[:7, :7])
    assert not torch.allclose(a[7:, 7:], b[7:, 7:])


def test_global_softmax_sdpa_equals_materialised_softmax():
    torch.manual_seed(0)
    module = GlobalSoftmaxSDPA(16, 2).double()
    x = torch.randn(2, 20, 16, dtype=torch.float64)
    q, k, v = module.qkv(x).view(2, 20, 3, 2, 8).permute(2, 0, 3, 1, 4)
    weights = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)
    expected = module.proj((weights @ v).transpose(1, 2).reshape(2, 20, 16))
    torch.testing.assert_close(module(x, (4, 5)), expected)

"""CSwin's stripe attention: branches, the stand-alone module (LePEAttention against its reference: the CSwin
tests)."""

import pytest
import torch

from linvit.attention import (
    StripeAttention,
    create_attention,
    stripe_attention_reference,
    stripe_branches,
)


def _randomized(module):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return module


def test_branches_take_their_share_of_q_k_and_v():
    branches = _randomized(stripe_branches(16, 4, split_size=3)).double()
    hw = (5, 7)
    qkv = torch.randn(2, 35, 48, dtype=torch.float64)
    q, k, v = qkv.chunk(3, dim=-1)
    halves = [torch.cat([q[..., s], k[..., s], v[..., s]], dim=-1) for s in (slice(0, 8), slice(8, 16))]
    expected = torch.cat([stripe_attention_reference(b, h, hw) for b, h in zip(branches, halves)], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(branches(qkv, hw), expected)
    assert [b.direction for b in branches] == ["vertical", "horizontal"]
    with pytest.raises(ValueError, match="evenly"):
        stripe_branches(16, 3, split_size=3)


def test_stripe_attention_module_keys_and_full_direction():
    module = create_attention("stripe", 16, 2, split_size=3)
    assert isinstance(module, StripeAttention)
    assert sorted(module.state_dict()) == sorted(
        ["qkv.weight", "qkv.bias", "proj.weight", "proj.bias"]
        + [f"attns.{i}.get_v.{p}" for i in range(2) for p in ("weight", "bias")]
    )
    full = StripeAttention(16, 2, directions=("full",))
    assert len(full.attns) == 1 and full.attns[0].num_heads == 2
    assert full(torch.randn(1, 12, 16), (3, 4)).shape == (1, 12, 16)


def test_empty_batch():
    module = create_attention("stripe", 16, 2, split_size=3)
    assert module(torch.zeros(0, 35, 16), (5, 7)).shape == (0, 35, 16)

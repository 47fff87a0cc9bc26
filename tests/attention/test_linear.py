"""The linear-attention cores against the materialised N×N form, and the feature maps against their definitions."""

import math

import pytest
import torch
import torch.nn.functional as F

from linvit.attention import (
    FavorFeatureMap,
    elu_feature_map,
    favor_feature_map,
    focused_feature_map,
    linear_attention,
    linear_attention_tokens,
    orthogonal_random_projection,
    relu_feature_map,
    taylor_feature_map,
)
from linvit.ops.linear_attention.naive import materialised_linear_attention

EPS = 1e-6


def _favor(x):
    generator = torch.Generator().manual_seed(3)
    projection = orthogonal_random_projection(16, x.shape[-1], generator, dtype=x.dtype)
    return favor_feature_map(x, projection, is_query=True)


FEATURE_MAPS = {
    "relu": relu_feature_map,
    "elu": elu_feature_map,
    "focused": lambda x: focused_feature_map(x, torch.zeros(x.shape[-1], dtype=x.dtype), 3.0),
    "taylor": lambda x: taylor_feature_map(x * x.shape[-1] ** -0.25),
    "favor": _favor,
}


def _inputs(dtype, batch=2, heads=3, tokens=11, dim=4, value_dim=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tokens, dim, generator=generator, dtype=dtype)
    k = torch.randn(batch, heads, tokens, dim, generator=generator, dtype=dtype)
    v = torch.randn(batch, heads, tokens, value_dim, generator=generator, dtype=dtype)
    mask = torch.rand(batch, tokens, generator=generator) > 0.4
    mask[:, 0] = True
    return q, k, v, mask


@pytest.mark.parametrize("name", sorted(FEATURE_MAPS))
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("masked", [False, True])
def test_linear_attention_equals_materialised(name, dtype, tol, masked):
    q, k, v, mask = _inputs(dtype)
    phi = FEATURE_MAPS[name]
    q, k = phi(q), phi(k)
    key_mask = mask if masked else None
    out = linear_attention(q, k, v, key_mask)
    ref = materialised_linear_attention(q, k, v, key_mask)
    assert out.shape == v.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


def test_key_mask_drops_masked_tokens_entirely():
    q, k, v, mask = _inputs(torch.float64)
    q, k = F.elu(q) + 1, F.elu(k) + 1
    mask = torch.ones_like(mask)
    mask[:, -4:] = False
    out = linear_attention(q, k, v, mask)
    # Garbage in the masked keys/values changes nothing; dropping them changes nothing either.
    k_garbage, v_garbage = k.clone(), v.clone()
    k_garbage[:, :, -4:] = 1e3
    v_garbage[:, :, -4:] = float("nan")
    torch.testing.assert_close(linear_attention(q, k_garbage, v_garbage, mask), out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(linear_attention(q, k[:, :, :-4], v[:, :, :-4]), out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("with_scale", [False, True])
def test_token_layout_core_equals_head_layout_core(masked, with_scale):
    q, k, v, mask = _inputs(torch.float64, heads=3, dim=4, value_dim=6)
    q, k = q.relu() + 0.1, k.relu()
    key_mask = mask if masked else None
    scale = torch.rand(2, 1, 11, 1, dtype=torch.float64) + 0.5
    ref = linear_attention(q * scale if with_scale else q, k, v, key_mask)
    # Token layout (B, N, heads, d) as strided views of one packed tensor, like a qkv projection's output.
    packed = torch.cat([t.transpose(1, 2).flatten(2) for t in (q, k, v)], dim=-1)  # (B, N, 3·heads·d)
    q_t = packed[..., :12].unflatten(-1, (3, 4))
    k_t = packed[..., 12:24].unflatten(-1, (3, 4))
    v_t = packed[..., 24:].unflatten(-1, (3, 6))
    out = linear_attention_tokens(
        q_t, k_t, v_t, key_mask=key_mask, query_scale=scale.transpose(1, 2) if with_scale else None
    )
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-10, atol=1e-10)


def test_linear_attention_rejects_token_layout():
    q = torch.rand(2, 10, 8)
    with pytest.raises(ValueError, match="heads"):
        linear_attention(q, q, q)


def test_taylor_inner_product_is_second_order_exp():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    y = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    dot = (x * y).sum(-1)
    inner = (taylor_feature_map(x) * taylor_feature_map(y)).sum(-1)
    torch.testing.assert_close(inner, 1 + dot + dot**2 / 2, rtol=1e-12, atol=1e-12)
    assert taylor_feature_map(x).shape[-1] == 1 + 5 + 25


def test_focused_map_matches_definition():
    """f_p((relu(x)+eps)/softplus(scale)) with norms over all channels, written out."""
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(2, 9, 12, generator=generator, dtype=torch.float64) * 4
    scale = torch.randn(1, 1, 12, generator=generator, dtype=torch.float64)
    y = (torch.relu(x) + 1e-6) / torch.log1p(torch.exp(scale))
    expected = y**3 / torch.sqrt((y**6).sum(-1, keepdim=True)) * torch.sqrt((y**2).sum(-1, keepdim=True))
    torch.testing.assert_close(focused_feature_map(x, scale, 3.0), expected, rtol=1e-12, atol=1e-12)
    # A non-integer power goes through pow and keeps the norm of each token.
    out = focused_feature_map(x, scale, 2.5)
    torch.testing.assert_close(out.norm(dim=-1), y.norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_orthogonal_projection_blocks_are_orthogonal():
    w = orthogonal_random_projection(12, 5, torch.Generator().manual_seed(0), dtype=torch.float64)
    directions = w / w.norm(dim=1, keepdim=True)
    block = directions[:5] @ directions[:5].t()
    torch.testing.assert_close(block, torch.eye(5, dtype=torch.float64), rtol=0, atol=1e-10)
    assert w.shape == (12, 5)


def test_favor_approximates_softmax_better_with_more_features():
    """Relative error of FAVOR+ attention against exact softmax attention falls as the feature count grows."""
    generator = torch.Generator().manual_seed(0)
    batch, heads, tokens, dim = 1, 2, 64, 8
    q = torch.randn(batch, tokens, heads, dim, generator=generator, dtype=torch.float64) * 0.6
    k = torch.randn(batch, tokens, heads, dim, generator=generator, dtype=torch.float64) * 0.6
    v = torch.randn(batch, heads, tokens, dim, generator=generator, dtype=torch.float64)
    exact = torch.softmax(q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1) / math.sqrt(dim), -1) @ v
    errors = []
    for features in (8, 64, 1024):
        trial_errors = []
        for seed in range(4):
            feature_map = FavorFeatureMap(dim, features, seed=seed, dtype=torch.float64)
            phi_q = feature_map(q, True).transpose(1, 2)
            phi_k = feature_map(k, False).transpose(1, 2)
            approx = linear_attention(phi_q, phi_k, v, eps=0.0)
            trial_errors.append(((approx - exact).norm() / exact.norm()).item())
        errors.append(sum(trial_errors) / len(trial_errors))
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[2] < 0.35 * errors[0], errors


def test_favor_redraw_changes_projection_and_keeps_buffer():
    feature_map = FavorFeatureMap(4, 8, seed=0)
    before = feature_map.projection.clone()
    feature_map.redraw_features(torch.Generator().manual_seed(123))
    assert not torch.equal(before, feature_map.projection)
    assert "projection" in feature_map.state_dict()

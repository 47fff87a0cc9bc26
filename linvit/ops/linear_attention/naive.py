"""The obviously correct linear attention on a qkv projection: the published steps, the N×N matrix written out.

Slow (O(N²) memory) and kept that way on purpose: it is what the torch and Triton backends are tested against.
Every quantity is computed in float64 when the input is float64 and in float32 otherwise, with autocast off.

For each batch element (a whole map, or one window), with x the (N, 3C) projection output split into q, k, v:
1. k = k + P on the spatial tokens (P: a positional encoding, resized to the grid by the caller);
2. feature map φ, per token over its C channels:
   - "focused" (FLatten): a = (relu(x) + feature_eps) · inverse_temperature, φ = (‖a‖ / ‖a^p‖) · a^p, the norms
     over all C channels before the head split; with ``prescaled`` the input already holds
     (x + feature_eps) · inverse_temperature, so a = max(x, feature_eps · inverse_temperature);
   - "relu": φ = relu(x);  "elu": φ = elu(x) + 1;
3. per head, over the kept keys (mean form): A = φ(q) φ(k)ᵀ / N_kept, o = A v / (rowsum(A) + eps);
4. o = o + DWC(v) on the spatial tokens: each head's values as a (d, H, W) image (masked tokens zeroed) through one
   depthwise k×k conv shared by the heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._reference import merge_heads, reference_precision, split_heads
from linvit.ops.linear_attention.arguments import LinearAttentionArguments, inverse_of_scale

__all__ = ["linear_attention_qkv", "materialised_linear_attention"]


def materialised_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None, eps: float = 1e-6
) -> Tensor:
    """(φ(Q)φ(K)ᵀ / rowsum) V with the N×N matrix written out, mean form: A = φ(Q)φ(K)ᵀ / N_kept.

    q, k: mapped (B, heads, N, m); v: (B, heads, N, e); key_mask: (B, N) bool, True = keep. Computes in q's dtype.
    """
    scores = q @ k.transpose(-2, -1)  # (B, h, N, N): φ(q_i)·φ(k_j)
    if key_mask is not None:
        scores = scores * key_mask[:, None, None, :].to(scores.dtype)
        kept = key_mask.to(scores.dtype).sum(-1).clamp_min(1)[:, None, None, None]
        scores = scores / kept
    else:
        scores = scores / k.shape[-2]
    return (scores @ v) / (scores.sum(-1, keepdim=True) + eps)


def _feature_map(
    x: Tensor, feature_map: str, inverse_temperature: Tensor | None, power: float, feature_eps: float, prescaled: bool
) -> Tensor:
    if feature_map == "relu":
        return F.relu(x)
    if feature_map == "elu":
        return F.elu(x) + 1.0
    assert inverse_temperature is not None
    if prescaled:
        a = torch.maximum(x, feature_eps * inverse_temperature)
    else:
        a = (F.relu(x) + feature_eps) * inverse_temperature
    a_p = a**power
    return a_p * (a.norm(dim=-1, keepdim=True) / a_p.norm(dim=-1, keepdim=True))


@reference_precision
def linear_attention_qkv(qkv: Tensor, arguments: LinearAttentionArguments) -> Tensor:
    """The steps above on qkv (B, N, 3C) with the checked arguments of :func:`linvit.ops.linear_attention_qkv`
    (whose ``backend="naive"`` calls this); (B, N, C) in qkv's dtype."""
    (
        hw, num_heads, feature_map, inverse_temperature, focusing_factor, key_position, dwc_weight, dwc_bias,
        key_mask, prefix, eps, feature_eps, prescaled, temperature_scale,
    ) = arguments  # fmt: skip
    if temperature_scale is not None:
        inverse_temperature = inverse_of_scale(temperature_scale)
    batch, tokens, three_c = qkv.shape
    channels = three_c // 3
    head_dim = channels // num_heads
    dtype = qkv.dtype
    q, k, v = qkv.split(channels, dim=-1)
    inverse = None if inverse_temperature is None else inverse_temperature.to(dtype)
    if key_position is not None:
        position = key_position.to(dtype).expand(batch, tokens - prefix, channels)
        if prescaled:  # k holds (k + eps) / s: the position joins it scaled the same way
            position = position * inverse
        k = torch.cat([k[:, :prefix], k[:, prefix:] + position], dim=1)
    q = _feature_map(q, feature_map, inverse, focusing_factor, feature_eps, prescaled)
    k = _feature_map(k, feature_map, inverse, focusing_factor, feature_eps, prescaled)
    q, k, v_heads = (split_heads(t, num_heads) for t in (q, k, v))
    out = merge_heads(materialised_linear_attention(q, k, v_heads, key_mask, eps))
    if dwc_weight is not None:
        if key_mask is not None:
            v = v * key_mask[..., None]
        images = v[:, prefix:].reshape(batch, hw[0], hw[1], num_heads, head_dim)
        images = images.permute(0, 3, 4, 1, 2).reshape(batch * num_heads, head_dim, hw[0], hw[1])
        bias = None if dwc_bias is None else dwc_bias.to(dtype)
        local = F.conv2d(images, dwc_weight.to(dtype), bias, padding=dwc_weight.shape[-1] // 2, groups=head_dim)
        spatial = hw[0] * hw[1]
        local = local.reshape(batch, num_heads, head_dim, spatial).permute(0, 3, 1, 2).reshape(batch, spatial, channels)
        out = torch.cat([out[:, :prefix], out[:, prefix:] + local], dim=1)
    return out

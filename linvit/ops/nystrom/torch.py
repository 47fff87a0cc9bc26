"""Eager PyTorch Nyströmformer on a qkv projection: the default on every device, and what TorchScript runs.

The math is the reference's (see `naive.py`), regrouped so that no N×m matrix is kept: B v is the softmax attention
of the landmark queries over all keys, and F (A⁺ B v) that of all queries over the landmark keys, so both run through
`F.scaled_dot_product_attention` (fused kernels, O(N·m) time and O(N) memory) and only the m×m matrix A is written
out. The landmarks are one adaptive average pool over q|k in token layout (channels-last), and the skip is one
depthwise conv over all C channels with each head's kernel repeated over its d channels (channel head·d + j uses
kernel head: exactly the reference's per-head conv).

Numerics: everything after the projection runs in at least float32 with autocast off (A⁺ of a near-singular A has
large entries, and the iteration multiplies them; in fp16 it overflows); the skip runs in the caller's precision (a
conv under autocast) and is added in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._cells import cell_means, clamp_cells
from linvit.ops._numerics import at_least_float32, autocast_device_type
from linvit.ops.linear_attention.torch import channels_last_image

__all__ = ["head_conv_values", "iterative_pseudo_inverse", "scriptable_nystrom_attention_qkv"]


def _identity_minus(c: float, x: Tensor) -> Tensor:
    """c·I − x for (..., m, m) x, as a new tensor (one pass, the diagonal updated in place)."""
    out = -x
    torch.diagonal(out, 0, -2, -1).add_(c)
    return out


def iterative_pseudo_inverse(a: Tensor, iterations: int) -> Tensor:
    """The pseudo-inverse of (..., m, m) matrices by the paper's iteration (see `naive.iterative_pseudo_inverse`)."""
    largest_column_sum = a.abs().sum(dim=-2).amax(dim=-1)
    largest_row_sum = a.abs().sum(dim=-1).amax(dim=-1)
    z = a.transpose(-2, -1) / (largest_column_sum * largest_row_sum)[..., None, None]
    for _ in range(iterations):
        az = torch.matmul(a, z)
        inner = _identity_minus(15.0, torch.matmul(az, _identity_minus(7.0, az)))
        z = torch.matmul(z, _identity_minus(13.0, torch.matmul(az, inner))) * 0.25
    return z


def head_conv_values(v: Tensor, hw: tuple[int, int], weight: Tensor, num_heads: int) -> Tensor:
    """The per-head conv of v (B, n, C) on an (H, W) grid with (h, 1, k, k) kernels, one per head shared by its d
    channels, as one depthwise conv over all C channels; (B, n, C) in v's precision (autocast's under autocast)."""
    image = channels_last_image(v, hw, None)
    per_channel = weight.repeat_interleave(v.shape[-1] // num_heads, dim=0).to(image.dtype)
    out = F.conv2d(image, per_channel, None, padding=weight.shape[-1] // 2, groups=v.shape[-1])
    return out.permute(0, 2, 3, 1).reshape(v.shape)


def _attend(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    cells: tuple[int, int],
    pinv_iterations: int,
    scale: float | None,
    skip: Tensor | None,
) -> Tensor:
    """The Nyström mixture (+ skip) in at least float32, (B, N, C)."""
    batch, tokens, three_c = qkv.shape
    channels = three_c // 3
    head_dim = channels // num_heads
    s = head_dim**-0.5 if scale is None else scale
    qkv = at_least_float32(qkv)
    landmarks = cell_means(qkv[..., : 2 * channels], hw, cells)  # (B, m, 2C): q̃ | k̃ of every head at once
    q, k, v = qkv.reshape(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)  # (B, h, N, d)
    count = cells[0] * cells[1]
    q_landmarks, k_landmarks = landmarks.reshape(batch, count, 2, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    a = torch.softmax(torch.matmul(q_landmarks, k_landmarks.transpose(-2, -1)) * s, dim=-1)  # (B, h, m, m)
    landmark_values = F.scaled_dot_product_attention(q_landmarks, k, v, scale=s)  # B v: (B, h, m, d)
    mixed = torch.matmul(iterative_pseudo_inverse(a, pinv_iterations), landmark_values)  # A⁺ B v
    out = F.scaled_dot_product_attention(q, k_landmarks, mixed, scale=s)  # F A⁺ B v: (B, h, N, d)
    out = out.transpose(1, 2).reshape(batch, tokens, channels)
    if skip is not None:
        out = out + at_least_float32(skip)
    return out


def scriptable_nystrom_attention_qkv(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    landmark_grid: tuple[int, int],
    pinv_iterations: int,
    conv_weight: Tensor | None,
    scale: float | None,
) -> Tensor:
    """:func:`linvit.ops.nystrom_attention_qkv` with its checked arguments in order (``(qkv, *arguments)``, see
    `arguments.py`), which TorchScript can call (it has no keyword-only arguments); (B, N, C) in qkv's dtype."""
    channels = qkv.shape[-1] // 3
    cells = clamp_cells(landmark_grid, hw)
    skip: Tensor | None = None
    if conv_weight is not None:
        skip = head_conv_values(qkv[..., 2 * channels :], hw, conv_weight, num_heads)
    if torch.jit.is_scripting():
        out = _attend(qkv, hw, num_heads, cells, pinv_iterations, scale, skip)
    else:
        with torch.autocast(device_type=autocast_device_type(qkv), enabled=False):
            out = _attend(qkv, hw, num_heads, cells, pinv_iterations, scale, skip)
    return out.to(qkv.dtype)

"""Eager PyTorch Linformer on a qkv projection: the default on every device, and what TorchScript runs.

The math is the reference's (see `naive.py`): keys and values projected along the token axis (two GEMMs with the
learned (k, N) projections, read in place from the strided qkv output, or one adaptive average pool over k|v in
token layout), then one `F.scaled_dot_product_attention` of all queries over the k projected tokens (fused kernels,
O(N·k) time, no N×k matrix kept). Everything after the qkv projection runs in at least float32 with autocast off
(sums over N tokens, and logits of large activations, overflow fp16).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._cells import cell_means, clamp_cells
from linvit.ops._numerics import at_least_float32, autocast_device_type

__all__ = ["scriptable_linformer_attention_qkv"]


def _project(
    qkv: Tensor,
    hw: tuple[int, int],
    key_projection: Tensor | None,
    value_projection: Tensor | None,
    pool_grid: tuple[int, int] | None,
) -> tuple[Tensor, Tensor]:
    """Keys and values projected along the token axis in at least float32, (B, k, C) each."""
    channels = qkv.shape[-1] // 3
    if pool_grid is not None:
        projected = cell_means(at_least_float32(qkv[..., channels:]), hw, clamp_cells(pool_grid, hw))  # K' | V'
        return projected[..., :channels], projected[..., channels:]
    assert key_projection is not None and value_projection is not None
    keys = torch.matmul(at_least_float32(key_projection), at_least_float32(qkv[..., channels : 2 * channels]))
    values = torch.matmul(at_least_float32(value_projection), at_least_float32(qkv[..., 2 * channels :]))
    return keys, values


def _attend(qkv: Tensor, keys: Tensor, values: Tensor, num_heads: int, dropout_p: float, scale: float | None) -> Tensor:
    """The queries of qkv over the projected keys and values in at least float32, (B, N, C)."""
    batch, tokens, three_c = qkv.shape
    channels = three_c // 3
    head_dim = channels // num_heads
    count = keys.shape[1]
    q = at_least_float32(qkv[..., :channels]).reshape(batch, tokens, num_heads, head_dim).transpose(1, 2)
    keys = keys.reshape(batch, count, num_heads, head_dim).transpose(1, 2)  # (B, h, k, d)
    values = values.reshape(batch, count, num_heads, head_dim).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, keys, values, dropout_p=dropout_p, scale=scale)
    return out.transpose(1, 2).reshape(batch, tokens, channels)


def scriptable_linformer_attention_qkv(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    key_projection: Tensor | None,
    value_projection: Tensor | None,
    pool_grid: tuple[int, int] | None,
    dropout_p: float,
    scale: float | None,
) -> Tensor:
    """:func:`linvit.ops.linformer_attention_qkv` with its checked arguments in order (``(qkv, *arguments)``, see
    `arguments.py`), which TorchScript can call (it has no keyword-only arguments); (B, N, C) in qkv's dtype."""
    if torch.jit.is_scripting():
        keys, values = _project(qkv, hw, key_projection, value_projection, pool_grid)
        out = _attend(qkv, keys, values, num_heads, dropout_p, scale)
    else:
        with torch.autocast(device_type=autocast_device_type(qkv), enabled=False):
            keys, values = _project(qkv, hw, key_projection, value_projection, pool_grid)
            out = _attend(qkv, keys, values, num_heads, dropout_p, scale)
    return out.to(qkv.dtype)

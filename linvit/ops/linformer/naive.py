"""The obviously correct Linformer on a qkv projection: the paper's steps, the attention matrix written out.

Wang et al., "Linformer: Self-Attention with Linear Complexity" (2020). Slow and kept that way on purpose: the torch
backend is tested against it. Computes in float64 for float64 input and in float32 otherwise, with autocast off.

For each batch element, with q, k, v (N, C) from the projection, split into h heads of d channels:
1. keys and values projected along the token axis to k ≪ N rows, shared by the heads (the paper's headwise sharing):
   - learned: K' = E K, V' = F V with E, F (k, N) (the caller resizes them to the grid, see
     `linvit.attention.LinformerAttention`);
   - pooled: K', V' the means of K and V over the cells of a (kh, kw) grid on the (H, W) map (k = kh·kw, the grid
     clamped to the map; :mod:`linvit.ops._cells`);
2. per head, P = softmax(q K'ᵀ s) (N×k), s = d^-1/2 (or the given scale), dropout on P;
3. o = P V'.
With E = F = I (k = N), or a pooled grid as large as the map (one token per cell), K' = K, V' = V and o is softmax
attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._cells import cell_means_reference, clamp_cells
from linvit.ops._reference import merge_heads, reference_precision, split_heads
from linvit.ops.linformer.arguments import LinformerArguments

__all__ = ["linformer_attention_qkv"]


@reference_precision
def linformer_attention_qkv(qkv: Tensor, arguments: LinformerArguments) -> Tensor:
    """The steps above on qkv (B, N, 3C) with the checked arguments of :func:`linvit.ops.linformer_attention_qkv`
    (whose ``backend="naive"`` calls this); (B, N, C) in qkv's dtype."""
    hw, num_heads, key_projection, value_projection, pool_grid, dropout_p, scale = arguments
    s = (qkv.shape[-1] // 3 // num_heads) ** -0.5 if scale is None else scale
    q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
    if pool_grid is not None:
        cells = clamp_cells(pool_grid, hw)
        k, v = cell_means_reference(k, hw, cells), cell_means_reference(v, hw, cells)
    else:
        assert key_projection is not None and value_projection is not None
        k = torch.einsum("pn,bnc->bpc", key_projection.to(qkv.dtype), k)
        v = torch.einsum("pn,bnc->bpc", value_projection.to(qkv.dtype), v)
    q, k, v = split_heads(q, num_heads), split_heads(k, num_heads), split_heads(v, num_heads)
    probabilities = torch.softmax(q @ k.transpose(-2, -1) * s, dim=-1)  # (B, h, N, k)
    if dropout_p > 0:
        probabilities = F.dropout(probabilities, dropout_p)
    return merge_heads(probabilities @ v)

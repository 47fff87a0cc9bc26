"""Attention distributions of focused linear, plain linear (ReLU, ELU+1) and softmax attention, and their rank.

Linear attention never forms its N×N attention matrix: it computes φ(Q)(φ(K)ᵀV) in O(N). To *look* at what a
kernel attends to, this module materialises rows of that matrix explicitly,

    A_ij = φ(q_i)·φ(k_j) / Σ_l φ(q_i)·φ(k_l)        (softmax: A_ij = softmax_j(q_i·k_j / √d)),

which is a visualisation, not the computation path: one row costs O(N·d), a whole matrix O(N²·d) and is only
built here for small N (rank plots). The kernel maps are :mod:`linvit.attention`'s own.

Rank (FLatten, Sec. 4.2): A of a linear kernel is φ(Q)φ(K)ᵀ scaled per row, so rank(A) ≤ d, the feature dimension,
however large N is; softmax's exp does not factorise and its A is (numerically) of much higher rank. The
depthwise convolution on V adds, for each channel c, a local N×N matrix M_c (the convolution written as a matrix),
so the block's effective attention for that channel is A + M_c, whose rank reaches N.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.attention import elu_feature_map, focused_feature_map, relu_feature_map

__all__ = [
    "VIZ_KERNELS",
    "KERNEL_LABELS",
    "kernel_features",
    "attention_row",
    "attention_matrix",
    "depthwise_conv_matrix",
    "numerical_rank",
    "perplexity",
]

VIZ_KERNELS = ("focused", "relu", "elu", "softmax")
KERNEL_LABELS = {
    "focused": "focused linear (FLatten, p={p:g})",
    "relu": "linear, ReLU kernel",
    "elu": "linear, ELU+1 kernel",
    "softmax": "softmax",
}


def kernel_features(x: Tensor, kernel: str, focusing_factor: float = 3.0, scale: Tensor | None = None) -> Tensor:
    """φ(x) of a linear kernel for tokens x (..., d), through :mod:`linvit.attention`'s feature maps."""
    if kernel == "focused":
        return focused_feature_map(x, scale, focusing_factor)
    if kernel == "relu":
        return relu_feature_map(x)
    if kernel == "elu":
        return elu_feature_map(x)
    raise ValueError(f"Unknown linear kernel {kernel!r}; expected one of focused, relu, elu (or softmax for rows).")


def _check_tokens(q: Tensor, k: Tensor) -> None:
    if q.dim() != 2 or k.dim() != 2 or q.shape != k.shape:
        raise ValueError(
            f"q and k must both be (N, d) token matrices of one head; got {tuple(q.shape)}, {tuple(k.shape)}."
        )


def attention_row(
    q: Tensor,
    k: Tensor,
    query_index: int,
    kernel: str,
    focusing_factor: float = 3.0,
    scale: Tensor | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """Row ``query_index`` of the N×N attention matrix of ``kernel`` for one head; (N,), sums to 1.

    For the linear kernels this is the O(N) row of the factorised form φ(Q)(φ(K)ᵀV) — materialised for display
    only — with linear attention's normaliser ``φ(q_i)·Σ_l φ(k_l) + eps``. q, k: (N, d); computed in float64.
    """
    _check_tokens(q, k)
    if not 0 <= query_index < q.shape[0]:
        raise ValueError(f"query_index {query_index} is outside 0..{q.shape[0] - 1}.")
    q, k = q.double(), k.double()
    if kernel == "softmax":
        return torch.softmax(k @ q[query_index] / math.sqrt(q.shape[-1]), dim=0)
    phi_q = kernel_features(q, kernel, focusing_factor, None if scale is None else scale.double())
    phi_k = kernel_features(k, kernel, focusing_factor, None if scale is None else scale.double())
    scores = phi_k @ phi_q[query_index]
    return scores / (scores.sum() + eps)


def attention_matrix(
    q: Tensor, k: Tensor, kernel: str, focusing_factor: float = 3.0, scale: Tensor | None = None, eps: float = 1e-6
) -> Tensor:
    """The whole N×N matrix (float64) of :func:`attention_row`, every row at once; O(N²) memory, small N only."""
    _check_tokens(q, k)
    q, k = q.double(), k.double()
    if kernel == "softmax":
        return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1)
    phi_q = kernel_features(q, kernel, focusing_factor, None if scale is None else scale.double())
    phi_k = kernel_features(k, kernel, focusing_factor, None if scale is None else scale.double())
    scores = phi_q @ phi_k.T
    return scores / (scores.sum(-1, keepdim=True) + eps)


def depthwise_conv_matrix(weight: Tensor, hw: tuple[int, int]) -> Tensor:
    """The N×N matrix M of one channel's zero-padded 'same' convolution with kernel ``weight`` (k, k) on an (H, W)
    grid, N = H·W, row-major tokens: ``conv(v) == M @ v.flatten()`` (bias excluded). Float64."""
    if weight.dim() != 2 or weight.shape[0] != weight.shape[1] or weight.shape[0] % 2 == 0:
        raise ValueError(f"weight must be an odd square (k, k) kernel; got {tuple(weight.shape)}.")
    height, width = hw
    radius = weight.shape[0] // 2
    n = height * width
    matrix = torch.zeros(n, n, dtype=torch.float64)
    rows = torch.arange(height).repeat_interleave(width)
    cols = torch.arange(width).repeat(height)
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            src_r, src_c = rows + dy, cols + dx
            valid = (src_r >= 0) & (src_r < height) & (src_c >= 0) & (src_c < width)
            targets = torch.nonzero(valid).squeeze(1)
            matrix[targets, src_r[valid] * width + src_c[valid]] = float(weight[dy + radius, dx + radius])
    return matrix


def numerical_rank(matrix: Tensor, rtol: float = 1e-10) -> int:
    """Number of singular values above ``rtol × σ_max`` (float64 SVD)."""
    singular_values = torch.linalg.svdvals(matrix.double())
    if singular_values.numel() == 0 or float(singular_values[0]) == 0.0:
        return 0
    return int((singular_values > rtol * singular_values[0]).sum())


def perplexity(row: Tensor) -> float:
    """exp(entropy) of a probability row: the number of tokens it effectively spreads over (1 = one-hot)."""
    p = row.double().clamp_min(0)
    p = p / p.sum()
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum()
    return float(torch.exp(entropy))


def standardize_tokens(features: Tensor) -> Tensor:
    """(C, H, W) map → (H·W, C) tokens, each standardised over its channels (a LayerNorm without affine)."""
    tokens = features.flatten(1).T.double()
    return F.layer_norm(tokens, tokens.shape[-1:])

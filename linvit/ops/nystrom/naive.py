"""The obviously correct Nyströmformer on a qkv projection: the paper's steps, every matrix written out.

Xiong et al., "Nyströmformer: A Nyström-based Algorithm for Approximating Self-Attention" (AAAI 2021). Slow and kept
that way on purpose: the torch backend is tested against it. Computes in float64 for float64 input and in float32
otherwise, with autocast off.

For each batch element and head, with q, k, v (N, d) from the projection and s = d^-1/2 (or the given scale):
1. landmarks: q̃, k̃ (m, d) are the means of q and k over the cells of an (mh, mw) grid on the (H, W) map
   (:mod:`linvit.ops._cells`; segment means of consecutive tokens on a sequence), the grid clamped to the map;
2. F = softmax(q k̃ᵀ s) (N×m), A = softmax(q̃ k̃ᵀ s) (m×m), B = softmax(q̃ kᵀ s) (m×N);
3. A⁺ by the paper's iteration (:func:`iterative_pseudo_inverse`);
4. o = F A⁺ (B v);
5. o = o + conv(v): each head's values, channel by channel as (H, W) images, through that head's k×k kernel (the
   paper's depthwise-convolution skip, a k×1 kernel along the sequence there; one kernel per head, shared by its d
   channels).
With m = N (one token per cell) q̃ = q, k̃ = k and F = A = B, so o = A A⁺ A v = A v: softmax attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._cells import cell_means_reference, clamp_cells
from linvit.ops._reference import merge_heads, reference_precision, split_heads
from linvit.ops.nystrom.arguments import NystromArguments

__all__ = ["iterative_pseudo_inverse", "nystrom_attention_qkv"]


def iterative_pseudo_inverse(a: Tensor, iterations: int) -> Tensor:
    """The Moore–Penrose pseudo-inverse of the (..., m, m) matrices ``a`` by the paper's iteration:

        Z₀ = aᵀ / (‖a‖₁ ‖a‖∞),   Z_{j+1} = ¼ Z_j (13I − a Z_j (15I − a Z_j (7I − a Z_j)))

    with ‖a‖₁ the largest column sum and ‖a‖∞ the largest row sum of |a|, per matrix (the authors' code offers this
    and, by default, the largest over the whole batch; per matrix, no sample's result depends on another's). The
    residual e = I − a Z falls as e → ¾e³ + ¼e⁴ per step; the paper uses 6 steps. A singular a (coinciding
    landmarks) converges to a⁺ on its range, but steps far past convergence start inverting the rounding noise.
    """
    identity = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    largest_column_sum = a.abs().sum(dim=-2).amax(dim=-1)[..., None, None]
    largest_row_sum = a.abs().sum(dim=-1).amax(dim=-1)[..., None, None]
    z = a.transpose(-2, -1) / (largest_column_sum * largest_row_sum)
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
    return z


@reference_precision
def nystrom_attention_qkv(qkv: Tensor, arguments: NystromArguments) -> Tensor:
    """The steps above on qkv (B, N, 3C) with the checked arguments of :func:`linvit.ops.nystrom_attention_qkv`
    (whose ``backend="naive"`` calls this); (B, N, C) in qkv's dtype."""
    hw, num_heads, landmark_grid, pinv_iterations, conv_weight, scale = arguments
    batch, tokens, three_c = qkv.shape
    head_dim = three_c // 3 // num_heads
    s = head_dim**-0.5 if scale is None else scale
    cells = clamp_cells(landmark_grid, hw)
    q, k, v = qkv.split(three_c // 3, dim=-1)
    q_landmarks = cell_means_reference(q, hw, cells)  # (B, m, C): the mean over the channels of every head
    k_landmarks = cell_means_reference(k, hw, cells)
    q, k, v, q_landmarks, k_landmarks = (split_heads(t, num_heads) for t in (q, k, v, q_landmarks, k_landmarks))
    f = torch.softmax(q @ k_landmarks.transpose(-2, -1) * s, dim=-1)  # (B, h, N, m)
    a = torch.softmax(q_landmarks @ k_landmarks.transpose(-2, -1) * s, dim=-1)  # (B, h, m, m)
    b = torch.softmax(q_landmarks @ k.transpose(-2, -1) * s, dim=-1)  # (B, h, m, N)
    out = f @ iterative_pseudo_inverse(a, pinv_iterations) @ (b @ v)  # (B, h, N, d)
    if conv_weight is not None:
        weight = conv_weight.to(qkv.dtype)
        for head in range(num_heads):
            images = v[:, head].transpose(1, 2).reshape(batch * head_dim, 1, hw[0], hw[1])  # one per channel
            local = F.conv2d(images, weight[head : head + 1], padding=weight.shape[-1] // 2)
            out[:, head] += local.reshape(batch, head_dim, tokens).transpose(1, 2)
    return merge_heads(out)

"""Non-causal linear attention on already-mapped queries and keys.

    out_i = φ(q_i)ᵀ S / (φ(q_i) · z + eps),   S = Σ_j φ(k_j) v_jᵀ / N,   z = Σ_j φ(k_j) / N

This is the "mean form" of the FLatten authors: S and z are averages over the N keys rather than sums, identical in
exact arithmetic (the 1/N cancels between numerator and denominator, up to eps) but free of the overflow that the
sums reach in fp16 at high resolution. With a key mask, N is the number of kept keys and masked keys add nothing.

Two entry points:
- `linear_attention(q, k, v, key_mask)`: the public functional core on (B, heads, N, d) tensors.
- `linear_attention_tokens(q, k, v, ...)`: the same mathematics on (B, N, heads, d) tensors, the token layout the
  attention modules hold (views of one qkv tensor); it lives with the eager backend of the ops layer
  (`linvit.ops.linear_attention.torch`), which also has the fused-from-qkv form `linvit.ops.linear_attention_qkv`.
"""

import torch
import torch.fx
from torch import Tensor

from linvit.ops._numerics import at_least_float32, full_precision_bmm
from linvit.ops.linear_attention.torch import linear_attention_tokens

__all__ = ["linear_attention", "linear_attention_tokens"]

# FX: record the float32 products as calls (their autocast guard needs a concrete device).
torch.fx.wrap("full_precision_bmm")
torch.fx.wrap("at_least_float32")


def linear_attention(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """Non-causal linear attention, mean form.

    Args:
        q: mapped queries φ(Q), (B, heads, N, d), non-negative (or at least with positive φ(q)·z).
        k: mapped keys φ(K), (B, heads, N, d).
        v: values, (B, heads, N, e).
        key_mask: optional (B, N) bool, True = keep. Masked keys (e.g. padding) take no part in S or z.
        eps: added to the normaliser φ(q)·z (the FLatten authors use 1e-6).

    Returns:
        (B, heads, N, e) in the dtype of `v`. S, z and the products are computed in at least float32.
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"linear_attention expects (B, heads, N, d) tensors, got q {q.shape}, k {k.shape}, "
            f"v {v.shape}; split heads first, e.g. x.view(B, N, heads, d).transpose(1, 2)."
        )
    out_dtype = v.dtype
    q = at_least_float32(q)
    k = at_least_float32(k)
    v = at_least_float32(v)
    n = k.shape[-2]
    if key_mask is not None:
        keep = key_mask[:, None, :, None]
        k = torch.where(keep, k, torch.zeros_like(k))
        v = torch.where(keep, v, torch.zeros_like(v))
        count = keep.to(k.dtype).sum(dim=2, keepdim=True).clamp_min(1.0)  # (B, 1, 1, 1)
        k_mean = k.sum(dim=2, keepdim=True) / count  # (B, h, 1, d)
        kv = full_precision_bmm(k.transpose(-2, -1), v) / count  # (B, h, d, e)
    else:
        k_mean = k.mean(dim=2, keepdim=True)
        kv = full_precision_bmm(k.transpose(-2, -1) * (n**-0.5), v * (n**-0.5))
    z = 1.0 / (full_precision_bmm(q, k_mean.transpose(-2, -1)) + eps)  # (B, h, N, 1)
    out = full_precision_bmm(q, kv) * z
    return out.to(out_dtype)

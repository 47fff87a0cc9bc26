"""Non-causal linear attention on already-mapped queries and keys.

    out_i = φ(q_i)ᵀ S / (φ(q_i) · z + eps),   S = Σ_j φ(k_j) v_jᵀ / N,   z = Σ_j φ(k_j) / N

This is the "mean form" of the FLatten authors: S and z are averages over the N keys rather than sums, identical in
exact arithmetic (the 1/N cancels between numerator and denominator, up to eps) but free of the overflow that the
sums reach in fp16 at high resolution. With a key mask, N is the number of kept keys and masked keys add nothing.

Two entry points:
- `linear_attention(q, k, v, key_mask)`: the public functional core on (B, heads, N, d) tensors.
- `linear_attention_tokens(q, k, v, num_heads, ...)`: the same mathematics on (B, N, heads·d) token tensors, which
  is how the attention modules hold them. It avoids the head split / merge copies that dominate the run time of
  the straightforward formulation (see `_blockwise` below).
"""

import torch
import torch.fx
from torch import Tensor

from linvit.attention._numerics import at_least_float32, full_precision_bmm

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
            f"linear_attention expects (B, heads, N, d) tensors, got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}; split heads first, e.g. x.view(B, N, heads, d).transpose(1, 2)."
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


def linear_attention_tokens(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    num_heads: int,
    key_mask: Tensor | None = None,
    query_scale: Tensor | None = None,
    eps: float = 1e-6,
    blockwise: bool | None = None,
) -> Tensor:
    """Linear attention on token tensors, heads packed in the channel dimension.

    Args:
        q: mapped queries, (B, N, heads·m), head-major channels (channel c belongs to head c // m).
        k: mapped keys, (B, N, heads·m).
        v: values, (B, N, heads·e).
        num_heads: number of heads.
        key_mask: optional (B, N) bool, True = keep.
        query_scale: optional (B, N, 1) positive per-token factor α that multiplies q. It is applied to the two
            products instead of to q (α(qS) / (α(q·z) + eps) == (αq)S / ((αq)·z + eps)), which saves a full pass
            over q; the focusing map produces such a factor.
        eps: added to the normaliser.
        blockwise: True = all heads in one GEMM against a block-diagonal state (h× the flops of the per-head
            products, but no head split/merge copies and the output lands directly in (B, N, C)); False = per-head
            batched products. None picks blockwise for up to 4 heads, where the saved copies outweigh the flops.

    Returns:
        (B, N, heads·e) in at least float32 (callers cast back).
    """
    q = at_least_float32(q)
    k = at_least_float32(k)
    v = at_least_float32(v)
    if key_mask is not None:
        keep = key_mask.unsqueeze(-1)
        k = torch.where(keep, k, torch.zeros_like(k))
        v = torch.where(keep, v, torch.zeros_like(v))
        count = keep.to(k.dtype).sum(dim=1, keepdim=True).clamp_min(1.0)  # (B, 1, 1)
    else:
        count = torch.full((1, 1, 1), float(k.shape[1]), dtype=k.dtype, device=k.device)
    if blockwise is None:
        blockwise = num_heads <= 4
    if blockwise:
        num, den = _blockwise(q, k, v, num_heads, count)
    else:
        num, den = _per_head(q, k, v, num_heads, count)
    # num: (B, N, h, e), den: (B, N, h, 1)
    if query_scale is not None:
        scale = query_scale.unsqueeze(-1)
        z = scale / (den * scale + eps)
    else:
        z = 1.0 / (den + eps)
    return (num * z).flatten(2)


def _blockwise(q: Tensor, k: Tensor, v: Tensor, num_heads: int, count: Tensor):
    """All heads in two GEMMs against a block-diagonal state; no head split copies.

    kᵀv over all channels gives every head's S on the diagonal blocks (the off-diagonal blocks are discarded);
    the head means of k are appended as extra columns so that q·z of every head comes out of the same GEMM.
    """
    batch, tokens, qk_dim = q.shape
    v_dim = v.shape[-1]
    m = qk_dim // num_heads
    e = v_dim // num_heads
    head_of_qk = torch.arange(qk_dim, device=q.device) // m
    head_of_v = torch.arange(v_dim, device=q.device) // e
    heads = torch.arange(num_heads, device=q.device)
    block = (head_of_qk.unsqueeze(1) == head_of_v.unsqueeze(0)).to(q.dtype)  # (qk_dim, v_dim)
    head_columns = (head_of_qk.unsqueeze(1) == heads.unsqueeze(0)).to(q.dtype)  # (qk_dim, h)
    k_mean = k.sum(dim=1).unsqueeze(-1) / count  # (B, qk_dim, 1)
    kv = full_precision_bmm(k.transpose(1, 2), v) * (block / count)  # (B, qk_dim, v_dim)
    state = torch.cat([kv, k_mean * head_columns], dim=-1)  # (B, qk_dim, v_dim + h)
    out = full_precision_bmm(q, state)  # (B, N, v_dim + h)
    num = out[:, :, :v_dim].unflatten(-1, (num_heads, e))
    den = out[:, :, v_dim:].unsqueeze(-1)
    return num, den


def _per_head(q: Tensor, k: Tensor, v: Tensor, num_heads: int, count: Tensor):
    """Per-head batched products (for many heads, where the block-diagonal GEMM would waste too many flops)."""
    batch, tokens, qk_dim = q.shape
    qh = q.unflatten(-1, (num_heads, qk_dim // num_heads)).transpose(1, 2)  # (B, h, N, m)
    kh = k.unflatten(-1, (num_heads, qk_dim // num_heads)).transpose(1, 2)
    vh = v.unflatten(-1, (num_heads, v.shape[-1] // num_heads)).transpose(1, 2)  # (B, h, N, e)
    count4 = count.unsqueeze(1)
    kv = full_precision_bmm(kh.transpose(-2, -1), vh) / count4  # (B, h, m, e)
    k_mean = kh.sum(dim=2).unsqueeze(-1) / count4  # (B, h, m, 1)
    num = full_precision_bmm(qh, kv).transpose(1, 2)  # (B, N, h, e)
    den = full_precision_bmm(qh, k_mean).transpose(1, 2)  # (B, N, h, 1)
    return num, den

"""Non-causal linear attention on already-mapped queries and keys.

    out_i = φ(q_i)ᵀ S / (φ(q_i) · z + eps),   S = Σ_j φ(k_j) v_jᵀ / N,   z = Σ_j φ(k_j) / N

This is the "mean form" of the FLatten authors: S and z are averages over the N keys rather than sums, identical in
exact arithmetic (the 1/N cancels between numerator and denominator, up to eps) but free of the overflow that the
sums reach in fp16 at high resolution. With a key mask, N is the number of kept keys and masked keys add nothing.

Two entry points:
- `linear_attention(q, k, v, key_mask)`: the public functional core on (B, heads, N, d) tensors.
- `linear_attention_tokens(q, k, v, ...)`: the same mathematics on (B, N, heads, d) tensors, the token layout the
  attention modules hold (views of one qkv tensor). It avoids the permute/contiguous copies that dominate the run
  time of the straightforward formulation: the per-head GEMMs read the strided views in place and the result comes
  out in token layout.
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


def linear_attention_tokens(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_mask: Tensor | None = None,
    query_scale: Tensor | None = None,
    eps: float = 1e-6,
    residual: Tensor | None = None,
    residual_in_place: bool = False,
) -> Tensor:
    """Linear attention in token layout, heads next to channels: the layout attention modules hold tensors in.

    Per (batch, head): S = kᵀv / N (m×e), z = mean_N(k); out = q S / (q·z + eps). The normaliser comes out of the
    same GEMM as the numerator (z is appended to S as one more column). The inputs may be strided views of one qkv
    tensor (B, N, 3C) split into heads: the per-head GEMMs read them in place.

    Args:
        q: mapped queries, (B, N, heads, m).
        k: mapped keys, (B, N, heads, m).
        v: values, (B, N, heads, e).
        key_mask: optional (B, N) bool, True = keep; masked keys take no part in S or z.
        query_scale: optional (B, N, 1, 1) positive per-token factor α that multiplies q. It is applied to the
            small products instead of to q (α(qS) / (α(q·z) + eps) == (αq)S / ((αq)·z + eps)), which saves a full
            pass over q; the focusing map produces such a factor.
        eps: added to the normaliser.
        residual: optional (B, N, heads, e) tensor added to the output in the same pass (e.g. FLatten's DWC(v)).
        residual_in_place: accumulate into `residual` itself (when it is float32 or float64) instead of a new
            tensor; for callers that own it (saves one large allocation).

    Returns:
        (B, N, heads, e), contiguous, in at least float32 (callers cast back).
    """
    q = at_least_float32(q)
    k = at_least_float32(k)
    v = at_least_float32(v)
    if key_mask is not None:
        keep = key_mask[:, :, None, None]
        k = torch.where(keep, k, torch.zeros_like(k))
        v = torch.where(keep, v, torch.zeros_like(v))
    kv = full_precision_bmm(k.permute(0, 2, 3, 1), v.transpose(1, 2))  # (B, h, m, e): Σ k vᵀ
    state = torch.cat([kv, k.sum(dim=1, keepdim=True).permute(0, 2, 3, 1)], dim=-1)  # (B, h, m, e + 1): [S | z]·N
    # the mean form: S and z over the number of (kept) keys, in one pass over the small state
    if key_mask is not None:
        state = state / key_mask.to(state.dtype).sum(dim=1).clamp_min(1.0).view(-1, 1, 1, 1)
    else:
        state = state * (1.0 / k.shape[1])
    out = full_precision_bmm(q.transpose(1, 2), state).transpose(1, 2)  # (B, N, h, e + 1), a view
    num = out[..., :-1]
    den = out[..., -1:]
    if query_scale is not None:
        z = query_scale / (den * query_scale + eps)
    else:
        z = 1.0 / (den + eps)
    # num is a view of the GEMM output (B, h, N, e + 1): one pass reads it and writes token layout.
    if residual is not None:
        base = at_least_float32(residual)
        if residual_in_place:
            return base.addcmul_(num, z)
        return torch.addcmul(base, num, z)
    return (num * z).contiguous()

"""Eager PyTorch linear attention on a qkv projection: the CPU default, and what TorchScript runs.

The math is the reference's (see `naive.py`); the layout is what makes it fast on a CPU. Everything stays in token
layout (B, N, C), the layout the qkv and output projections want: q, k, v are strided views of the qkv output; the
heads are views (B, N, h, d) that the per-head GEMMs of `linear_attention_tokens` read in place, whose result comes
back in token layout; the focusing norms run over the contiguous last dimension; and v is a channels-last image for
the DWC, which runs as one depthwise conv over all C channels with the shared (d, 1, k, k) kernel tiled over the
heads (channel head·d + j uses kernel j: exactly the per-head conv of the reference). The reference's permute
copies between (B, N, C), (B, h, N, d) and (B·h, d, H, W), which cost as much as its matmuls on a CPU, are gone.

With autograd off and ``prescaled`` q|k (the caller folded the map's shift and temperature into the projection and
hands over the buffer), the focused map runs in place on q|k, and the attention output is accumulated into the DWC
output, so inference allocates few large temporaries (on CPUs each new large block can page-fault again, which
costs as much as the arithmetic). With autograd on, the map runs out of place, in the order whose backward is
cheapest (relu's backward is one masked pass; a tensor maximum's is not).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._numerics import at_least_float32, autocast_device_type, full_precision_bmm

__all__ = [
    "channels_last_image",
    "depthwise_conv_values",
    "linear_attention_tokens",
    "scale_queries_keys",
]


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
    """Linear attention on mapped q, k in token layout, heads next to channels: the layout attention modules hold.

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
    keys = k.permute(0, 2, 3, 1)  # (B, h, m, N)
    kv = full_precision_bmm(keys, v.transpose(1, 2))  # (B, h, m, e): Σ k vᵀ
    # z sums the keys along their last axis: an exported graph reduces the product's own transposed input over its
    # contiguous axis (ONNX Runtime's ReduceSum over the token axis of (B, N, h, m) took 9 ms a block at 1024²)
    state = torch.cat([kv, keys.sum(dim=-1, keepdim=True)], dim=-1)  # (B, h, m, e + 1): [S | z]·N
    # the mean form: S and z over the number of (kept) keys, in one pass over the small state
    if key_mask is not None:
        state = state / key_mask.to(state.dtype).sum(dim=1).clamp_min(1.0).view(key_mask.shape[0], 1, 1, 1)
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


def scale_queries_keys(qk: Tensor, inverse_temperature: Tensor, feature_eps: float) -> Tensor:
    """(q|k + eps) / s for the raw (B, n, 2C) q|k, as a new tensor in at least float32 (one pass)."""
    inverse = at_least_float32(inverse_temperature).repeat(2)
    return torch.addcmul(inverse * feature_eps, qk, inverse)


def _focused_features(
    qk: Tensor, key_position: Tensor | None, inverse: Tensor, power: float, feature_eps: float, prescaled: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The focused map of q and k: returns (q^p, k^p · α_k, α_q), α = ‖a‖ / ‖a^p‖ per token (see `naive.py`)."""
    channels = qk.shape[-1] // 2
    in_place = prescaled and not torch.is_grad_enabled()
    if in_place:
        # q|k = (x + eps) / s is the caller's buffer: the map runs in place, on both halves in each pass;
        # relu(x) + eps, over s, is max((x + eps) / s, eps / s) for s > 0
        if key_position is not None:
            qk[..., channels:].addcmul_(key_position, inverse)
        qk = qk.clamp_min_((inverse * feature_eps).repeat(2))
        q, k = qk[..., :channels], qk[..., channels:]
        q_norm = torch.linalg.vector_norm(q, ord=2, dim=-1, keepdim=True)  # on (B, n, C) views: a reduction over
        k_norm = torch.linalg.vector_norm(k, ord=2, dim=-1, keepdim=True)  # (B, n, 2, C) is far slower on CPUs
        if power != 1.0:
            qk.pow_(power)
    else:
        q, k = qk.unflatten(-1, (2, channels)).unbind(-2)
        if prescaled:
            if key_position is not None:
                k = k + key_position * inverse
            floor = inverse * feature_eps
            q, k = torch.maximum(q, floor), torch.maximum(k, floor)
        else:
            if key_position is not None:
                k = k + key_position
            q = (F.relu(q) + feature_eps) * inverse
            k = (F.relu(k) + feature_eps) * inverse
        q_norm = torch.linalg.vector_norm(q, ord=2, dim=-1, keepdim=True)
        k_norm = torch.linalg.vector_norm(k, ord=2, dim=-1, keepdim=True)
        if power != 1.0:
            q, k = q.pow(power), k.pow(power)
    q_factor = q_norm / torch.linalg.vector_norm(q, ord=2, dim=-1, keepdim=True)  # (B, n, 1)
    k_factor = k_norm / torch.linalg.vector_norm(k, ord=2, dim=-1, keepdim=True)
    # q's factor folds into the small per-token normaliser; k's must scale k itself (it is summed over tokens)
    k = k.mul_(k_factor) if in_place else k * k_factor
    return q, k, q_factor


def channels_last_image(x: Tensor, hw: tuple[int, int], key_mask: Tensor | None) -> Tensor:
    """(B, n, C) tokens -> (B, C, H, W) image in channels-last memory (a view of a dense copy of x).

    The dense copy (x is usually a strided slice of the qkv output) is what a depthwise conv wants: it is cheap
    (rows of C contiguous values) and lets the conv run channels-last without a transpose. Masked (padded) tokens
    are zeroed, so they act like the conv's own zero padding.
    """
    if key_mask is not None:
        x = x * key_mask.unsqueeze(-1).to(x.dtype)
    else:
        x = x.contiguous()
    image = x.view(x.shape[0], hw[0], hw[1], x.shape[-1]).permute(0, 3, 1, 2)
    if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
        if torch.compiler.is_exporting():  # a channels-last conv input makes torch.export specialise the batch size
            image = image.contiguous()
    return image


def depthwise_conv_values(
    v: Tensor,
    hw: tuple[int, int],
    key_mask: Tensor | None,
    weight: Tensor,
    bias: Tensor | None,
    num_heads: int,
) -> Tensor:
    """DWC(v) for v (B, n, C) on an (H, W) grid with one (d, 1, k, k) conv shared by the heads, as one conv over all
    C channels (the kernel tiled h times: channel head·d + j uses kernel j, exactly the per-head conv), in token
    layout (B, n, C)."""
    image = channels_last_image(v, hw, key_mask)
    tiled_weight = weight.repeat(num_heads, 1, 1, 1).to(image.dtype)
    tiled_bias: Tensor | None = None
    if bias is not None:
        tiled_bias = bias.repeat(num_heads).to(image.dtype)
    out = F.conv2d(image, tiled_weight, tiled_bias, padding=weight.shape[-1] // 2, groups=v.shape[-1])
    return out.permute(0, 2, 3, 1).reshape(v.shape)


def _prefixed(x: Tensor, prefix: int, batch: int) -> Tensor:
    """(B or 1, n, C) values of the spatial tokens -> (B or 1, prefix + n, C), zeros for the prefix tokens."""
    if prefix == 0:
        return x
    zeros = x.new_zeros(x.shape[0], prefix, x.shape[-1])
    return torch.cat([zeros, x], dim=1)


def _attend(
    qkv: Tensor,
    num_heads: int,
    feature_map: str,
    inverse_temperature: Tensor | None,
    focusing_factor: float,
    key_position: Tensor | None,
    key_mask: Tensor | None,
    eps: float,
    feature_eps: float,
    prescaled: bool,
    residual: Tensor | None,
) -> Tensor:
    """The attention mixture (+ residual) in at least float32, (B, N, C)."""
    batch, tokens, three_c = qkv.shape
    channels = three_c // 3
    heads = (batch, tokens, num_heads, channels // num_heads)
    qk, v = qkv.split([2 * channels, channels], dim=-1)
    v = at_least_float32(v)
    if residual is not None:
        residual = residual.view(heads)
    if feature_map == "focused":
        assert inverse_temperature is not None
        inverse = at_least_float32(inverse_temperature)
        if not prescaled and not torch.is_grad_enabled():
            qk = scale_queries_keys(qk, inverse, feature_eps)  # a float32 buffer of this call's own: mapped in place
            prescaled = True
        qk = at_least_float32(qk)
        if key_position is not None:
            key_position = at_least_float32(key_position)
        q, k, q_factor = _focused_features(qk, key_position, inverse, focusing_factor, feature_eps, prescaled)
        out = linear_attention_tokens(
            q.view(heads), k.view(heads), v.view(heads), key_mask, q_factor.unsqueeze(-1), eps, residual, True
        )
    else:
        q, k = at_least_float32(qk).split([channels, channels], dim=-1)
        if key_position is not None:
            k = k + at_least_float32(key_position)
        if feature_map == "relu":
            q, k = F.relu(q), F.relu(k)
        else:
            q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
        out = linear_attention_tokens(
            q.reshape(heads), k.reshape(heads), v.view(heads), key_mask, None, eps, residual, True
        )
    return out.view(batch, tokens, channels)


def scriptable_linear_attention_qkv(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    feature_map: str,
    inverse_temperature: Tensor | None,
    focusing_factor: float,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    dwc_bias: Tensor | None,
    key_mask: Tensor | None,
    num_prefix_tokens: int,
    eps: float,
    feature_eps: float,
    prescaled: bool,
) -> Tensor:
    """:func:`linvit.ops.linear_attention_qkv` with its checked arguments in order (``(qkv, *arguments)``, see
    `arguments.py`), which TorchScript can call (it has no keyword-only arguments); (B, N, C) in qkv's dtype.

    With ``prescaled`` and autograd off, q|k of ``qkv`` are overwritten (the caller's own buffer).
    """
    batch, tokens, three_c = qkv.shape
    channels = three_c // 3
    prefix = num_prefix_tokens
    residual: Tensor | None = None
    if dwc_weight is not None:  # in the caller's precision (a conv under autocast), added inside the last pass
        spatial_mask = None if key_mask is None else key_mask[:, prefix:]
        local = depthwise_conv_values(
            qkv[:, prefix:, 2 * channels :], hw, spatial_mask, dwc_weight, dwc_bias, num_heads
        )
        residual = at_least_float32(_prefixed(local, prefix, batch))
    if key_position is not None:
        key_position = _prefixed(key_position.reshape(-1, tokens - prefix, channels), prefix, batch)
    if torch.jit.is_scripting():
        out = _attend(
            qkv, num_heads, feature_map, inverse_temperature, focusing_factor, key_position, key_mask, eps,
            feature_eps, prescaled, residual,
        )  # fmt: skip
    else:
        with torch.autocast(device_type=autocast_device_type(qkv), enabled=False):
            out = _attend(
                qkv, num_heads, feature_map, inverse_temperature, focusing_factor, key_position, key_mask, eps,
                feature_eps, prescaled, residual,
            )  # fmt: skip
    return out.to(qkv.dtype)

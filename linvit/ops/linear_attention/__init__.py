"""Non-causal linear attention straight from a qkv projection: focused (FLatten), ReLU and ELU+1 feature maps.

One keyword-only signature, three implementations (see :mod:`linvit.ops._backend`): `naive.py` (the reference),
`torch.py` (eager) and `triton.py` (fused kernels, torch custom ops). The entry here checks and normalises the
arguments once (`arguments.py`) and hands the backend one :class:`LinearAttentionArguments`.
"""

from __future__ import annotations

from torch import Tensor

from linvit.ops._backend import resolve_backend
from linvit.ops.linear_attention import naive
from linvit.ops.linear_attention import torch as eager
from linvit.ops.linear_attention.arguments import (
    FEATURE_MAPS,
    LinearAttentionArguments,
    boolean_key_mask,
    checked_arguments,
    checked_window,
    inverse_of_scale,
)
from linvit.ops.windows import merge_windows, window_keys

__all__ = ["FEATURE_MAPS", "LinearAttentionArguments", "boolean_key_mask", "linear_attention_qkv"]


def linear_attention_qkv(
    qkv: Tensor,
    *,
    hw: tuple[int, int],
    num_heads: int,
    feature_map: str = "focused",
    inverse_temperature: Tensor | None = None,
    focusing_factor: float = 3.0,
    key_position: Tensor | None = None,
    dwc_weight: Tensor | None = None,
    dwc_bias: Tensor | None = None,
    key_mask: Tensor | None = None,
    num_prefix_tokens: int = 0,
    eps: float = 1e-6,
    feature_eps: float = 1e-6,
    prescaled: bool = False,
    window: tuple[int, int] | None = None,
    temperature_scale: Tensor | None = None,
    backend: str = "auto",
) -> Tensor:
    """Non-causal (mean-form) linear attention of the tokens of ``qkv``, plus the DWC of the values; (B, N, C).

    The math, step by step, is in :mod:`linvit.ops.linear_attention.naive`. S and z, the feature maps and the
    normalisation are computed in at least float32 (autocast off); the output has qkv's dtype.

    Args:
        qkv: (B, N, 3C), q | k | v along the last dimension: the qkv projection's output (any strides).
        hw: (H, W) of the N - num_prefix_tokens spatial tokens (row-major), for the DWC.
        num_heads: h; the head dimension is d = C / h.
        feature_map: "focused" (FLatten: ReLU + eps, temperature, focusing power with the norms over all C
            channels), "relu" or "elu" (elu + 1).
        inverse_temperature: (C,) 1 / softplus(scale), the focused map's temperature (focused only); or give
            ``temperature_scale`` instead.
        focusing_factor: the focusing power p.
        key_position: (N - prefix, C), or (B, N - prefix, C), added to the keys of the spatial tokens before the map.
        dwc_weight, dwc_bias: (d, 1, k, k) and (d,): the depthwise conv of v shared by the heads, added to the
            output of the spatial tokens; None for none.
        key_mask: (B, N) bool, True = keep (0/1 integers are taken as bool; other dtypes are an error); masked keys
            (padding) take no part in S and z, and masked values are zero for the DWC.
        num_prefix_tokens: leading tokens (class tokens) that attend and are attended to but have no position: no
            key_position, no DWC.
        eps: added to the normaliser φ(q)·z; feature_eps: added after the ReLU of the focused map.
        prescaled: q|k already hold (x + feature_eps) / s (the caller folded the shift and temperature into the
            projection). The caller hands over the buffer: with autograd off the torch backend maps it in place.
        window: (h, w) for attention within the non-overlapping windows of the map (padded at the bottom and right
            to whole windows; the padding holds no token: no key, no value for the DWC, no output), each window with
            its own S, z and DWC; None (or the whole map) for global attention. key_position is then one row per
            window token, (h·w, C) or (B·windows, h·w, C) for windows in image-major, row-major order; no prefix
            tokens, no key_mask. The fused kernels read the windows in place; the other backends partition.
        temperature_scale: (C,) the focused map's temperature parameter itself, instead of inverse_temperature: the
            fused kernels take 1 / softplus of it as they load it, and its gradient in the sum they end with (no
            torch launches around them); the other backends compute the inverse first.
        backend: "auto", "torch", "triton" or "naive" (see :mod:`linvit.ops`).
    """
    given = LinearAttentionArguments(
        hw, num_heads, feature_map, inverse_temperature, focusing_factor, key_position, dwc_weight, dwc_bias,
        key_mask, num_prefix_tokens, eps, feature_eps, prescaled, temperature_scale,
    )  # fmt: skip
    window = checked_window(window, given)
    arguments = checked_arguments(qkv, given, window)
    name = resolve_backend(backend, qkv.device)
    if name == "triton" and qkv.numel() > 0:  # an empty batch launches nothing: the eager path returns it
        from linvit.ops.linear_attention import triton as fused

        return fused.linear_attention_qkv(qkv, arguments, window)
    if window is not None:  # the reference form: partition, attend in each window, merge
        windows, valid = window_keys(qkv, arguments.hw, window)
        out = _unfused(name, windows, arguments._replace(hw=window, key_mask=valid))
        return merge_windows(out, qkv.shape[0], arguments.hw, window, (0, 0))
    return _unfused(name, qkv, arguments)


def _unfused(name: str, qkv: Tensor, arguments: LinearAttentionArguments) -> Tensor:
    """The naive or the eager backend on checked arguments (a temperature_scale turned into the inverse first)."""
    if arguments.temperature_scale is not None:
        inverse = inverse_of_scale(arguments.temperature_scale)
        arguments = arguments._replace(inverse_temperature=inverse, temperature_scale=None)
    if name == "naive":
        return naive.linear_attention_qkv(qkv, arguments)
    return eager.scriptable_linear_attention_qkv(qkv, *arguments[:-1])  # TorchScript's signature: no scale

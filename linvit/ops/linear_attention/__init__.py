"""Non-causal linear attention straight from a qkv projection: focused (FLatten), ReLU and ELU+1 feature maps.

One keyword-only signature, three implementations (see :mod:`linvit.ops._backend`): `naive.py` (the reference),
`torch.py` (eager) and `triton.py` (fused kernels, torch custom ops). (Importing the submodule `torch` binds that
name in this package: this file uses only names imported from torch, never `torch.` itself.)
"""

from __future__ import annotations

from torch import SymInt, Tensor
from torch import bool as torch_bool

from linvit.ops._backend import resolve_backend
from linvit.ops.linear_attention import naive
from linvit.ops.linear_attention import torch as eager

__all__ = ["FEATURE_MAPS", "boolean_key_mask", "linear_attention_qkv"]

FEATURE_MAPS: tuple[str, ...] = ("focused", "relu", "elu")


def _check(
    qkv: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    feature_map: str,
    inverse_temperature: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    key_mask: Tensor | None,
    num_prefix_tokens: int,
) -> None:
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"Unknown feature_map {feature_map!r}; valid ones are {', '.join(FEATURE_MAPS)}.")
    if qkv.dim() != 3 or qkv.shape[-1] % 3 != 0 or (qkv.shape[-1] // 3) % num_heads != 0:
        raise ValueError(
            f"qkv must be (B, N, 3C) with C divisible by num_heads={num_heads} (a qkv projection's output), got "
            f"{tuple(qkv.shape)}."
        )
    channels = qkv.shape[-1] // 3
    spatial = qkv.shape[1] - num_prefix_tokens
    if spatial != hw[0] * hw[1]:
        raise ValueError(
            f"hw={tuple(hw)} gives {hw[0] * hw[1]} tokens but qkv has {qkv.shape[1]} tokens with "
            f"num_prefix_tokens={num_prefix_tokens}; N must be num_prefix_tokens + H * W."
        )
    if (feature_map == "focused") != (inverse_temperature is not None):
        raise ValueError(
            "inverse_temperature (1 / softplus(scale), shape (C,)) is required for feature_map='focused' and "
            f"only for it; got feature_map={feature_map!r} with inverse_temperature "
            f"{'given' if inverse_temperature is not None else 'None'}."
        )
    if inverse_temperature is not None and inverse_temperature.shape != (channels,):
        raise ValueError(f"inverse_temperature must have shape ({channels},), got {tuple(inverse_temperature.shape)}.")
    if key_position is not None and key_position.shape[-2:] != (spatial, channels):
        raise ValueError(
            f"key_position must be ({spatial}, {channels}) or (B, {spatial}, {channels}) (one row per spatial token), "
            f"got {tuple(key_position.shape)}; resize a positional table to the grid first."
        )
    if dwc_weight is not None and (dwc_weight.dim() != 4 or dwc_weight.shape[0] * num_heads != channels):
        raise ValueError(
            f"dwc_weight must be (head_dim, 1, k, k) = ({channels // num_heads}, 1, k, k), shared by the heads; got "
            f"{tuple(dwc_weight.shape)}."
        )
    if key_mask is not None and key_mask.shape != qkv.shape[:2]:
        raise ValueError(f"key_mask must be (B, N) = {tuple(qkv.shape[:2])} bool, got {tuple(key_mask.shape)}.")


def boolean_key_mask(key_mask: Tensor | None) -> Tensor | None:
    """The key mask every backend receives: bool as given, 0/1 integers as bool (non-zero keeps); any other dtype is
    an error (a float mask is ambiguous: a soft weight or a threshold?). One check for all backends: the fused
    kernels read the mask's bytes, so an int32 or float mask would otherwise be silently misread."""
    if key_mask is None or key_mask.dtype == torch_bool:
        return key_mask
    if key_mask.dtype.is_floating_point or key_mask.dtype.is_complex:
        raise TypeError(
            f"key_mask must be bool (True = keep) or 0/1 integers, got {key_mask.dtype}; pass mask > 0.5 (or "
            "mask.bool()) for a float mask."
        )
    return key_mask != 0


def _grid(hw: tuple[int, int]) -> tuple[int, int]:
    """(H, W) as ints; symbolic sizes (torch.export with dynamic H and W) stay symbolic instead of specialising."""
    if isinstance(hw[0], SymInt) or isinstance(hw[1], SymInt):
        return hw[0], hw[1]
    return int(hw[0]), int(hw[1])


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
        inverse_temperature: (C,) 1 / softplus(scale), the focused map's temperature (focused only).
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
        backend: "auto", "torch", "triton" or "naive" (see :mod:`linvit.ops`).
    """
    _check(qkv, hw, num_heads, feature_map, inverse_temperature, key_position, dwc_weight, key_mask, num_prefix_tokens)
    key_mask = boolean_key_mask(key_mask)
    arguments = {
        "hw": _grid(hw),
        "num_heads": num_heads,
        "feature_map": feature_map,
        "inverse_temperature": inverse_temperature,
        "focusing_factor": float(focusing_factor),
        "key_position": key_position,
        "dwc_weight": dwc_weight,
        "dwc_bias": dwc_bias,
        "key_mask": key_mask,
        "num_prefix_tokens": num_prefix_tokens,
        "eps": eps,
        "feature_eps": feature_eps,
        "prescaled": prescaled,
    }
    name = resolve_backend(backend, qkv.device)
    if name == "triton" and qkv.numel() > 0:  # an empty batch launches nothing: the eager path returns it
        from linvit.ops.linear_attention import triton as fused

        return fused.linear_attention_qkv(qkv, **arguments)
    if name == "naive":
        return naive.linear_attention_qkv(qkv, **arguments)
    return eager.linear_attention_qkv(qkv, **arguments)

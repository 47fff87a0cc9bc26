"""The whole computation of a `FocusedLinearAttention` module between its input tokens and its output projection:
one call, given the module's parameters.

    x ──(windows)──> qkv projection ──> key positions ──> feature maps, S, z, DWC ──(windows back)──> (B, N, C)

- windows: global attention, or non-overlapping windows clamped to the map (`linvit.ops.windows`, shared with
  window softmax), the map padded to whole windows, the padding holding no token: the core takes the window
  (`linear_attention_qkv(window=...)`; the fused kernels read the windows in place, the other backends partition by
  a gather); for the FAVOR+/Taylor cores and under TorchScript the tokens are partitioned here, before the
  projection, and the padded keys are masked out of S and z.
- qkv projection: with autograd off, in float32 and on the eager backend, the focused map's shift and temperature go
  into the projection, (x Wᵀ + b + eps) / s == x (W/s)ᵀ + (b + eps)/s (a 3C×C op on the weights instead of a pass
  over the queries and keys; not under fp16 autocast, where W/s could overflow), and the core maps that buffer in
  place.
- key positions: a learnable table resized to the window or map, or a depthwise conv of the keys.
- the core: `linvit.ops.linear_attention_qkv` (focused, ReLU, ELU+1 on any backend), or, for the feature maps with
  materialised features (FAVOR+, Taylor), the eager token-layout core. Under TorchScript the eager backend runs.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from linvit.ops._backend import resolve_backend
from linvit.ops._numerics import at_least_float32, autocast_device_type
from linvit.ops.linear_attention import linear_attention_qkv
from linvit.ops.linear_attention.arguments import inverse_of_scale
from linvit.ops.linear_attention.feature_maps import favor_feature_map, taylor_feature_map
from linvit.ops.linear_attention.torch import (
    channels_last_image,
    depthwise_conv_values,
    linear_attention_tokens,
    scriptable_linear_attention_qkv,
)
from linvit.ops.onednn import linear
from linvit.ops.positional import resize_positional_table
from linvit.ops.windows import (
    check_token_grid,
    clamp_window,
    exporting,
    merge_windows,
    symbolic_min,
    symbolic_window_layout,
    window_keys,
)

__all__ = ["MAPPED_FEATURE_MAPS", "focused_linear_attention"]

# feature maps whose features are materialised (wider than the head, or random): the eager core only
MAPPED_FEATURE_MAPS = ("favor", "taylor")


def focused_linear_attention(
    x: Tensor,
    hw: tuple[int, int],
    num_heads: int,
    qkv_weight: Tensor | None = None,
    qkv_bias: Tensor | None = None,
    window_size: tuple[int, int] | None = None,
    feature_map: str = "focused",
    scale: Tensor | None = None,
    focusing_factor: float = 3.0,
    random_features: Tensor | None = None,
    position_table: Tensor | None = None,
    position_table_size: tuple[int, int] | None = None,
    position_conv_weight: Tensor | None = None,
    position_conv_bias: Tensor | None = None,
    dwc_weight: Tensor | None = None,
    dwc_bias: Tensor | None = None,
    num_prefix_tokens: int = 0,
    eps: float = 1e-6,
    feature_eps: float = 1e-6,
    backend: str = "auto",
) -> Tensor:
    """Linear attention of the tokens x, global or in windows; (B, N, C) before the output projection.

    Args:
        x: (B, N, C) tokens, N = num_prefix_tokens + H·W; or the projected (B, N, 3C) q|k|v when qkv_weight is None.
        hw: (H, W) of the spatial tokens.
        num_heads: h.
        qkv_weight, qkv_bias: the (3C, C) qkv projection and its bias; None when x is already projected.
        window_size: None for global attention, else (h, w) windows (clamped to the map per dimension).
        feature_map: "focused", "relu", "elu" (any backend) or "favor", "taylor" (eager, `MAPPED_FEATURE_MAPS`).
        scale: the focused map's temperature parameter (1, 1, C) (s = softplus(scale)); focused only.
        focusing_factor: p of the focused map.
        random_features: FAVOR+'s (m, d) projection.
        position_table, position_table_size: a (1, th·tw, C) table of key positions for a (th, tw) grid, resized to
            the window or map.
        position_conv_weight, position_conv_bias: a depthwise conv of the keys (as an image) added to them.
        dwc_weight, dwc_bias: the (d, 1, k, k) depthwise conv of the values shared by the heads.
        num_prefix_tokens: leading tokens without position (global attention only).
        eps: added to the normaliser; feature_eps: added after the ReLU of the focused map.
        backend: "auto", "torch", "triton" or "naive" (see :mod:`linvit.ops`).
    """
    prefix = num_prefix_tokens
    check_token_grid(x[:, prefix:] if prefix > 0 else x, hw)
    batch = x.shape[0]
    tokens, grid = x, hw
    key_mask: Tensor | None = None
    window: tuple[int, int] | None = None  # windows partitioned here (the cores without a window argument)
    core_window: tuple[int, int] | None = None  # windows the core attends in, reading them from the map's tokens
    position_index: Tensor | None = None
    if window_size is not None:
        if exporting():  # symbolic sizes: no branch on them
            tokens, grid, key_mask, position_index = _symbolic_windows(x, hw, window_size)
        else:
            clamped = clamp_window(window_size, hw)
            if clamped[0] != hw[0] or clamped[1] != hw[1]:  # else one window: global attention
                if feature_map == "favor" or feature_map == "taylor" or torch.jit.is_scripting():
                    window, grid = clamped, clamped
                    tokens, key_mask = window_keys(x, hw, clamped)
                else:
                    core_window = clamped

    # the core takes the temperature's parameter itself (the fused kernels apply 1 / softplus as they load it: no
    # torch launches around them); the inverse is computed here only where this function uses it
    temperature_scale: Tensor | None = None if scale is None else scale.view(-1)
    inverse_temperature: Tensor | None = None
    prescaled = False
    if qkv_weight is None:
        qkv = tokens
    elif _folds_temperature(tokens, qkv_weight, temperature_scale, position_conv_weight, backend):
        assert temperature_scale is not None
        inverse_temperature = inverse_of_scale(temperature_scale)  # 1/s, (C,)
        temperature_scale = None
        qkv = folded_projection(tokens, qkv_weight, qkv_bias, inverse_temperature, feature_eps)
        prescaled = True
    else:
        qkv = linear(tokens, qkv_weight, qkv_bias)
    channels = qkv.shape[-1] // 3

    key_position: Tensor | None = None
    if position_table is not None:
        assert position_table_size is not None
        table_grid = grid if core_window is None else core_window
        # (n, C); squeeze, not [0]: its backward is a view, where an index's is a zero fill and a copy of the table
        key_position = resize_positional_table(position_table, position_table_size, table_grid).squeeze(0)
    elif position_conv_weight is not None:
        keys = qkv[:, :, channels : 2 * channels]
        conv_grid, conv_mask = grid, key_mask
        if core_window is not None:  # the conv sees each window alone: the keys in windows, the padding masked
            keys, conv_mask = window_keys(keys, hw, core_window)
            conv_grid = core_window
        keys = channels_last_image(keys, conv_grid, conv_mask)
        key_position = F.conv2d(
            keys, position_conv_weight, position_conv_bias, padding=position_conv_weight.shape[-1] // 2, groups=channels
        ).permute(0, 2, 3, 1).flatten(1, 2)  # fmt: skip

    if feature_map == "favor" or feature_map == "taylor":  # MAPPED_FEATURE_MAPS (TorchScript reads no global tuple)
        out = _mapped_attention(
            qkv, grid, num_heads, feature_map, random_features, key_position, dwc_weight, dwc_bias, key_mask, eps
        )
    elif torch.jit.is_scripting():
        if temperature_scale is not None:
            inverse_temperature = inverse_of_scale(temperature_scale)
        out = scriptable_linear_attention_qkv(
            qkv, grid, num_heads, feature_map, inverse_temperature, focusing_factor, key_position, dwc_weight,
            dwc_bias, key_mask, prefix, eps, feature_eps, False,
        )  # fmt: skip
    else:
        out = linear_attention_qkv(
            qkv, hw=grid, num_heads=num_heads, feature_map=feature_map, inverse_temperature=inverse_temperature,
            focusing_factor=focusing_factor, key_position=key_position, dwc_weight=dwc_weight, dwc_bias=dwc_bias,
            key_mask=key_mask, num_prefix_tokens=prefix, eps=eps, feature_eps=feature_eps, prescaled=prescaled,
            window=core_window, temperature_scale=temperature_scale, backend=backend,
        )  # fmt: skip

    if position_index is not None:
        # reshape: the core's (B * nW, n, C) output need not be contiguous, and the program serves every size
        return out.reshape(batch, -1, out.shape[-1]).index_select(1, position_index)
    if window is not None:
        return merge_windows(out, batch, hw, window, (0, 0))
    return out


@torch.jit.unused
def _symbolic_windows(
    x: Tensor, hw: tuple[int, int], window_size: tuple[int, int]
) -> tuple[Tensor, tuple[int, int], Tensor, Tensor]:
    """The windows without branches on the sizes (torch.export with dynamic H, W): the window is min(window, map) per
    dimension, the map always padded to whole windows and padded keys always masked (a no-op where nothing is padded),
    so one program computes what the eager branches compute at every size. Returns the windows, their grid, the key
    mask and the gather back to the (B, N, C) tokens."""
    batch, channels = x.shape[0], x.shape[-1]
    wh, ww = symbolic_min(window_size[0], hw[0]), symbolic_min(window_size[1], hw[1])
    windows_per_image, tokens = ((hw[0] + wh - 1) // wh) * ((hw[1] + ww - 1) // ww), wh * ww
    token_index, position_index, valid, _, _ = symbolic_window_layout(hw, (wh, ww), (0, 0), x.device)
    windows = x.index_select(1, token_index).view(batch * windows_per_image, tokens, channels)
    key_mask = valid.view(windows_per_image, tokens).repeat(batch, 1)  # batch-major, like the windows
    return windows, (wh, ww), key_mask, position_index


def _folds_temperature(
    x: Tensor,
    qkv_weight: Tensor,
    temperature: Tensor | None,
    position_conv_weight: Tensor | None,
    backend: str,
) -> bool:
    """Whether the temperature goes into the qkv weights: inference in float32/float64 with autocast off (under
    autocast the projection runs in fp16/bf16, where weights divided by a small temperature could overflow), no conv
    of the keys (it reads the raw keys), on the eager backend (which maps the buffer in place)."""
    if torch.jit.is_scripting():
        return False
    if temperature is None or position_conv_weight is not None or torch.is_grad_enabled():
        return False
    if x.dtype != qkv_weight.dtype or not (x.dtype == torch.float32 or x.dtype == torch.float64):
        return False
    if torch.is_autocast_enabled(autocast_device_type(x)):
        return False
    return resolve_backend(backend, x.device) == "torch"


def folded_projection(
    x: Tensor, weight: Tensor, bias: Tensor | None, inverse_temperature: Tensor, feature_eps: float
) -> Tensor:
    """The qkv projection with the focused map's shift and temperature folded in: q|k come out as (x + eps) / s.

    x (W/s)ᵀ + (b + eps)/s == (x Wᵀ + b + eps)/s: a 3C×C op on the weights instead of a pass over the 2C×n queries
    and keys.
    """
    dim = weight.shape[0] // 3
    inverse = inverse_temperature.repeat(2)
    folded_weight = torch.cat([weight[: 2 * dim] * inverse.unsqueeze(-1), weight[2 * dim :]])
    qk_bias = inverse * feature_eps
    value_bias = torch.zeros_like(inverse[:dim])
    if bias is not None:
        qk_bias = torch.addcmul(qk_bias, bias[: 2 * dim], inverse)
        value_bias = bias[2 * dim :]
    return linear(x, folded_weight, torch.cat([qk_bias, value_bias]))


def _mapped_attention(
    qkv: Tensor,
    grid: tuple[int, int],
    num_heads: int,
    feature_map: str,
    random_features: Tensor | None,
    key_position: Tensor | None,
    dwc_weight: Tensor | None,
    dwc_bias: Tensor | None,
    key_mask: Tensor | None,
    eps: float,
) -> Tensor:
    """The core for FAVOR+ and Taylor features: eager, φ(q) and φ(k) materialised, in float32 with autocast off."""
    channels = qkv.shape[-1] // 3
    heads = (num_heads, channels // num_heads)
    q, k, v = qkv.unflatten(-1, (3, channels)).unbind(-2)  # strided (B', n, C) views
    if key_position is not None:
        k = k + key_position.to(k.dtype)
    residual: Tensor | None = None
    if dwc_weight is not None:
        residual = depthwise_conv_values(v, grid, key_mask, dwc_weight, dwc_bias, num_heads).unflatten(-1, heads)
    # both maps read x·d^(-1/4), so that φ(q)·φ(k) approximates exp(q·k/√d)
    input_scale = heads[1] ** -0.25
    q_in = at_least_float32(q).unflatten(-1, heads) * input_scale
    k_in = at_least_float32(k).unflatten(-1, heads) * input_scale
    if feature_map == "favor":
        assert random_features is not None
        q_mapped = favor_feature_map(q_in, random_features, True)
        k_mapped = favor_feature_map(k_in, random_features, False)
    else:
        q_mapped, k_mapped = taylor_feature_map(q_in), taylor_feature_map(k_in)
    values = v.unflatten(-1, heads)
    if torch.jit.is_scripting():
        out = linear_attention_tokens(q_mapped, k_mapped, values, key_mask, None, eps, residual, True)
    else:
        with torch.autocast(device_type=autocast_device_type(q_mapped), enabled=False):
            out = linear_attention_tokens(q_mapped, k_mapped, values, key_mask, None, eps, residual, True)
    return out.flatten(2).to(v.dtype)

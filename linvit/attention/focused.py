"""FocusedLinearAttention: the FLatten operator (Han et al., ICCV 2023), for any map size, global or windowed.

Per (window of the) map, with x (B, N, C):
    q, k, v = qkv(x);  k = k + P                      (P: positional encoding on k only)
    q, k = f_p((relu(·) + 1e-6) / softplus(scale))     (focused map, norms over all C channels)
    o = (q S) z,  S = kᵀv / N,  z = 1 / (q · mean_N(k) + 1e-6)    (per head, mean form, float32)
    o = o + DWC(v)                                      (one depthwise k×k conv shared by all heads)
    out = proj(o)

The computation lives in `linvit.ops.linear_attention_qkv` (backends: "torch" eager, the CPU default; "triton"
fused kernels, the CUDA default; "naive" reference), which reads q|k|v straight from the qkv projection's output and
returns (B, n, C) before the output projection; `backend=` chooses per module, `linvit.ops.set_backend` per process.
With autograd off, in float32 and on the torch backend, the map's shift and temperature go into the projection,
(x Wᵀ + b + eps) / s == x (W/s)ᵀ + (b + eps)/s (a 3C×C op on the weights instead of a pass over the queries and
keys; not under fp16 autocast, where W/s could overflow), and the op maps that buffer in place.
"""

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.attention._windows import (
    check_heads,
    check_token_grid,
    clamp_window,
    exporting,
    pad_grid,
    padding_valid_map,
    symbolic_min,
    symbolic_window_layout,
    to_pair,
    window_partition,
    window_reverse,
)
from linvit.attention.feature_maps import KERNEL_NAMES, create_feature_map
from linvit.attention.positional import resize_positional_table
from linvit.ops import BACKENDS, FEATURE_MAPS, linear_attention_qkv, resolve_backend
from linvit.ops._numerics import at_least_float32, autocast_device_type
from linvit.ops.linear_attention import torch as eager
from linvit.ops.linear_attention.torch import channels_last_image, linear_attention_tokens

__all__ = ["FocusedLinearAttention", "POS_ENCODINGS"]

POS_ENCODINGS = ("learnable", "conv", "none")

# Functions FX should record as single calls: size checks (control flow on sizes), device-dependent constants and the
# float32 cores (their autocast guard needs a concrete device).
torch.fx.wrap("check_token_grid")
torch.fx.wrap("padding_valid_map")
torch.fx.wrap("at_least_float32")
torch.fx.wrap("linear_attention_qkv")
torch.fx.wrap("resize_positional_table")


def _can_fold_temperature(x: Tensor, weight: Tensor) -> bool:
    """Whether the temperature may go into the qkv weights: a float32/float64 projection with autocast off.

    Under autocast the projection runs in fp16/bf16, where weights divided by a small temperature could overflow;
    there the temperature is applied after the cast to float32 instead.
    """
    if torch.jit.is_scripting():
        return False
    if x.dtype != weight.dtype or not (x.dtype == torch.float32 or x.dtype == torch.float64):
        return False
    return not torch.is_autocast_enabled(autocast_device_type(x))


@torch.fx.wrap
def folded_projection(
    x: Tensor, weight: Tensor, bias: Tensor | None, inverse_temperature: Tensor, feature_eps: float
) -> Tensor:
    """The qkv projection with the focused map's shift and temperature folded in: q|k come out as (x + eps) / s.

    x (W/s)ᵀ + (b + eps)/s == (x Wᵀ + b + eps)/s: a 3C×C op on the weights instead of a pass over the 2C×n queries
    and keys (float32 only, see `_can_fold_temperature`).
    """
    dim = weight.shape[0] // 3
    inverse = inverse_temperature.repeat(2)
    folded_weight = torch.cat([weight[: 2 * dim] * inverse.unsqueeze(-1), weight[2 * dim :]])
    qk_bias = inverse * feature_eps
    value_bias = torch.zeros_like(inverse[:dim])
    if bias is not None:
        qk_bias = torch.addcmul(qk_bias, bias[: 2 * dim], inverse)
        value_bias = bias[2 * dim :]
    return F.linear(x, folded_weight, torch.cat([qk_bias, value_bias]))


@torch.fx.wrap
def mapped_linear_core(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, eps: float, residual: Tensor | None = None
) -> Tensor:
    """Linear attention (+ residual) on mapped (B, N, h, m) q, k and (B, N, h, e) v, float32 with autocast off."""
    if torch.jit.is_scripting():
        return linear_attention_tokens(q, k, v, key_mask, None, eps, residual, True)
    with torch.autocast(device_type=autocast_device_type(q), enabled=False):
        return linear_attention_tokens(q, k, v, key_mask, None, eps, residual, True)


class FocusedLinearAttention(nn.Module):
    """Focused linear attention (FLatten) and its kernel relatives, global or in windows, for any (H, W).

    With the defaults the state dict matches the FLatten authors' checkpoints: `qkv.*`, `proj.*`, `scale` (1, 1, C),
    `positional_encoding` (1, pos_h*pos_w, C), `dwc.weight` (d, 1, k, k), `dwc.bias` (d,), d = C // num_heads.

    Args:
        dim: channels C.
        num_heads: heads h (C must be divisible by h).
        qkv_bias: bias in the qkv projection.
        attn_drop: accepted for interface parity with softmax attention; linear attention has no attention matrix
            to drop from, so it is unused (as in the authors' code).
        proj_drop: dropout after the output projection.
        kernel: feature map φ: "focused" (FLatten: ReLU, learnable temperature softplus(scale), focusing power p),
            "relu", "elu" (elu+1), "favor" (FAVOR+ positive random features; buffer `feature_map.projection`,
            redraw with `redraw_features()`), "taylor" (second-order Taylor features, 1 + d + d² wide).
            Only "focused" has the `scale` parameter.
        focusing_factor: p of the focused map (3 in every published model).
        dwc_kernel_size: size k of the depthwise conv on v shared by the heads (odd); 0 or None for no DWC.
        pos_encoding: "learnable": a zero-initialised table added to k, sized `pos_size` and resized bicubically to
            the window / map when they differ; "conv": a depthwise 3×3 conv of k (as an image) added to k,
            resolution-free (module `positional_conv`); "none".
        pos_size: (h, w) grid of the learnable table; defaults to the window size. Required for a global
            learnable table (the token grid at the training resolution, e.g. (56, 56) for stage 1 at 224).
        window_size: None = global attention over the whole map; an int or (h, w) = non-overlapping windows. The
            window is clamped to the map per dimension (a smaller map is one global window, as FLatten-Swin does at
            224 with window 56); the map is zero-padded to a multiple of the window and the padded keys are masked
            out of S and z, so padding takes no part.
        num_random_features: FAVOR+ feature count m (default d·ln d).
        eps: added to the normaliser q·mean(k) (the authors' 1e-6).
        with_projections: False drops `qkv`/`proj`: forward then takes the concatenated (B, N, 3C) q|k|v and returns
            the (B, N, C) output before projection (for HybridAttention, which shares one qkv between branches).
        num_prefix_tokens: leading tokens (class tokens) before the H×W grid: they attend and are attended to, but
            have no position (no positional encoding, no DWC); global attention only. forward then takes
            N = num_prefix_tokens + H·W tokens.
        backend: implementation of the attention core, "auto" (fused Triton kernels on CUDA, eager PyTorch
            otherwise, or what `linvit.ops.set_backend` chose), "torch", "triton" or "naive" (the slow reference).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        kernel: str = "focused",
        focusing_factor: float = 3.0,
        dwc_kernel_size: int | None = 5,
        pos_encoding: str = "learnable",
        pos_size=None,
        window_size=None,
        *,
        num_random_features: int | None = None,
        eps: float = 1e-6,
        with_projections: bool = True,
        num_prefix_tokens: int = 0,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if backend not in BACKENDS:
            raise ValueError(f"Unknown backend {backend!r}; valid backends are {', '.join(BACKENDS)}.")
        if num_prefix_tokens and window_size is not None:
            raise ValueError(
                f"num_prefix_tokens={num_prefix_tokens} needs global attention (window_size=None): prefix tokens "
                "belong to no window."
            )
        if num_prefix_tokens and kernel in ("favor", "taylor"):
            raise ValueError(
                f"num_prefix_tokens={num_prefix_tokens} is not supported with kernel={kernel!r}; use one of "
                f"{', '.join(FEATURE_MAPS)} (they run through linvit.ops, which handles prefix tokens)."
            )
        check_heads(dim, num_heads)
        if kernel not in KERNEL_NAMES:
            raise ValueError(f"Unknown kernel {kernel!r}; valid kernels are {', '.join(KERNEL_NAMES)}.")
        if pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"Unknown pos_encoding {pos_encoding!r}; valid values are {', '.join(POS_ENCODINGS)}.")
        if dwc_kernel_size and dwc_kernel_size % 2 == 0:
            raise ValueError(f"dwc_kernel_size must be odd (same-size output), got {dwc_kernel_size}; e.g. use 5.")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.kernel = kernel
        self.focusing_factor = float(focusing_factor)
        self.eps = eps
        self.feature_eps = 1e-6  # relu(x) + 1e-6 in the focused map (the authors' constant)
        self.num_prefix_tokens = num_prefix_tokens
        self.backend = backend
        self.window_size: tuple[int, int] | None = None
        if window_size is not None:
            self.window_size = to_pair(window_size, "window_size")

        if with_projections:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
            self.proj = nn.Linear(dim, dim, **dd)
        else:
            self.qkv = None
            self.proj = None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop)

        if kernel == "focused":
            self.scale = nn.Parameter(torch.zeros(1, 1, dim, **dd))
            self.feature_map = None
        else:
            self.register_parameter("scale", None)
            self.feature_map = create_feature_map(
                kernel, self.head_dim, self.focusing_factor, num_random_features, **dd
            )

        self.pos_encoding = pos_encoding
        self.pos_size: tuple[int, int] | None = None
        self.positional_conv = None
        if pos_encoding == "learnable":
            if pos_size is None:
                if self.window_size is None:
                    raise ValueError(
                        "pos_encoding='learnable' with global attention needs pos_size=(h, w), the token grid at "
                        "the training resolution (e.g. (56, 56)); or use pos_encoding='conv' or 'none'."
                    )
                pos_size = self.window_size
            self.pos_size = to_pair(pos_size, "pos_size")
            self.positional_encoding = nn.Parameter(torch.zeros(1, self.pos_size[0] * self.pos_size[1], dim, **dd))
        else:
            self.register_parameter("positional_encoding", None)
            if pos_encoding == "conv":
                self.positional_conv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)

        self.dwc_padding = 0
        if dwc_kernel_size:
            self.dwc = nn.Conv2d(
                self.head_dim, self.head_dim, dwc_kernel_size, padding=dwc_kernel_size // 2, groups=self.head_dim, **dd
            )
            self.dwc_padding = dwc_kernel_size // 2
        else:
            self.dwc = None

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == num_prefix_tokens + H * W (or (B, N, 3C) without projections); returns (B, N, C)."""
        prefix = self.num_prefix_tokens
        check_token_grid(x[:, prefix:] if prefix else x, hw)
        window = self.window_size
        if window is None:
            out = self._attend(x, hw, None)
        else:
            out = self._attend_windows(x, hw, window)
        return self.proj_drop(out)

    def _attend_windows(self, x: Tensor, hw: tuple[int, int], window: tuple[int, int]) -> Tensor:
        height, width = hw
        if exporting():  # symbolic sizes: no branch on them (a map within one window is one padded-free window)
            return self._attend_windows_symbolic(x, hw, window)
        window = clamp_window(window, hw)
        if window[0] == height and window[1] == width:
            return self._attend(x, hw, None)
        pad_h = (window[0] - height % window[0]) % window[0]
        pad_w = (window[1] - width % window[1]) % window[1]
        padded_hw = (height + pad_h, width + pad_w)
        grid = pad_grid(x.view(-1, height, width, x.shape[-1]), pad_h, pad_w)
        windows = window_partition(grid, window)  # (B * nW, wh * ww, C)
        key_mask: Tensor | None = None
        if pad_h > 0 or pad_w > 0:
            valid = window_partition(padding_valid_map(hw, padded_hw, x.device), window)  # (nW, n, 1)
            key_mask = valid.squeeze(-1).repeat(x.shape[0], 1)  # (B * nW, n), batch-major like `windows`
        out = self._attend(windows, window, key_mask)
        out = window_reverse(out, window, padded_hw)[:, :height, :width, :]
        return out.reshape(-1, height * width, out.shape[-1])

    @torch.jit.unused
    def _attend_windows_symbolic(self, x: Tensor, hw: tuple[int, int], window: tuple[int, int]) -> Tensor:
        """`_attend_windows` without branches on the sizes (torch.export with dynamic H, W): the window is
        min(window, map) per dimension, the map is always padded to whole windows and padded keys always masked (a
        no-op where nothing is padded), so one program computes what the eager branches compute at every size. The
        partition is a gather: padded positions repeat edge tokens, masked out as keys (zeros for the DWC) and
        dropped as queries."""
        batch, channels = x.shape[0], x.shape[-1]
        wh, ww = symbolic_min(window[0], hw[0]), symbolic_min(window[1], hw[1])
        windows_per_image, tokens = ((hw[0] + wh - 1) // wh) * ((hw[1] + ww - 1) // ww), wh * ww
        token_index, position_index, valid, _, _ = symbolic_window_layout(hw, (wh, ww), (0, 0), x.device)
        windows = x.index_select(1, token_index).view(batch * windows_per_image, tokens, channels)
        key_mask = valid.view(windows_per_image, tokens).repeat(batch, 1)  # batch-major, like windows
        out = self._attend(windows, (wh, ww), key_mask)
        return out.view(batch, windows_per_image * tokens, out.shape[-1]).index_select(1, position_index)

    def _attend(self, x: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """Attention over all tokens of x (B', n, C) laid out as a (gh, gw) grid; returns projected (B', n, C)."""
        out = self._mix(x, grid, key_mask)
        # The projection runs after _mix has returned, so the qkv buffer is already free for its output to reuse
        # (a smaller peak keeps the CPU allocator from handing memory back to the OS between calls).
        if self.proj is not None:
            out = self.proj(out)
        return out

    def _mix(self, x: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """The attention mixture of the tokens, before the output projection."""
        if self.kernel == "favor" or self.kernel == "taylor":
            return self._mix_mapped(x, grid, key_mask)
        inverse_temperature: Tensor | None = None
        if self.scale is not None:
            inverse_temperature = 1.0 / F.softplus(at_least_float32(self.scale).view(-1))  # 1/s, (C,)
        prescaled = False
        if torch.jit.is_scripting():
            qkv = self.qkv(x) if self.qkv is not None else x
        elif inverse_temperature is not None and self._folds_temperature(x):
            assert self.qkv is not None
            qkv = folded_projection(x, self.qkv.weight, self.qkv.bias, inverse_temperature, self.feature_eps)
            prescaled = True
        else:
            qkv = self.qkv(x) if self.qkv is not None else x
        key_position: Tensor | None = None
        if self.positional_encoding is not None:
            key_position = resize_positional_table(self.positional_encoding, self.pos_size, grid)[0]  # (n, C)
        elif self.positional_conv is not None:
            key_position = self._positional_conv(qkv[:, :, self.dim : 2 * self.dim], grid, key_mask)
        dwc_weight: Tensor | None = None
        dwc_bias: Tensor | None = None
        if self.dwc is not None:
            dwc_weight, dwc_bias = self.dwc.weight, self.dwc.bias
        if torch.jit.is_scripting():
            return eager.scriptable_linear_attention_qkv(
                qkv, grid, self.num_heads, self.kernel, inverse_temperature, self.focusing_factor, key_position,
                dwc_weight, dwc_bias, key_mask, self.num_prefix_tokens, self.eps, self.feature_eps, False,
            )  # fmt: skip
        return self._linear_attention(
            qkv, grid, inverse_temperature, key_position, dwc_weight, dwc_bias, key_mask, prescaled
        )

    @torch.jit.unused
    def _linear_attention(
        self,
        qkv: Tensor,
        grid: tuple[int, int],
        inverse_temperature: Tensor | None,
        key_position: Tensor | None,
        dwc_weight: Tensor | None,
        dwc_bias: Tensor | None,
        key_mask: Tensor | None,
        prescaled: bool,
    ) -> Tensor:
        """The attention core through the ops layer, on this module's backend."""
        return linear_attention_qkv(
            qkv, hw=grid, num_heads=self.num_heads, feature_map=self.kernel, inverse_temperature=inverse_temperature,
            focusing_factor=self.focusing_factor, key_position=key_position, dwc_weight=dwc_weight,
            dwc_bias=dwc_bias, key_mask=key_mask, num_prefix_tokens=self.num_prefix_tokens, eps=self.eps,
            feature_eps=self.feature_eps, prescaled=prescaled, backend=self.backend,
        )  # fmt: skip

    @torch.jit.unused
    def _folds_temperature(self, x: Tensor) -> bool:
        """Fold the temperature into the projection: inference, float32, no conv positions, the eager backend."""
        return (
            not torch.is_grad_enabled()
            and self.qkv is not None
            and self.positional_conv is None
            and _can_fold_temperature(x, self.qkv.weight)
            and resolve_backend(self.backend, x.device) == "torch"
        )

    def _mix_mapped(self, x: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """_mix for the kernels with their own feature-map module (FAVOR+, Taylor): eager, φ(q), φ(k) materialised."""
        qkv = self.qkv(x) if self.qkv is not None else x
        q, k, v = qkv.unflatten(-1, (3, self.dim)).unbind(-2)  # strided (B', n, C) views
        if self.positional_encoding is not None:
            k = k + resize_positional_table(self.positional_encoding, self.pos_size, grid).to(k.dtype)
        elif self.positional_conv is not None:
            k = k + self._positional_conv(k, grid, key_mask)
        residual: Tensor | None = None
        if self.dwc is not None:
            residual = eager.depthwise_conv_values(
                v, grid, key_mask, self.dwc.weight, self.dwc.bias, self.num_heads
            ).unflatten(-1, (self.num_heads, self.head_dim))
        assert self.feature_map is not None
        heads = (self.num_heads, self.head_dim)
        q_mapped = self.feature_map(at_least_float32(q).unflatten(-1, heads), True)
        k_mapped = self.feature_map(at_least_float32(k).unflatten(-1, heads), False)
        out = mapped_linear_core(q_mapped, k_mapped, v.unflatten(-1, heads), key_mask, self.eps, residual)
        return out.flatten(2).to(v.dtype)

    def _positional_conv(self, k: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """The conv positional encoding of the keys k (B', n, C), in token layout."""
        assert self.positional_conv is not None
        position = self.positional_conv(channels_last_image(k, grid, key_mask))
        return position.permute(0, 2, 3, 1).reshape(k.shape)

    @torch.jit.unused
    def set_pos_size(self, pos_size) -> None:
        """Resize the learnable positional table to an (h, w) grid in place, like timm's `set_window_size`.

        Bicubic (`resize_positional_table`), `requires_grad` kept. A windowed module whose window is its table's grid
        (FLatten-Swin's linear windows, where `pos_size` defaults to the window) keeps the two equal. A module without
        a learnable table has nothing to resize.
        """
        new_size = to_pair(pos_size, "pos_size")
        if self.pos_size is None or self.positional_encoding is None:
            return
        window_is_table = self.window_size == self.pos_size
        if new_size != self.pos_size:
            old = self.positional_encoding
            with torch.no_grad():
                resized = resize_positional_table(old.detach(), self.pos_size, new_size)
            self.positional_encoding = nn.Parameter(resized, requires_grad=old.requires_grad)
            self.pos_size = new_size
        if window_is_table:
            self.window_size = new_size

    def extra_repr(self) -> str:
        window = "global" if self.window_size is None else f"window_size={self.window_size}"
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, kernel={self.kernel}, "
            f"focusing_factor={self.focusing_factor}, pos_encoding={self.pos_encoding}, {window}"
        )

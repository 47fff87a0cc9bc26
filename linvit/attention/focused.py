"""FocusedLinearAttention: the FLatten operator (Han et al., ICCV 2023), for any map size, global or windowed.

Per (window of the) map, with x (B, N, C):
    q, k, v = qkv(x);  k = k + P                      (P: positional encoding on k only)
    q, k = f_p((relu(·) + 1e-6) / softplus(scale))     (focused map, norms over all C channels)
    o = (q S) z,  S = kᵀv / N,  z = 1 / (q · mean_N(k) + 1e-6)    (per head, mean form, float32)
    o = o + DWC(v)                                      (one depthwise k×k conv shared by all heads)
    out = proj(o)

Layout (this is what makes it fast; the math is the reference's): everything stays in token layout (B, N, C), the
layout the qkv and output projections want. q, k, v are strided views of the qkv output; the heads are views
(B, N, h, d) that the per-head GEMMs of `linear_attention_tokens` read in place, whose result comes back in token
layout; the focusing norms run over the contiguous last dimension; and v is a channels-last image for the DWC,
which runs as one depthwise conv over all C channels with the shared (d, 1, k, k) kernel tiled over the heads
(channel head·d + j uses kernel j: exactly the per-head conv of the reference). The reference's permute/contiguous
copies between (B, N, C), (B, h, N, d) and (B·h, d, H, W), which cost as much as its matmuls on a CPU, are gone.
With autograd off, the map's shift and temperature go into the projection, (x Wᵀ + b + eps) / s ==
x (W/s)ᵀ + (b + eps)/s (a 3C×C op on the weights instead of two passes over the queries and keys; float32 only, as
under fp16 autocast W/s could overflow), so relu(·) + eps over s is one clamp; the map then runs in place on q|k
inside the module's own qkv buffer, and the attention output is accumulated into the DWC output, so inference
allocates few large temporaries (on CPUs each new large block can page-fault again, which costs as much as the
arithmetic). With autograd on, the map runs out of place on the raw q, k in the order whose backward is cheapest.
"""

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.attention._numerics import at_least_float32, autocast_device_type
from linvit.attention._windows import (
    check_token_grid,
    clamp_window,
    pad_grid,
    padding_valid_map,
    to_pair,
    window_partition,
    window_reverse,
)
from linvit.attention.feature_maps import KERNEL_NAMES, create_feature_map
from linvit.attention.linear import linear_attention_tokens

__all__ = ["FocusedLinearAttention", "POS_ENCODINGS", "resize_positional_table"]

POS_ENCODINGS = ("learnable", "conv", "none")

# Functions FX should record as single calls: size checks (control flow on sizes), device-dependent constants and the
# float32 cores (their autocast guard needs a concrete device).
torch.fx.wrap("check_token_grid")
torch.fx.wrap("padding_valid_map")
torch.fx.wrap("at_least_float32")


def resize_positional_table(table: Tensor, table_size: tuple[int, int], size: tuple[int, int]) -> Tensor:
    """(1, th*tw, C) positional table for a (th, tw) grid -> (1, h*w, C) for an (h, w) grid.

    Bicubic interpolation (align_corners=False) in at least float32, the convention of timm and of the FLatten
    checkpoints' resolution changes; the table is returned unchanged when the sizes agree.
    """
    if table_size[0] == size[0] and table_size[1] == size[1]:
        return table
    channels = table.shape[-1]
    image = at_least_float32(table.reshape(1, table_size[0], table_size[1], channels).permute(0, 3, 1, 2))
    image = F.interpolate(image, size=(size[0], size[1]), mode="bicubic", align_corners=False)
    return image.permute(0, 2, 3, 1).reshape(1, size[0] * size[1], channels).to(table.dtype)


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


def scale_queries_keys(qk: Tensor, inverse_temperature: Tensor, feature_eps: float) -> Tensor:
    """(q|k + eps) / s for the raw (B, n, 2C) q|k, as a new tensor in at least float32 (one pass)."""
    inverse = at_least_float32(inverse_temperature).repeat(2)
    return torch.addcmul(inverse * feature_eps, qk, inverse)


@torch.fx.wrap
def focused_projection(
    x: Tensor, weight: Tensor, bias: Tensor | None, inverse_temperature: Tensor, feature_eps: float
) -> tuple[Tensor, Tensor]:
    """The qkv projection with the focused map's shift and temperature applied: returns (qk, v).

    qk (B, n, 2C) holds (q + eps) / s | (k + eps) / s in at least float32, in a buffer of this call's own; v (B, n, C)
    is the projection's v. In float32 the 1/s and eps go into the weights and bias (a 3C×C op) instead of two
    passes over the 2C×n queries and keys: x (W/s)ᵀ + (b + eps)/s == (x Wᵀ + b + eps)/s.
    """
    dim = weight.shape[0] // 3
    if _can_fold_temperature(x, weight):
        inverse = inverse_temperature.repeat(2)
        folded_weight = torch.cat([weight[: 2 * dim] * inverse.unsqueeze(-1), weight[2 * dim :]])
        qk_bias = inverse * feature_eps
        value_bias = torch.zeros_like(inverse[:dim])
        if bias is not None:
            qk_bias = torch.addcmul(qk_bias, bias[: 2 * dim], inverse)
            value_bias = bias[2 * dim :]
        qk, v = F.linear(x, folded_weight, torch.cat([qk_bias, value_bias])).split([2 * dim, dim], dim=-1)
        return qk, v
    qk, v = F.linear(x, weight, bias).split([2 * dim, dim], dim=-1)
    return scale_queries_keys(qk, inverse_temperature, feature_eps), v


def _focused_features(
    qk: Tensor, key_position: Tensor | None, inverse: Tensor, power: float, feature_eps: float, prescaled: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The focused map of q and k: returns (q^p, k^p · α_k, α_q), α = ‖x‖ / ‖x^p‖ per token (see the module)."""
    channels = qk.shape[-1] // 2
    grad = torch.is_grad_enabled()
    if prescaled and not grad:
        # q|k = (x + eps) / s is this call's own buffer: the map runs in place, on both halves in each pass;
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
        # out of place, in the order whose backward is cheapest (relu's is one masked pass; a tensor max's is not)
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
    k = k.mul_(k_factor) if prescaled and not grad else k * k_factor
    return q, k, q_factor


def _focused_core(
    qk: Tensor,
    v: Tensor,
    inverse_temperature: Tensor,
    key_position: Tensor | None,
    num_heads: int,
    focusing_factor: float,
    key_mask: Tensor | None,
    eps: float,
    feature_eps: float,
    residual: Tensor | None,
    prescaled: bool,
) -> Tensor:
    batch, tokens, channels = v.shape
    inverse = at_least_float32(inverse_temperature)
    qk = at_least_float32(qk)
    v = at_least_float32(v)
    if key_position is not None:
        key_position = at_least_float32(key_position)
    q, k, q_factor = _focused_features(qk, key_position, inverse, focusing_factor, feature_eps, prescaled)
    heads = (batch, tokens, num_heads, channels // num_heads)
    if residual is not None:
        residual = residual.view(heads)
    out = linear_attention_tokens(
        q.view(heads), k.view(heads), v.view(heads), key_mask, q_factor.unsqueeze(-1), eps, residual, True
    )
    return out.view(batch, tokens, channels)


@torch.fx.wrap
def focused_linear_core(
    qk: Tensor,
    v: Tensor,
    inverse_temperature: Tensor,
    key_position: Tensor | None,
    num_heads: int,
    focusing_factor: float,
    key_mask: Tensor | None,
    eps: float,
    feature_eps: float = 1e-6,
    residual: Tensor | None = None,
    prescaled: bool = False,
) -> Tensor:
    """Focused map + linear attention (+ residual), float32 with autocast off; returns float32 (B, n, C).

    qk: (B, n, 2C) q|k. Raw with prescaled=False; with prescaled=True already shifted and scaled, (· + eps) / s with
    s the temperature (see `focused_projection`), and owned by the caller: overwritten when autograd is off.
    v: (B, n, C). inverse_temperature: 1/s, (C,). key_position: a positional encoding P (broadcast to (B, n, C))
    added to the keys, or None. residual: accumulated into (it must be a temporary of the caller).
    """
    if torch.jit.is_scripting():
        return _focused_core(
            qk, v, inverse_temperature, key_position, num_heads, focusing_factor, key_mask, eps, feature_eps,
            residual, prescaled,
        )  # fmt: skip
    with torch.autocast(device_type=autocast_device_type(qk), enabled=False):
        return _focused_core(
            qk, v, inverse_temperature, key_position, num_heads, focusing_factor, key_mask, eps, feature_eps,
            residual, prescaled,
        )  # fmt: skip


@torch.fx.wrap
def mapped_linear_core(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, eps: float, residual: Tensor | None = None
) -> Tensor:
    """Linear attention (+ residual) on mapped (B, N, h, m) q, k and (B, N, h, e) v, float32 with autocast off."""
    if torch.jit.is_scripting():
        return linear_attention_tokens(q, k, v, key_mask, None, eps, residual, True)
    with torch.autocast(device_type=autocast_device_type(q), enabled=False):
        return linear_attention_tokens(q, k, v, key_mask, None, eps, residual, True)


def _channels_last_image(x: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
    """(B', n, C) tokens -> (B', C, gh, gw) image in channels-last memory (a view of a dense copy of x).

    The dense copy (x is usually a strided slice of the qkv output) is what the depthwise conv wants: it is cheap
    (rows of C contiguous values) and lets the conv run channels-last without a transpose. Masked (padded) tokens
    are zeroed, so they act like the conv's own zero padding.
    """
    if key_mask is not None:
        x = x * key_mask.unsqueeze(-1).to(x.dtype)
    else:
        x = x.contiguous()
    return x.view(-1, grid[0], grid[1], x.shape[-1]).permute(0, 3, 1, 2)


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
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        if dim % num_heads != 0:
            raise ValueError(
                f"dim={dim} is not divisible by num_heads={num_heads}; choose num_heads that divides dim "
                f"(e.g. {dim // 32 or 1} heads of 32 channels)."
            )
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
        """x: (B, N, C) with N == H * W (or (B, N, 3C) without projections); returns (B, N, C)."""
        x = check_token_grid(x, hw)
        window = self.window_size
        if window is None:
            out = self._attend(x, hw, None)
        else:
            out = self._attend_windows(x, hw, window)
        return self.proj_drop(out)

    def _attend_windows(self, x: Tensor, hw: tuple[int, int], window: tuple[int, int]) -> Tensor:
        height, width = hw
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
        if self.feature_map is not None:
            return self._mix_mapped(x, grid, key_mask)
        assert self.scale is not None
        inverse_temperature = 1.0 / F.softplus(at_least_float32(self.scale).view(-1))  # 1/s, (C,)
        # Inference: the temperature and eps go into the projection and the map runs in place on its output;
        # training: the raw q|k, in the order whose backward is cheapest.
        prescaled = not torch.is_grad_enabled() and self.qkv is not None and self.positional_conv is None
        if prescaled:
            assert self.qkv is not None
            qk, v = focused_projection(x, self.qkv.weight, self.qkv.bias, inverse_temperature, self.feature_eps)
        else:
            qkv = self.qkv(x) if self.qkv is not None else x
            qk, v = qkv.split([2 * self.dim, self.dim], dim=-1)
        key_position: Tensor | None = None
        if self.positional_encoding is not None:
            key_position = resize_positional_table(self.positional_encoding, self.pos_size, grid)  # (1, n, C)
        elif self.positional_conv is not None:
            key_position = self._positional_conv(qk[..., self.dim :], grid, key_mask)
        residual: Tensor | None = None
        if self.dwc is not None:
            residual = self._depthwise_conv_values(v, grid, key_mask)  # added inside the core's last pass
        heads, power, eps, feature_eps = self.num_heads, self.focusing_factor, self.eps, self.feature_eps
        out = focused_linear_core(
            qk, v, inverse_temperature, key_position, heads, power, key_mask, eps, feature_eps, residual, prescaled
        )
        return out.to(v.dtype)

    def _mix_mapped(self, x: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """_mix for the kernels other than focused: φ(q), φ(k) through the feature-map module."""
        qkv = self.qkv(x) if self.qkv is not None else x
        q, k, v = qkv.unflatten(-1, (3, self.dim)).unbind(-2)  # strided (B', n, C) views
        if self.positional_encoding is not None:
            k = k + resize_positional_table(self.positional_encoding, self.pos_size, grid).to(k.dtype)
        elif self.positional_conv is not None:
            k = k + self._positional_conv(k, grid, key_mask)
        residual: Tensor | None = None
        if self.dwc is not None:
            residual = self._depthwise_conv_values(v, grid, key_mask)
        assert self.feature_map is not None
        heads = (self.num_heads, self.head_dim)
        q_mapped = self.feature_map(at_least_float32(q).unflatten(-1, heads), True)
        k_mapped = self.feature_map(at_least_float32(k).unflatten(-1, heads), False)
        if residual is not None:
            residual = residual.unflatten(-1, heads)
        out = mapped_linear_core(q_mapped, k_mapped, v.unflatten(-1, heads), key_mask, self.eps, residual)
        return out.flatten(2).to(v.dtype)

    def _positional_conv(self, k: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """The conv positional encoding of the keys k (B', n, C), in token layout."""
        assert self.positional_conv is not None
        position = self.positional_conv(_channels_last_image(k, grid, key_mask))
        return position.permute(0, 2, 3, 1).reshape(k.shape)

    def _depthwise_conv_values(self, v: Tensor, grid: tuple[int, int], key_mask: Tensor | None) -> Tensor:
        """DWC(v) for v (B', n, C), with one (d, 1, k, k) conv shared by the heads, as one conv over all C channels.

        Channel c = head·d + j of v uses kernel j: tiling the kernel h times equals running the shared conv on each
        head's (d, gh, gw) image, without the (B'·h, d, gh, gw) copy. In windowed mode the conv runs per window (as
        the authors do: their linear blocks see one window at a time, and a window is the unit the attention and
        its positional table are defined on), with the window's padded tokens zeroed so they act like the conv's
        own zero padding.
        """
        dwc = self.dwc
        assert dwc is not None
        image = _channels_last_image(v, grid, key_mask)
        weight = dwc.weight.repeat(self.num_heads, 1, 1, 1).to(image.dtype)
        bias = dwc.bias
        if bias is not None:
            bias = bias.repeat(self.num_heads).to(image.dtype)
        out = F.conv2d(image, weight, bias, padding=self.dwc_padding, groups=self.dim)
        return out.permute(0, 2, 3, 1).reshape(v.shape)

    def extra_repr(self) -> str:
        window = "global" if self.window_size is None else f"window_size={self.window_size}"
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, kernel={self.kernel}, "
            f"focusing_factor={self.focusing_factor}, pos_encoding={self.pos_encoding}, {window}"
        )

"""FocusedLinearAttention: the FLatten operator (Han et al., ICCV 2023), for any map size, global or windowed.

Per (window of the) map, with x (B, N, C):
    q, k, v = qkv(x);  k = k + P                      (P: positional encoding on k only)
    q, k = f_p((relu(·) + 1e-6) / softplus(scale))     (focused map, norms over all C channels)
    o = (q S) z,  S = kᵀv / N,  z = 1 / (q · mean_N(k) + 1e-6)    (per head, mean form, float32)
    o = o + DWC(v)                                      (one depthwise k×k conv shared by all heads)
    out = proj(o)

The module holds the parameters (and the checkpoint keys); the computation, windows and projection included, is one
call into `linvit.ops.focused_linear_attention`, whose core runs on the "torch" backend (eager, the CPU default), the
"triton" one (fused kernels, the CUDA default) or the "naive" reference; `backend=` chooses per module,
`linvit.ops.set_backend` per process.
"""

import torch
import torch.fx
from torch import Tensor, nn

from linvit.attention._checks import to_pair
from linvit.attention.feature_maps import KERNEL_NAMES, create_feature_map
from linvit.attention.projected import ProjectedAttention
from linvit.ops import FEATURE_MAPS
from linvit.ops.linear_attention.attend import MAPPED_FEATURE_MAPS, focused_linear_attention
from linvit.ops.positional import resize_positional_table

__all__ = ["FocusedLinearAttention", "POS_ENCODINGS"]

POS_ENCODINGS = ("learnable", "conv", "none")

# FX records the attention as one call: its control flow depends on the sizes and device
torch.fx.wrap("focused_linear_attention")


class FocusedLinearAttention(ProjectedAttention):
    """Focused linear attention (FLatten) and its kernel relatives, global or in windows, for any (H, W).

    With the defaults the state dict matches the FLatten authors' checkpoints: `qkv.*`, `proj.*`, `scale` (1, 1, C),
    `positional_encoding` (1, pos_h*pos_w, C), `dwc.weight` (d, 1, k, k), `dwc.bias` (d,), d = C // num_heads.

    Args:
        dim, num_heads, qkv_bias, proj_drop, with_projections: see `ProjectedAttention`.
        attn_drop: accepted for interface parity with softmax attention; linear attention has no attention matrix
            to drop from, so it is unused (as in the authors' code).
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
            224 with window 56); the map is padded to whole windows and the padded keys are masked out of S and z
            (and read as zeros by the DWC), so padding takes no part.
        num_random_features: FAVOR+ feature count m (default d·ln d).
        eps: added to the normaliser q·mean(k) (the authors' 1e-6).
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
        super().__init__(dim, num_heads, qkv_bias, proj_drop, with_projections, backend, device, dtype)
        dd = {"device": device, "dtype": dtype}
        if num_prefix_tokens and window_size is not None:
            raise ValueError(
                f"num_prefix_tokens={num_prefix_tokens} needs global attention (window_size=None): prefix tokens "
                "belong to no window."
            )
        if num_prefix_tokens and kernel in MAPPED_FEATURE_MAPS:
            raise ValueError(
                f"num_prefix_tokens={num_prefix_tokens} is not supported with kernel={kernel!r}; use one of "
                f"{', '.join(FEATURE_MAPS)} (they run through linvit.ops, which handles prefix tokens)."
            )
        if kernel not in KERNEL_NAMES:
            raise ValueError(f"Unknown kernel {kernel!r}; valid kernels are {', '.join(KERNEL_NAMES)}.")
        if pos_encoding not in POS_ENCODINGS:
            raise ValueError(f"Unknown pos_encoding {pos_encoding!r}; valid values are {', '.join(POS_ENCODINGS)}.")
        if dwc_kernel_size and dwc_kernel_size % 2 == 0:
            raise ValueError(f"dwc_kernel_size must be odd (same-size output), got {dwc_kernel_size}; e.g. use 5.")
        self.kernel = kernel
        self.focusing_factor = float(focusing_factor)
        self.eps = eps
        self.feature_eps = 1e-6  # relu(x) + 1e-6 in the focused map (the authors' constant)
        self.num_prefix_tokens = num_prefix_tokens
        self.window_size: tuple[int, int] | None = None
        if window_size is not None:
            self.window_size = to_pair(window_size, "window_size")
        self.attn_drop = nn.Dropout(attn_drop)

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
        qkv_weight: Tensor | None = None
        qkv_bias: Tensor | None = None
        if self.qkv is not None:
            qkv_weight, qkv_bias = self.qkv.weight, self.qkv.bias
        position_conv_weight: Tensor | None = None
        position_conv_bias: Tensor | None = None
        if self.positional_conv is not None:
            position_conv_weight, position_conv_bias = self.positional_conv.weight, self.positional_conv.bias
        dwc_weight: Tensor | None = None
        dwc_bias: Tensor | None = None
        if self.dwc is not None:
            dwc_weight, dwc_bias = self.dwc.weight, self.dwc.bias
        random_features: Tensor | None = None
        if self.feature_map is not None:
            random_features = self.feature_map.random_features()
        out = focused_linear_attention(
            x, hw, self.num_heads, qkv_weight=qkv_weight, qkv_bias=qkv_bias, window_size=self.window_size,
            feature_map=self.kernel, scale=self.scale, focusing_factor=self.focusing_factor,
            random_features=random_features, position_table=self.positional_encoding,
            position_table_size=self.pos_size, position_conv_weight=position_conv_weight,
            position_conv_bias=position_conv_bias, dwc_weight=dwc_weight, dwc_bias=dwc_bias,
            num_prefix_tokens=self.num_prefix_tokens, eps=self.eps, feature_eps=self.feature_eps, backend=self.backend,
        )  # fmt: skip
        # the projection runs once the attention has returned: its qkv buffer is free for the output to reuse
        if self.proj is not None:
            out = self.proj(out)
        return self.proj_drop(out)

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

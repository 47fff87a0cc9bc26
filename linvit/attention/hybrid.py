"""HybridAttention: exact window softmax plus a global linear branch, in one attention module.

"Softmax inside windows, linear between them": each token gets the exact softmax mixture of its window (with
relative position bias, shifts and padding as `WindowAttention`) plus a global focused-linear mixture of the whole
map (as `FocusedLinearAttention`). Both branches read the same q, k, v from one qkv projection, their outputs are
summed, and one projection follows.
"""

import torch.fx
from torch import Tensor, nn

from linvit.attention._windows import check_heads, check_token_grid
from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.window import WindowAttention

__all__ = ["HybridAttention"]

torch.fx.wrap("check_token_grid")


class HybridAttention(nn.Module):
    """Window softmax + global linear attention sharing one qkv and one output projection.

    State dict: `qkv.*`, `proj.*`, `local_attn.relative_position_bias_table`, and the linear branch's parameters
    under `global_attn.` (`scale`, `dwc.*`, `positional_encoding` / `positional_conv.*` when enabled).

    Args:
        dim, num_heads, qkv_bias, attn_drop, proj_drop: as for the other attentions.
        window_size, shift_size: of the softmax branch (see `WindowAttention`).
        linear_kernel: feature map of the global branch ("focused", "relu", "elu", "favor", "taylor").
        focusing_factor, dwc_kernel_size, pos_encoding, pos_size: of the global branch (see
            `FocusedLinearAttention`). The positional encoding defaults to "none": the window branch's relative
            position bias already carries position.
        backend: implementation of the linear branch's core (see `FocusedLinearAttention`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        window_size=7,
        shift_size=0,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        linear_kernel: str = "focused",
        focusing_factor: float = 3.0,
        dwc_kernel_size: int | None = 5,
        pos_encoding: str = "none",
        pos_size=None,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        check_heads(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.local_attn = WindowAttention(
            dim, num_heads, window_size, shift_size, attn_drop=attn_drop, with_projections=False, **dd
        )
        self.global_attn = FocusedLinearAttention(
            dim,
            num_heads,
            kernel=linear_kernel,
            focusing_factor=focusing_factor,
            dwc_kernel_size=dwc_kernel_size,
            pos_encoding=pos_encoding,
            pos_size=pos_size,
            with_projections=False,
            backend=backend,
            **dd,
        )
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W; returns (B, N, C)."""
        qkv = self.qkv(check_token_grid(x, hw))
        out = self.local_attn(qkv, hw) + self.global_attn(qkv, hw)
        return self.proj_drop(self.proj(out))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}"

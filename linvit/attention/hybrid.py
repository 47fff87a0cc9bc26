"""HybridAttention: exact window softmax plus a global branch in linear time, in one attention module.

"Softmax inside windows, linear between them": each token gets the exact softmax mixture of its window (with
relative position bias, shifts and padding as `WindowAttention`) plus a global mixture of the whole map. Both branches
read the same q, k, v from one qkv projection, their outputs are summed, and one projection follows.

The global branch is any operator that mixes the whole map from q, k, v in time linear in N: focused or kernel
linear attention (`FocusedLinearAttention`, the default), or one of the two approximations of global softmax,
Nyströmformer (`NystromAttention`) and Linformer (`LinformerAttention`). Nothing in the design needs a kernel feature
map: the window branch is exact, the global one only has to be cheap, and the sum of a window softmax mixture and an
approximate global softmax mixture is as well-scaled as that of a window softmax and a linear mixture.
"""

from typing import Any

import torch.fx
from torch import Tensor, nn

from linvit.attention._checks import check_heads
from linvit.attention.focused import FocusedLinearAttention
from linvit.attention.linformer import LinformerAttention
from linvit.attention.nystrom import NystromAttention
from linvit.attention.window import WindowAttention
from linvit.ops.windows import check_token_grid

__all__ = ["GLOBAL_BRANCHES", "HybridAttention"]

GLOBAL_BRANCHES = ("linear", "nystrom", "linformer")

torch.fx.wrap("check_token_grid")


class HybridAttention(nn.Module):
    """Window softmax + global linear attention sharing one qkv and one output projection.

    State dict: `qkv.*`, `proj.*`, `local_attn.relative_position_bias_table`, and the global branch's parameters
    under `global_attn.`: the linear branch's `scale`, `dwc.*`, `positional_encoding` / `positional_conv.*` when
    enabled; Nyström's `conv.weight`; learned Linformer's `key_projection`, `value_projection`.

    Args:
        dim, num_heads, qkv_bias, attn_drop, proj_drop: as for the other attentions.
        window_size, shift_size: of the softmax branch (see `WindowAttention`).
        global_branch: "linear" (`FocusedLinearAttention` with ``linear_kernel``), "nystrom" (`NystromAttention`)
            or "linformer" (`LinformerAttention`).
        linear_kernel: feature map of the linear branch ("focused", "relu", "elu", "favor", "taylor").
        focusing_factor, dwc_kernel_size, pos_encoding: of the linear branch (see `FocusedLinearAttention`). The
            positional encoding defaults to "none": the window branch's relative position bias already carries
            position.
        pos_size: the stage's token grid: the linear branch's learnable table, learned Linformer's projections.
        global_options: further keyword arguments of the Nyström or Linformer branch (``landmark_grid``,
            ``projection``, ``projected_size``, ...); the linear branch takes its own arguments above.
        backend: implementation of the global branch's core (see the branch's module).
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
        global_branch: str = "linear",
        linear_kernel: str = "focused",
        focusing_factor: float = 3.0,
        dwc_kernel_size: int | None = 5,
        pos_encoding: str = "none",
        pos_size=None,
        global_options: dict[str, Any] | None = None,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        check_heads(dim, num_heads)
        if global_branch not in GLOBAL_BRANCHES:
            raise ValueError(f"Unknown global_branch {global_branch!r}; valid ones are {', '.join(GLOBAL_BRANCHES)}.")
        if global_options and global_branch == "linear":
            raise ValueError(
                f"global_options={global_options!r} are for the 'nystrom' and 'linformer' branches; the linear branch "
                "takes linear_kernel, focusing_factor, dwc_kernel_size and pos_encoding directly."
            )
        self.dim = dim
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.local_attn = WindowAttention(
            dim, num_heads, window_size, shift_size, attn_drop=attn_drop, with_projections=False, **dd
        )
        self.global_branch = global_branch
        if global_branch == "linear":
            branch, options = (
                FocusedLinearAttention,
                {
                    "kernel": linear_kernel,
                    "focusing_factor": focusing_factor,
                    "dwc_kernel_size": dwc_kernel_size,
                    "pos_encoding": pos_encoding,
                    "pos_size": pos_size,
                },
            )
        elif global_branch == "linformer":
            branch, options = LinformerAttention, {"pos_size": pos_size, **(global_options or {})}
        else:
            branch, options = NystromAttention, dict(global_options or {})
        self.global_attn = branch(dim, num_heads, with_projections=False, backend=backend, **options, **dd)
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W; returns (B, N, C)."""
        qkv = self.qkv(check_token_grid(x, hw))
        out = self.local_attn(qkv, hw) + self.global_attn(qkv, hw)
        return self.proj_drop(self.proj(out))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, global_branch={self.global_branch}"

"""NystromAttention: Nyströmformer (Xiong et al., AAAI 2021) on image tokens, any (H, W).

Softmax attention approximated through m landmarks, with x (B, N, C):
    q, k, v = qkv(x)
    q̃, k̃ = means of q, k over an (mh, mw) grid of cells on the map    (segment means on a sequence)
    o = softmax(q k̃ᵀ/√d) A⁺ softmax(q̃ kᵀ/√d) v,  A = softmax(q̃ k̃ᵀ/√d)   (A⁺: the paper's iterative pseudo-inverse)
    o = o + conv(v)                                                    (one k×k kernel per head)
    out = proj(o)

Time and memory are linear in N for a fixed grid; with the grid as large as the map, o is softmax attention (plus the
skip). The computation lives in `linvit.ops.nystrom_attention_qkv` ("torch" eager, "naive" reference).
"""

import torch
import torch.fx
from torch import Tensor, nn

from linvit.attention.projected import ProjectedAttention
from linvit.ops import nystrom_attention_qkv
from linvit.ops._cells import cell_grid
from linvit.ops.nystrom import torch as eager
from linvit.ops.windows import check_token_grid

__all__ = ["NystromAttention"]

# FX records these as single calls: a size check, and the op (its backend choice needs a concrete device).
torch.fx.wrap("check_token_grid")
torch.fx.wrap("nystrom_attention_qkv")


class NystromAttention(ProjectedAttention):
    """Nyströmformer attention over all tokens of an (H, W) map, with landmarks on a 2-D grid of cells.

    State dict: `qkv.*`, `proj.*`, `conv.weight` (heads, 1, k, k) (the skip; no bias, as the paper's).

    Args:
        dim, num_heads, qkv_bias, proj_drop, with_projections: see `ProjectedAttention`.
        attn_drop: accepted for interface parity; unused (the approximation has no attention matrix to drop from,
            as in the authors' code).
        landmark_grid: (mh, mw) cells, or s for s×s: m = mh·mw landmarks (default 8×8 = 64, the paper's m), the
            means of q and k over the cells (adaptive-pooling cells, so any H×W); clamped to the map per dimension.
        pinv_iterations: steps of the iterative Moore–Penrose pseudo-inverse (the paper's 6).
        conv_kernel_size: k of the depthwise skip conv of the values, one k×k kernel per head shared by its
            channels (the paper's skip is 33×1 along a sequence; 5×5 spans a similar number of image tokens); 0 or
            None for none.
        backend: "auto", "torch", "triton" (both run the eager path: there is no fused kernel of its own) or
            "naive" (the slow reference).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        landmark_grid=8,
        pinv_iterations: int = 6,
        conv_kernel_size: int | None = 5,
        with_projections: bool = True,
        backend: str = "auto",
        device=None,
        dtype=None,
    ):
        super().__init__(dim, num_heads, qkv_bias, proj_drop, with_projections, backend, device, dtype)
        dd = {"device": device, "dtype": dtype}
        if pinv_iterations < 0:
            raise ValueError(f"pinv_iterations must be >= 0, got {pinv_iterations}; the paper uses 6.")
        if conv_kernel_size and conv_kernel_size % 2 == 0:
            raise ValueError(f"conv_kernel_size must be odd (same-size output), got {conv_kernel_size}; e.g. use 5.")
        self.landmark_grid = cell_grid(landmark_grid, "landmark_grid")
        self.pinv_iterations = int(pinv_iterations)
        if conv_kernel_size:
            self.conv = nn.Conv2d(
                num_heads,
                num_heads,
                conv_kernel_size,
                padding=conv_kernel_size // 2,
                groups=num_heads,
                bias=False,
                **dd,
            )
        else:
            self.conv = None

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W (or (B, N, 3C) without projections); returns (B, N, C)."""
        x = check_token_grid(x, hw)
        qkv = self.project_in(x)
        conv_weight: Tensor | None = None
        if self.conv is not None:
            conv_weight = self.conv.weight
        if torch.jit.is_scripting():
            out = eager.scriptable_nystrom_attention_qkv(
                qkv, hw, self.num_heads, self.landmark_grid, self.pinv_iterations, conv_weight, None
            )
        else:
            out = self._nystrom(qkv, hw, conv_weight)
        return self.project_out(out)

    @torch.jit.unused
    def _nystrom(self, qkv: Tensor, hw: tuple[int, int], conv_weight: Tensor | None) -> Tensor:
        """The attention core through the ops layer, on this module's backend."""
        return nystrom_attention_qkv(
            qkv, hw=hw, num_heads=self.num_heads, landmark_grid=self.landmark_grid,
            pinv_iterations=self.pinv_iterations, conv_weight=conv_weight, backend=self.backend,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, landmark_grid={self.landmark_grid}, "
            f"pinv_iterations={self.pinv_iterations}"
        )

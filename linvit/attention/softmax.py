"""GlobalAttention: multi-head softmax attention over all tokens, for low-resolution stages."""

import torch.fx
import torch.nn.functional as F
from torch import Tensor

from linvit.attention.projected import ProjectedAttention
from linvit.ops.windows import check_token_grid

__all__ = ["GlobalAttention"]

torch.fx.wrap("check_token_grid")


class GlobalAttention(ProjectedAttention):
    """softmax(q kᵀ / √d) v over all N tokens through `F.scaled_dot_product_attention` (flash / memory-efficient
    kernels where the device has them). O(N²): meant for low-resolution stages. State dict: `qkv.*`, `proj.*`.

    Args:
        dim, num_heads, qkv_bias, proj_drop: see `ProjectedAttention`.
        attn_drop: dropout on the attention probabilities (training only).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__(dim, num_heads, qkv_bias, proj_drop, device=device, dtype=dtype)
        self.attn_drop = attn_drop

    def forward(self, x: Tensor, hw: tuple[int, int]) -> Tensor:
        """x: (B, N, C) with N == H * W; returns (B, N, C). hw is only checked: softmax attention is global."""
        x = check_token_grid(x, hw)
        tokens = hw[0] * hw[1]
        qkv = self.project_in(x).view(-1, tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, N, d)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        out = out.transpose(1, 2).reshape(-1, tokens, self.dim)
        return self.project_out(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}"

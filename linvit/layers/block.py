"""Pre-norm transformer blocks: (CPE) -> norm -> attention -> norm -> MLP.

- :class:`PreNormBlock`: the residual frame around an attention and an MLP that the caller builds (the FLatten
  families, whose blocks differ only in those two and keep the authors' checkpoint keys).
- :class:`TransformerBlock`: linvit's block, with a conv position encoding and the attention chosen by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from timm.layers import DropPath
from torch import nn

from linvit.attention import create_attention
from linvit.layers.mlp import Mlp
from linvit.layers.position import ConvPosEnc


class PreNormBlock(nn.Module):
    """x = x + drop_path(attn(norm1(x), hw)); x = x + drop_path(mlp(norm2(x))), for an attention and MLP built by the
    caller (before calling this initialiser, so that their random initialisation keeps the order attention, MLP).

    Keys: ``norm1``, ``attn``, ``norm2``, ``mlp``.
    """

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        mlp: nn.Module,
        drop_path: float = 0.0,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.attn = attn
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = norm_layer(dim, **dd)
        self.mlp = mlp
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    @classmethod
    def build(
        cls,
        dim: int,
        num_heads: int,
        attention: str,
        attn_kwargs: dict[str, Any] | None = None,
        mlp_ratio: float = 4.0,
        mlp_layer: Callable[..., nn.Module] = Mlp,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
        **mlp_kwargs: Any,
    ) -> PreNormBlock:
        """A block with the attention ``attention`` (a name for `linvit.attention.create_attention`, with
        ``attn_kwargs``) and ``mlp_layer(dim, dim * mlp_ratio, drop=proj_drop, **mlp_kwargs)``, built in that order."""
        dd = {"device": device, "dtype": dtype}
        attn = create_attention(attention, dim, num_heads, **(attn_kwargs or {}), **dd)
        mlp = mlp_layer(dim, int(dim * mlp_ratio), drop=proj_drop, **mlp_kwargs, **dd)
        return cls(dim, attn, mlp, drop_path=drop_path, norm_layer=norm_layer, **dd)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class TransformerBlock(PreNormBlock):
    """x = x + CPE(x); x = x + drop_path(attn(norm1(x), hw)); x = x + drop_path(mlp(norm2(x))).

    ``attention`` is a name understood by :func:`linvit.attention.create_attention` (``"focused"``, ``"window"``,
    ``"softmax"``, ...) and ``attn_kwargs`` its extra arguments. Tokens are (B, N, C) with N == H * W, hw = (H, W).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attention: str = "focused",
        attn_kwargs: dict[str, Any] | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        cpe_kernel_size: int | None = 3,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        act_layer: type[nn.Module] = nn.GELU,
        device=None,
        dtype=None,
    ):
        dd = {"device": device, "dtype": dtype}
        cpe = ConvPosEnc(dim, cpe_kernel_size, **dd) if cpe_kernel_size else None  # built first, as ever
        attn = create_attention(
            attention,
            dim,
            num_heads,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            **(attn_kwargs or {}),
            **dd,
        )
        mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop, **dd)
        super().__init__(dim, attn, mlp, drop_path=drop_path, norm_layer=norm_layer, **dd)
        self.attention_name = attention
        self.cpe = cpe

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        if self.cpe is not None:
            x = self.cpe(x, hw)
        x = x + self.drop_path1(self.attn(self.norm1(x), hw))
        return x + self.drop_path2(self.mlp(self.norm2(x)))

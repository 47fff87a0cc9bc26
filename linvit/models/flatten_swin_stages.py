"""FLatten-Swin's building blocks: Swin's patch merging, the pre-norm block (focused linear attention or shifted
window softmax, then an MLP) and the stage (optional merging, then blocks of one attention type).

The model that stacks them, its resolution policy and the checkpoint mapping live in `flatten_swin.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from timm.layers import Mlp, to_2tuple
from timm.models._manipulate import checkpoint
from torch import nn

from linvit.attention import FocusedLinearAttention, WindowAttention
from linvit.layers import PreNormBlock

__all__ = ["ATTN_TYPES", "FLattenSwinBlock", "FLattenSwinStage", "PatchMerging"]

ATTN_TYPES = ("linear", "softmax")


class PatchMerging(nn.Module):
    """2x2 neighbour concatenation, LayerNorm and a linear reduction (Swin's down-sampling); pads odd maps.

    Takes NCHW, returns NHWC. The concatenation order (top-left, bottom-left, top-right, bottom-right) is Swin's,
    so the authors' ``reduction`` / ``norm`` weights apply unchanged.
    """

    def __init__(
        self,
        dim: int,
        out_dim: int | None = None,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.dim = dim
        self.out_dim = out_dim or 2 * dim
        self.norm = norm_layer(4 * dim, **dd)
        self.reduction = nn.Linear(4 * dim, self.out_dim, bias=False, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        x = F.pad(x, (0, W % 2, 0, H % 2))
        x = x.reshape(B, C, (H + 1) // 2, 2, (W + 1) // 2, 2)
        # (B, H/2, W/2, w-offset, h-offset, C): flattening gives Swin's [x00, x10, x01, x11] channel blocks
        x = x.permute(0, 2, 4, 5, 3, 1).flatten(3)
        return self.reduction(self.norm(x))


class FLattenSwinBlock(PreNormBlock):
    """Pre-norm transformer block: focused linear attention or (shifted) window softmax attention, then an MLP."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        attn_type: str = "linear",
        window_size: int | tuple[int, int] = 7,
        shift_size: int = 0,
        pos_size: tuple[int, int] | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        dd = {"device": device, "dtype": dtype}
        if attn_type not in ATTN_TYPES:
            raise ValueError(f"attn_type must be one of {ATTN_TYPES}, got {attn_type!r}.")
        grid = to_2tuple(pos_size) if pos_size is not None else None
        attn: nn.Module
        if attn_type == "linear":
            if grid is None:
                raise ValueError("A linear block needs pos_size, the grid of its positional encoding.")
            attn = FocusedLinearAttention(
                dim,
                num_heads,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop,
                proj_drop=proj_drop,
                focusing_factor=focusing_factor,
                dwc_kernel_size=dwc_kernel_size,
                pos_size=grid,
                window_size=grid,
                **dd,
            )
        else:
            attn = WindowAttention(
                dim,
                num_heads,
                window_size=window_size,
                shift_size=shift_size,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop,
                proj_drop=proj_drop,
                **dd,
            )
        mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=proj_drop, **dd)
        super().__init__(dim, attn, mlp, drop_path=drop_path, norm_layer=norm_layer, **dd)
        self.attn_type = attn_type
        self.pos_size = grid


class FLattenSwinStage(nn.Module):
    """Optional patch merging, then blocks of one attention type. NCHW in and out; (B, N, C) tokens inside."""

    def __init__(
        self,
        dim: int,
        out_dim: int,
        depth: int,
        num_heads: int,
        attn_type: str,
        downsample: bool,
        window_size: int = 7,
        pos_size: tuple[int, int] | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        focusing_factor: float = 3.0,
        dwc_kernel_size: int = 5,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float | Sequence[float] = 0.0,
        act_layer: Callable[..., nn.Module] = nn.GELU,
        norm_layer: Callable[..., nn.Module] = nn.LayerNorm,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.grad_checkpointing = False
        self.downsample = PatchMerging(dim, out_dim, norm_layer=norm_layer, **dd) if downsample else nn.Identity()
        self.has_downsample = downsample
        drop_paths = list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth
        self.blocks = nn.ModuleList(
            [
                FLattenSwinBlock(
                    out_dim,
                    num_heads,
                    attn_type=attn_type,
                    window_size=window_size,
                    # like Swin: odd blocks shift by half a window (linear blocks never shift)
                    shift_size=0 if (i % 2 == 0 or attn_type == "linear") else window_size // 2,
                    pos_size=pos_size,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    focusing_factor=focusing_factor,
                    dwc_kernel_size=dwc_kernel_size,
                    proj_drop=proj_drop,
                    attn_drop=attn_drop,
                    drop_path=drop_paths[i],
                    act_layer=act_layer,
                    norm_layer=norm_layer,
                    **dd,
                )
                for i in range(depth)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_downsample:
            x = self.downsample(x)  # NCHW -> NHWC
        else:
            x = x.permute(0, 2, 3, 1)
        B, H, W, C = x.shape
        x = x.reshape(B, H * W, C)
        hw = (H, W)
        for block in self.blocks:
            if self.grad_checkpointing and not torch.jit.is_scripting():
                x = checkpoint(block, x, hw)
            else:
                x = block(x, hw)
        return x.reshape(B, H, W, C).permute(0, 3, 1, 2)

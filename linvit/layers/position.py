"""Conditional (convolutional) position encoding: resolution-free, so no parameter depends on the input size."""

from __future__ import annotations

import torch
from torch import nn


def tokens_to_map(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) map in channels-last memory (a view when x is contiguous)."""
    return x.reshape(x.shape[0], hw[0], hw[1], x.shape[2]).permute(0, 3, 1, 2)


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) map -> (B, N, C) tokens (a view when x is channels-last contiguous)."""
    return x.permute(0, 2, 3, 1).flatten(1, 2)


class ConvPosEnc(nn.Module):
    """CPE (Chu et al., "Conditional Positional Encodings for Vision Transformers"): x + DWConv_kxk(x).

    Works on tokens with their (H, W) passed explicitly; the depthwise convolution runs on a channels-last view of
    the tokens, so no layout copy is needed on either side.
    """

    def __init__(self, dim: int, kernel_size: int = 3, device=None, dtype=None):
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"ConvPosEnc kernel_size must be odd to keep the map size, got {kernel_size}; use 3 or 5")
        self.proj = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        return x + map_to_tokens(self.proj(tokens_to_map(x, hw)))

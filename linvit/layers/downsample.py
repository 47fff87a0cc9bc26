"""Downsampling between stages: (B, C_in, H, W) -> (B, C_out, ceil(H/2), ceil(W/2))."""

from __future__ import annotations

import torch
from torch import nn


class ConvDownsample(nn.Module):
    """LayerNorm over channels, then a 3x3 stride-2 convolution (overlapping, so tiny maps such as 2x2 -> 1x1 work).

    The input and output are NCHW in channels-last memory; the norm runs on the (B, H, W, C) view without a copy.
    """

    def __init__(self, in_chans: int, out_chans: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(in_chans, eps=eps, **dd)
        self.conv = nn.Conv2d(in_chans, out_chans, 3, stride=2, padding=1, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.conv(x)

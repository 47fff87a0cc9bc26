"""Convolutional stem: image (B, C_in, H, W) -> feature map at stride 4 (B, C, ceil(H/4), ceil(W/4))."""

from __future__ import annotations

import torch
from torch import nn


class ConvStem(nn.Module):
    """Two stride-2 3x3 convolutions (BatchNorm + GELU between them), then BatchNorm.

    Any input size works: each convolution pads by one and rounds up, so the output is ceil(H / 4) x ceil(W / 4).
    The output is returned in channels-last memory, so the blocks that follow can view it as (B, N, C) tokens
    without a copy.
    """

    def __init__(
        self,
        in_chans: int = 3,
        out_chans: int = 64,
        hidden_chans: int | None = None,
        act_layer: type[nn.Module] = nn.GELU,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        hidden_chans = hidden_chans or out_chans // 2
        self.in_chans = in_chans
        self.out_chans = out_chans
        self.conv1 = nn.Conv2d(in_chans, hidden_chans, 3, stride=2, padding=1, bias=False, **dd)
        self.norm1 = nn.BatchNorm2d(hidden_chans, **dd)
        self.act = act_layer()
        self.conv2 = nn.Conv2d(hidden_chans, out_chans, 3, stride=2, padding=1, bias=False, **dd)
        self.norm2 = nn.BatchNorm2d(out_chans, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        x = self.act(self.norm1(self.conv1(x)))
        # a 1-channel input is both NCHW- and channels-last-contiguous, and the convolution may then answer in NCHW:
        # insist on channels-last (a no-op when it already is)
        return self.norm2(self.conv2(x)).contiguous(memory_format=torch.channels_last)

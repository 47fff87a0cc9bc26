"""Convolutional stem: image (B, C_in, H, W) -> feature map at stride 4 (B, C, ceil(H/4), ceil(W/4)), or 2."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linvit.ops.onednn import conv2d, onednn_ready, watched


class ConvStem(nn.Module):
    """Two 3x3 convolutions (BatchNorm + GELU between them), then BatchNorm: both at stride 2 (``stride=4``), or the
    first at stride 1 (``stride=2``: for images under 128 px, where a stride-4 stem leaves a first map under 32x32).

    Any input size works: each convolution pads by one and rounds up, so the output is ceil(H / s) x ceil(W / s).
    The output is returned in channels-last memory, so the blocks that follow can view it as (B, N, C) tokens
    without a copy. In eval mode without autograd, on the CPU, each BatchNorm is folded into its convolution and the
    GELU runs inside the first (oneDNN, `linvit.ops.onednn`): two passes over the stride-2 map instead of four
    (``linvit_tiny``'s stem at 1024²: 57 -> 27 ms on a 2-core Xeon).
    """

    def __init__(
        self,
        in_chans: int = 3,
        out_chans: int = 64,
        hidden_chans: int | None = None,
        act_layer: type[nn.Module] = nn.GELU,
        stride: int = 4,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        hidden_chans = hidden_chans or out_chans // 2
        self.in_chans = in_chans
        self.out_chans = out_chans
        if type(stride) is not int or stride not in (2, 4):
            raise ValueError(f"the stem's stride (stem_stride) is 2 or 4, got {stride!r}")
        self.conv1 = nn.Conv2d(in_chans, hidden_chans, 3, stride=stride // 2, padding=1, bias=False, **dd)
        self.norm1 = nn.BatchNorm2d(hidden_chans, **dd)
        self.act = act_layer()
        self.conv2 = nn.Conv2d(hidden_chans, out_chans, 3, stride=2, padding=1, bias=False, **dd)
        self.norm2 = nn.BatchNorm2d(out_chans, **dd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=torch.channels_last)
        if not torch.jit.is_scripting():  # noqa: SIM102 (TorchScript compiles what is not inside this test)
            if self._foldable(x):
                first_stride = list(self.conv1.stride)
                x = conv2d(x, *_folded(self.conv1, self.norm1), first_stride, [1, 1], gelu=self.act.approximate)
                x = conv2d(x, *_folded(self.conv2, self.norm2), [2, 2], [1, 1])
                return x.contiguous(memory_format=torch.channels_last)
        x = self.act(self.norm1(self.conv1(x)))
        # a 1-channel input is both NCHW- and channels-last-contiguous, and the convolution may then answer in NCHW:
        # insist on channels-last (a no-op when it already is)
        return self.norm2(self.conv2(x)).contiguous(memory_format=torch.channels_last)

    @torch.jit.unused
    def _foldable(self, x: Tensor) -> bool:
        """Eval mode, plain layers nothing watches, the GELU, and oneDNN's convolution ready for x."""
        if self.training or not isinstance(self.act, nn.GELU) or watched(self.act):
            return False
        for conv, norm in ((self.conv1, self.norm1), (self.conv2, self.norm2)):
            if type(conv) is not nn.Conv2d or conv.padding_mode != "zeros" or watched(conv):
                return False
            if type(norm) is not nn.BatchNorm2d or norm.training or norm.running_var is None or watched(norm):
                return False
        return onednn_ready(x, self.conv1.weight, None, "_convolution_pointwise")


def _folded(conv: nn.Conv2d, norm: nn.BatchNorm2d) -> tuple[Tensor, Tensor]:
    """The weight and bias of norm(conv(x)) as one convolution, with the norm's running statistics (eval mode)."""
    assert norm.running_mean is not None and norm.running_var is not None
    scale = (norm.running_var + norm.eps).rsqrt()
    shift = -norm.running_mean * scale
    if norm.weight is not None:
        scale = scale * norm.weight
        shift = shift * norm.weight
    if norm.bias is not None:
        shift = shift + norm.bias
    if conv.bias is not None:
        shift = shift + conv.bias * scale
    return conv.weight * scale.view(-1, 1, 1, 1), shift

"""Feature pyramid network (Lin et al., CVPR 2017) over any backbone's list of NCHW maps.

Top-down fusion upsamples each coarser map to the exact size of the finer lateral map (not by a fixed factor 2),
so maps of odd or non-square inputs (e.g. 1600×2560 → 400×640, 200×320, 100×160, 50×80, or 225×225 → 57, 29, 15, 8)
fuse without cropping.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FPN"]


class FPN(nn.Module):
    """Lateral 1×1 convs, nearest top-down upsampling and 3×3 output convs; one map of ``out_channels`` per level.

    Args:
        in_channels: channels of the input maps, finest first (``FeatureBackbone.channels``).
        out_channels: channels of every output map.
        num_extra_levels: extra coarser levels made by stride-2 max pooling of the coarsest output
            (torchvision's ``LastLevelMaxPool``, ``pool`` in its detection models).
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        out_channels: int = 256,
        num_extra_levels: int = 0,
        device: object | None = None,
        dtype: object | None = None,
    ) -> None:
        super().__init__()
        if len(in_channels) == 0:
            raise ValueError("FPN needs at least one input level; got in_channels=[].")
        factory = {"device": device, "dtype": dtype}
        self.in_channels = list(in_channels)
        self.out_channels = out_channels
        self.num_extra_levels = num_extra_levels
        self.lateral_convs = nn.ModuleList(nn.Conv2d(c, out_channels, 1, **factory) for c in in_channels)
        self.output_convs = nn.ModuleList(
            nn.Conv2d(out_channels, out_channels, 3, padding=1, **factory) for _ in in_channels
        )

    def forward(self, features: list[Tensor]) -> list[Tensor]:
        if len(features) != len(self.in_channels):
            raise ValueError(
                f"FPN built for {len(self.in_channels)} levels got {len(features)} feature maps; "
                "build it with in_channels=backbone.channels."
            )
        # index loops over ModuleLists (not zip) keep the neck TorchScript-compatible
        laterals: list[Tensor] = []
        for i, lateral_conv in enumerate(self.lateral_convs):
            laterals.append(lateral_conv(features[i]))
        # top-down, coarsest first: each coarser map is upsampled to the next finer lateral's exact size
        for i in range(len(laterals) - 1, 0, -1):
            top = F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:], mode="nearest")
            laterals[i - 1] = laterals[i - 1] + top
        outputs: list[Tensor] = []
        for i, output_conv in enumerate(self.output_convs):
            outputs.append(output_conv(laterals[i]))
        for _ in range(self.num_extra_levels):
            outputs.append(F.max_pool2d(outputs[-1], kernel_size=1, stride=2))
        return outputs

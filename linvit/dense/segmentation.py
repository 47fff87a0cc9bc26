"""Semantic segmentation on any linvit/timm backbone: Semantic-FPN and UPerNet-style heads.

- :class:`SemanticFPNHead` (Kirillov et al., Panoptic FPN, CVPR 2019): FPN maps, each brought to stride 4 by
  (conv3×3-GN-ReLU, ×2 upsample) stages, summed, 1×1 classifier.
- :class:`UPerNetHead` (Xiao et al., ECCV 2018): pyramid pooling on the coarsest map, FPN top-down fusion,
  all levels upsampled to the finest and fused by a 3×3 conv, 1×1 classifier.

:class:`SegmentationModel` = backbone + head; its logits come back at the input's exact size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linvit.dense.backbone import FeatureBackbone, create_feature_backbone
from linvit.dense.fpn import FPN

__all__ = ["SemanticFPNHead", "UPerNetHead", "SegmentationModel", "create_segmentation_model", "SEGMENTATION_HEADS"]

SEGMENTATION_HEADS = ("fpn", "upernet")


def _conv_norm_act(
    in_channels: int, out_channels: int, kernel_size: int = 3, max_groups: int = 32, device=None, dtype=None
) -> nn.Sequential:
    # GroupNorm: batch statistics are unreliable at the small batches of high-resolution segmentation
    groups = math.gcd(max_groups, out_channels)
    return nn.Sequential(
        nn.Conv2d(
            in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False, device=device, dtype=dtype
        ),
        nn.GroupNorm(groups, out_channels, device=device, dtype=dtype),
        nn.ReLU(inplace=True),
    )


class SemanticFPNHead(nn.Module):
    """Panoptic FPN's semantic branch over FPN maps at ``strides`` (finest first); logits at the finest stride."""

    def __init__(
        self,
        in_channels: int,
        strides: Sequence[int],
        num_classes: int,
        channels: int = 128,
        dropout: float = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        finest = strides[0]
        self.scale_heads = nn.ModuleList()
        for stride in strides:
            num_stages = max(1, round(math.log2(stride / finest)))
            stages = [
                _conv_norm_act(in_channels if i == 0 else channels, channels, **factory) for i in range(num_stages)
            ]
            self.scale_heads.append(nn.Sequential(*stages))
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1, **factory)

    def forward(self, features: list[Tensor]) -> Tensor:
        size = features[0].shape[-2:]
        fused = torch.zeros(0)
        for i, scale_head in enumerate(self.scale_heads):
            # the ×2 upsampling between stages is folded into one resize to the finest map: the same for ×2^k
            # sizes, and exact alignment for odd sizes
            out = F.interpolate(scale_head(features[i]), size=size, mode="bilinear", align_corners=False)
            fused = out if i == 0 else fused + out
        return self.classifier(self.dropout(fused))


class UPerNetHead(nn.Module):
    """UPerNet: pyramid pooling module on the coarsest map + FPN fusion; logits at the finest stride."""

    def __init__(
        self,
        in_channels: Sequence[int],
        num_classes: int,
        channels: int = 128,
        pool_scales: Sequence[int] = (1, 2, 3, 6),
        dropout: float = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.pool_scales = list(pool_scales)
        # one norm group: a 1×1 pooled map at batch 1 still has `channels` values to normalise over
        self.ppm_convs = nn.ModuleList(
            _conv_norm_act(in_channels[-1], channels, 1, max_groups=1, **factory) for _ in pool_scales
        )
        self.ppm_bottleneck = _conv_norm_act(in_channels[-1] + len(pool_scales) * channels, channels, **factory)
        self.lateral_convs = nn.ModuleList(_conv_norm_act(c, channels, 1, **factory) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(_conv_norm_act(channels, channels, **factory) for _ in in_channels[:-1])
        self.fuse = _conv_norm_act(len(in_channels) * channels, channels, **factory)
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1, **factory)

    def _pyramid_pooling(self, x: Tensor) -> Tensor:
        pooled = [x]
        for i, conv in enumerate(self.ppm_convs):
            y = conv(F.adaptive_avg_pool2d(x, self.pool_scales[i]))
            pooled.append(F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False))
        return self.ppm_bottleneck(torch.cat(pooled, dim=1))

    def forward(self, features: list[Tensor]) -> Tensor:
        # index loops over ModuleLists (not zip) keep the head TorchScript-compatible
        top = self._pyramid_pooling(features[-1])
        laterals: list[Tensor] = []
        for i, lateral_conv in enumerate(self.lateral_convs):
            laterals.append(lateral_conv(features[i]))
        laterals.append(top)
        for i in range(len(laterals) - 1, 0, -1):
            up = F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:], mode="bilinear", align_corners=False)
            laterals[i - 1] = laterals[i - 1] + up
        size = laterals[0].shape[-2:]
        resized: list[Tensor] = []
        for i, fpn_conv in enumerate(self.fpn_convs):
            out = fpn_conv(laterals[i])
            resized.append(out if i == 0 else F.interpolate(out, size=size, mode="bilinear", align_corners=False))
        resized.append(F.interpolate(top, size=size, mode="bilinear", align_corners=False))
        return self.classifier(self.dropout(self.fuse(torch.cat(resized, dim=1))))


class _NoNeck(nn.Module):
    """Passes the backbone's maps through (UPerNet fuses them itself); typed for TorchScript, unlike nn.Identity."""

    def forward(self, features: list[Tensor]) -> list[Tensor]:
        return features


class SegmentationModel(nn.Module):
    """Backbone + (FPN neck +) head; ``forward(images) -> logits (B, num_classes, H, W)`` at the input size."""

    def __init__(
        self,
        backbone: FeatureBackbone,
        num_classes: int,
        head: str = "fpn",
        channels: int = 128,
        dropout: float = 0.1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if head not in SEGMENTATION_HEADS:
            raise ValueError(f"Unknown segmentation head {head!r}; expected one of {SEGMENTATION_HEADS}.")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}.")
        factory = {"device": device, "dtype": dtype}
        self.backbone = backbone
        self.num_classes = num_classes
        self.head_name = head
        if head == "fpn":
            self.neck: nn.Module = FPN(backbone.channels, channels, **factory)
            self.head: nn.Module = SemanticFPNHead(
                channels, backbone.strides, num_classes, channels=channels, dropout=dropout, **factory
            )
        else:
            self.neck = _NoNeck()
            self.head = UPerNetHead(backbone.channels, num_classes, channels=channels, dropout=dropout, **factory)

    def forward(self, images: Tensor) -> Tensor:
        features = self.backbone(images)
        features = self.neck(features)
        logits = self.head(features)
        return F.interpolate(logits, size=images.shape[-2:], mode="bilinear", align_corners=False)


def create_segmentation_model(
    backbone: str,
    num_classes: int,
    head: str = "fpn",
    channels: int = 128,
    dropout: float = 0.1,
    pretrained: bool = False,
    checkpoint: str | os.PathLike | None = None,
    out_indices: Sequence[int] | None = None,
    **backbone_kwargs,
) -> SegmentationModel:
    """Build a :class:`SegmentationModel` from a timm backbone name (``"linvit_tiny"``, ``"convnext_atto"``, ...).

    Stride-2 levels (ResNet's stem) are skipped unless ``out_indices`` says otherwise: heads start at stride 4.
    """
    if out_indices is None:
        import timm

        from linvit.dense.backbone import check_model_name

        check_model_name(backbone)
        with torch.device("meta"):
            probe = timm.create_model(backbone, features_only=True, **backbone_kwargs)
        out_indices = [i for i, r in enumerate(probe.feature_info.reduction()) if r >= 4]
    feature_backbone = create_feature_backbone(
        backbone, pretrained=pretrained, checkpoint=checkpoint, out_indices=out_indices, **backbone_kwargs
    )
    return SegmentationModel(feature_backbone, num_classes, head=head, channels=channels, dropout=dropout)

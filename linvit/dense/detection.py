"""torchvision detection models (Faster / Mask R-CNN, RetinaNet, ...) on any linvit or timm backbone.

torchvision's detectors accept any module with an ``out_channels`` attribute whose forward returns an ordered dict
of maps. :class:`DetectionBackbone` is that module: backbone → FPN → ``{"0": stride-4 map, ..., "pool": extra}``.
The helpers build anchors and RoI poolers that match its number of levels, so backbones with 3, 4 or 5 levels work.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from linvit.dense.backbone import FeatureBackbone, create_feature_backbone
from linvit.dense.fpn import FPN

__all__ = [
    "DetectionBackbone",
    "create_detection_backbone",
    "anchor_generator_for",
    "roi_pooler_for",
    "create_faster_rcnn",
    "create_mask_rcnn",
]


class DetectionBackbone(nn.Module):
    """Backbone + FPN with torchvision's detection backbone contract.

    Attributes:
        out_channels: channels of every returned map (torchvision reads it).
        featmap_names: names of the backbone levels (``"0"``, ``"1"``, ...), without the extra ``"pool"`` level;
            pass them to ``MultiScaleRoIAlign``.
    """

    def __init__(
        self,
        backbone: FeatureBackbone,
        out_channels: int = 256,
        extra_pool_level: bool = True,
        device: object | None = None,
        dtype: object | None = None,
    ) -> None:
        super().__init__()
        self.body = backbone
        self.fpn = FPN(
            backbone.channels, out_channels, num_extra_levels=int(extra_pool_level), device=device, dtype=dtype
        )
        self.out_channels = out_channels
        self.featmap_names: list[str] = [str(i) for i in range(len(backbone.channels))]
        self.names: list[str] = self.featmap_names + (["pool"] if extra_pool_level else [])
        self.strides: list[int] = list(backbone.strides) + ([backbone.strides[-1] * 2] if extra_pool_level else [])

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        maps = self.fpn(self.body(x))
        outputs: dict[str, Tensor] = OrderedDict()
        for name, feature in zip(self.names, maps):
            outputs[name] = feature
        return outputs


def create_detection_backbone(
    name: str,
    out_channels: int = 256,
    pretrained: bool = False,
    checkpoint: str | os.PathLike | None = None,
    out_indices: Sequence[int] | None = None,
    extra_pool_level: bool = True,
    **kwargs,
) -> DetectionBackbone:
    """Any timm model name (``"linvit_tiny"``, ``"resnet50"``) as a torchvision detection backbone with FPN.

    Stride-2 levels (ResNet's stem) are dropped by default: detection FPNs start at stride 4.
    """
    if out_indices is None:
        import timm

        with torch.device("meta"):
            probe = timm.create_model(name, features_only=True, **kwargs)
        reductions = probe.feature_info.reduction()
        out_indices = [i for i, r in enumerate(reductions) if r >= 4]
    backbone = create_feature_backbone(
        name, pretrained=pretrained, checkpoint=checkpoint, out_indices=out_indices, **kwargs
    )
    return DetectionBackbone(backbone, out_channels=out_channels, extra_pool_level=extra_pool_level)


def anchor_generator_for(backbone: DetectionBackbone, base_size: int = 8, aspect_ratios=(0.5, 1.0, 2.0)):
    """One anchor size per level, ``base_size × stride`` (32 at stride 4, ..., 512 at 64: torchvision's defaults)."""
    from torchvision.models.detection.anchor_utils import AnchorGenerator

    sizes: tuple[tuple[int, ...], ...] = tuple((base_size * s,) for s in backbone.strides)
    return AnchorGenerator(sizes=sizes, aspect_ratios=(tuple(aspect_ratios),) * len(sizes))


def roi_pooler_for(backbone: DetectionBackbone, output_size: int = 7, sampling_ratio: int = 2):
    """``MultiScaleRoIAlign`` over the backbone's levels (not the extra ``pool`` level)."""
    from torchvision.ops import MultiScaleRoIAlign

    return MultiScaleRoIAlign(
        featmap_names=backbone.featmap_names, output_size=output_size, sampling_ratio=sampling_ratio
    )


def create_faster_rcnn(backbone: str | DetectionBackbone, num_classes: int, **kwargs):
    """torchvision ``FasterRCNN`` on a linvit/timm backbone (a name or a :class:`DetectionBackbone`).

    ``num_classes`` counts the background. ``kwargs`` go to ``FasterRCNN`` (``min_size``, ``max_size``, ...).
    """
    from torchvision.models.detection import FasterRCNN

    if isinstance(backbone, str):
        backbone = create_detection_backbone(backbone)
    kwargs.setdefault("rpn_anchor_generator", anchor_generator_for(backbone))
    kwargs.setdefault("box_roi_pool", roi_pooler_for(backbone, 7))
    return FasterRCNN(backbone, num_classes=num_classes, **kwargs)


def create_mask_rcnn(backbone: str | DetectionBackbone, num_classes: int, **kwargs):
    """torchvision ``MaskRCNN`` on a linvit/timm backbone; see :func:`create_faster_rcnn`."""
    from torchvision.models.detection import MaskRCNN

    if isinstance(backbone, str):
        backbone = create_detection_backbone(backbone)
    kwargs.setdefault("rpn_anchor_generator", anchor_generator_for(backbone))
    kwargs.setdefault("box_roi_pool", roi_pooler_for(backbone, 7))
    kwargs.setdefault("mask_roi_pool", roi_pooler_for(backbone, 14))
    return MaskRCNN(backbone, num_classes=num_classes, **kwargs)

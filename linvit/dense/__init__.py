"""Dense prediction on any linvit/timm backbone: NCHW feature backbones, FPN, torchvision detection adapters,
semantic segmentation (models, the image/mask folder with its paired transforms, a synthetic task) and feature
extraction. Torch only: training these (Lightning) lives in :mod:`linvit.train` (``modules.segmentation``,
``data.segmentation``)."""

from linvit.dense.backbone import FeatureBackbone, check_model_name, create_feature_backbone
from linvit.dense.detection import (
    DetectionBackbone,
    anchor_generator_for,
    create_detection_backbone,
    create_faster_rcnn,
    create_mask_rcnn,
    roi_pooler_for,
)
from linvit.dense.fpn import FPN
from linvit.dense.seg_folder import IGNORE_INDEX, PairedTransform, SegmentationFolder
from linvit.dense.segmentation import (
    SEGMENTATION_HEADS,
    SegmentationModel,
    SemanticFPNHead,
    UPerNetHead,
    create_segmentation_model,
)

__all__ = [
    "FPN",
    "IGNORE_INDEX",
    "SEGMENTATION_HEADS",
    "DetectionBackbone",
    "FeatureBackbone",
    "PairedTransform",
    "SegmentationFolder",
    "SegmentationModel",
    "SemanticFPNHead",
    "UPerNetHead",
    "anchor_generator_for",
    "check_model_name",
    "create_detection_backbone",
    "create_faster_rcnn",
    "create_feature_backbone",
    "create_mask_rcnn",
    "create_segmentation_model",
    "roi_pooler_for",
]

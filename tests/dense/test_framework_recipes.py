"""The README's framework recipes, run as written: torchvision detection and segmentation_models_pytorch on linvit.

They use linvit_nano (the smallest linvit) at small sizes; skipped with a reason if a package is missing.
"""

import pytest
import torch


def test_torchvision_detection_recipe():
    # --- README recipe: torchvision detection ---
    import linvit  # noqa: F401  (registers linvit_* with timm)
    from linvit.dense import create_detection_backbone, create_faster_rcnn

    backbone = create_detection_backbone("linvit_nano", out_channels=64)  # FPN over strides 4..32 + "pool"
    model = create_faster_rcnn(backbone, num_classes=3, min_size=128, max_size=160)
    model.train()
    images = [torch.rand(3, 120, 150)]
    targets = [{"boxes": torch.tensor([[10.0, 20.0, 80.0, 90.0]]), "labels": torch.tensor([1])}]
    losses = model(images, targets)
    model.eval()
    with torch.no_grad():
        detections = model(images)
    # --- end recipe ---
    assert torch.isfinite(sum(losses.values()))
    assert {"boxes", "labels", "scores"} <= set(detections[0])
    assert list(backbone(torch.rand(1, 3, 64, 96))) == ["0", "1", "2", "3", "pool"]


def test_plain_torchvision_constructor_accepts_backbone():
    # torchvision's own MaskRCNN constructor with its default anchors / poolers (5 maps, featmap names 0..3)
    from torchvision.models.detection import MaskRCNN

    from linvit.dense import create_detection_backbone

    model = MaskRCNN(create_detection_backbone("linvit_nano", out_channels=32), num_classes=2, min_size=96, max_size=96)
    model.eval()
    with torch.no_grad():
        output = model([torch.rand(3, 96, 96)])
    assert "masks" in output[0]


def test_smp_recipe():
    pytest.importorskip("segmentation_models_pytorch", reason="pip install segmentation-models-pytorch for this recipe")
    # --- README recipe: segmentation_models_pytorch ---
    import segmentation_models_pytorch as smp

    import linvit  # noqa: F401  (registers linvit_* with timm, so smp's "tu-" encoders find them)

    model = smp.Unet("tu-linvit_nano", encoder_weights=None, classes=4)
    masks = model(torch.rand(2, 3, 64, 96))  # (2, 4, 64, 96)
    # --- end recipe ---
    assert masks.shape == (2, 4, 64, 96)
    assert model.encoder.out_channels[-4:] == [32, 64, 128, 256]
    masks.mean().backward()
    assert all(p.grad is not None for p in model.encoder.parameters() if p.requires_grad)


def test_segmentation_model_on_linvit_nano():
    from linvit.dense import create_segmentation_model

    model = create_segmentation_model("linvit_nano", num_classes=5, head="upernet", channels=32)
    logits = model(torch.rand(1, 3, 70, 90))
    assert logits.shape == (1, 5, 70, 90)
    assert model.backbone.strides == [4, 8, 16, 32]

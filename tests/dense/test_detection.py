"""torchvision Faster R-CNN / Mask R-CNN on linvit/timm backbones, in train and eval mode."""

import pytest
import torch

from linvit.dense import create_detection_backbone, create_faster_rcnn, create_mask_rcnn


def _targets(with_masks: bool):
    target = {"boxes": torch.tensor([[4.0, 6.0, 40.0, 44.0], [30.0, 10.0, 60.0, 30.0]]), "labels": torch.tensor([1, 2])}
    if with_masks:
        masks = torch.zeros(2, 64, 80, dtype=torch.uint8)
        masks[0, 6:44, 4:40] = 1
        masks[1, 10:30, 30:60] = 1
        target["masks"] = masks
    return [target]


def test_detection_backbone_contract():
    backbone = create_detection_backbone("test_resnet", out_channels=32)
    assert backbone.out_channels == 32
    outputs = backbone(torch.randn(1, 3, 64, 96))
    assert list(outputs) == ["0", "1", "2", "3", "pool"]  # stride-2 stem level dropped
    assert backbone.strides == [4, 8, 16, 32, 64]
    for name, stride in zip(outputs, backbone.strides):
        assert outputs[name].shape[1] == 32
        assert outputs[name].shape[-1] == -(-96 // stride)


@pytest.mark.parametrize("builder, with_masks", [(create_faster_rcnn, False), (create_mask_rcnn, True)])
def test_rcnn_train_and_eval(builder, with_masks):
    torch.manual_seed(0)
    backbone = create_detection_backbone("test_convnext", out_channels=32)
    model = builder(backbone, num_classes=3, min_size=64, max_size=96, box_detections_per_img=10)
    model.train()
    losses = model([torch.rand(3, 64, 80)], _targets(with_masks))
    expected = {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    expected |= {"loss_mask"} if with_masks else set()
    assert set(losses) == expected
    total = sum(losses.values())
    assert torch.isfinite(total)
    total.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in backbone.body.parameters())
    model.eval()
    with torch.no_grad():
        detections = model([torch.rand(3, 64, 80), torch.rand(3, 50, 70)])
    assert len(detections) == 2
    for detection in detections:
        assert {"boxes", "labels", "scores"} <= set(detection)
        if with_masks:
            assert detection["masks"].shape[1:] in ((1, 64, 80), (1, 50, 70))


def test_three_level_backbone_gets_matching_anchors():
    backbone = create_detection_backbone("test_convnext", out_indices=(1, 2, 3), out_channels=16)
    model = create_faster_rcnn(backbone, num_classes=2, min_size=64, max_size=64).eval()
    assert model.rpn.anchor_generator.sizes == ((64,), (128,), (256,), (512,))
    with torch.no_grad():
        assert len(model([torch.rand(3, 64, 64)])) == 1

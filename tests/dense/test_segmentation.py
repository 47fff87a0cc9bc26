"""Semantic-FPN / UPerNet segmentation models, the image/mask folder and its paired transforms (torch only)."""

import pytest
import torch

from linvit.dense import create_segmentation_model
from linvit.dense.seg_folder import IGNORE_INDEX, PairedTransform, SegmentationFolder
from linvit.dense.synthetic import generate_synthetic_segmentation


@pytest.mark.parametrize("head", ["fpn", "upernet"])
@pytest.mark.parametrize("size", [(64, 64), (45, 77)])
def test_logits_at_input_size_and_all_params_trained(head, size):
    model = create_segmentation_model("test_convnext", num_classes=5, head=head, channels=16)
    logits = model(torch.randn(2, 3, *size))
    assert logits.shape == (2, 5, *size)
    logits.mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_stride2_stem_is_skipped_and_bad_arguments_fail():
    model = create_segmentation_model("test_resnet", num_classes=3, channels=16)
    assert model.backbone.strides == [4, 8, 16, 32]
    with pytest.raises(ValueError, match="head"):
        create_segmentation_model("test_convnext", num_classes=3, head="deeplab")


def test_paired_transform_keeps_image_and_mask_aligned():
    # the mask equals the image's red channel quantised: any misalignment would break the equality
    image = torch.rand(3, 40, 60)
    mask = (image[0] * 4).floor().long().clamp(max=3)
    transform = PairedTransform((32, 32), train=True, scale_range=(1.0, 1.0), mean=(0, 0, 0), std=(1, 1, 1))
    for _ in range(5):
        out_image, out_mask = transform(image, mask)
        assert out_image.shape == (3, 32, 32) and out_mask.shape == (32, 32)
        torch.testing.assert_close((out_image[0] * 4).floor().long().clamp(max=3), out_mask)


def test_folder_dataset_and_errors(tmp_path):
    generate_synthetic_segmentation(tmp_path, num_train=3, num_val=2, size=(40, 48), seed=1)
    dataset = SegmentationFolder(tmp_path / "train" / "images", tmp_path / "train" / "masks", num_classes=4)
    image, mask = dataset[0]
    assert image.shape == (3, 40, 48) and mask.shape == (40, 48) and mask.dtype == torch.int64
    values = set(mask.unique().tolist())
    assert IGNORE_INDEX in values and values <= {0, 1, 2, 3, IGNORE_INDEX}
    with pytest.raises(ValueError, match="num_classes"):
        SegmentationFolder(tmp_path / "train" / "images", tmp_path / "train" / "masks", num_classes=1)[0]
    with pytest.raises(FileNotFoundError, match="images"):
        SegmentationFolder(tmp_path / "nope" / "images", tmp_path / "nope" / "masks")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated but still what users call
@pytest.mark.parametrize("head", ["fpn", "upernet"])
def test_neck_and_head_script(head):
    model = create_segmentation_model("test_convnext", num_classes=3, head=head, channels=16).eval()
    neck, decoder = torch.jit.script(model.neck), torch.jit.script(model.head)
    with torch.no_grad():
        features = model.backbone(torch.randn(1, 3, 50, 66))
        torch.testing.assert_close(decoder(neck(features)), model.head(model.neck(features)))

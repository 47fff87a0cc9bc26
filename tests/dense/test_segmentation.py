"""Semantic-FPN / UPerNet segmentation models, the folder DataModule, and a short training run that learns."""

import numpy as np
import pytest
import torch

from linvit.dense import create_segmentation_model
from linvit.dense.seg_data import IGNORE_INDEX, PairedTransform, SegmentationDataModule, SegmentationFolder
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


def test_datamodule_split_without_train_val_folders(tmp_path):
    generate_synthetic_segmentation(tmp_path / "gen", num_train=10, num_val=0, size=(32, 32))
    flat = tmp_path / "gen" / "train"
    datamodule = SegmentationDataModule(flat, num_classes=4, img_size=(32, 32), batch_size=4, val_fraction=0.2)
    datamodule.setup("fit")
    assert len(datamodule.train_set) == 8 and len(datamodule.val_set) == 2
    images, masks = next(iter(datamodule.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and masks.shape == (4, 32, 32)


def test_training_learns_synthetic_shapes(tmp_path):
    """A few epochs on the generated shapes task reach an mIoU far above chance and above predicting background."""
    import lightning as L

    from linvit.dense.seg_module import SegmentationModule

    L.seed_everything(0, workers=True)
    datamodule = SegmentationDataModule(
        tmp_path / "shapes",
        num_classes=4,
        img_size=(64, 64),
        batch_size=8,
        scale_range=(0.75, 1.25),
        synthetic={"num_train": 48, "num_val": 16, "size": (64, 64), "seed": 0},
    )
    module = SegmentationModule("test_convnext", 4, head="fpn", channels=32, optimizer={"lr": 3e-3})
    trainer = L.Trainer(
        max_epochs=8,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule)
    miou = float(trainer.callback_metrics["val/mIoU"])
    # the best constant answer (all background) scores IoU_bg / 4 over the four classes
    masks = torch.stack([m for _, m in datamodule.val_set])
    valid = masks != IGNORE_INDEX
    background_only = float(((masks == 0) & valid).sum() / valid.sum()) / 4
    assert miou > 0.45, f"mIoU {miou:.3f} after training"
    assert miou > 2 * background_only, (miou, background_only)
    assert np.isfinite(float(trainer.callback_metrics["val/loss"]))


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script is deprecated but still what users call
@pytest.mark.parametrize("head", ["fpn", "upernet"])
def test_neck_and_head_script(head):
    model = create_segmentation_model("test_convnext", num_classes=3, head=head, channels=16).eval()
    neck, decoder = torch.jit.script(model.neck), torch.jit.script(model.head)
    with torch.no_grad():
        features = model.backbone(torch.randn(1, 3, 50, 66))
        torch.testing.assert_close(decoder(neck(features)), model.head(model.neck(features)))

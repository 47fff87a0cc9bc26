"""Each data config trains a few steps with its default augmentation on real image files: photos and digits of
different sizes, PIL modes and formats (JPEG, PNG with alpha, palette GIF, CMYK, 16-bit, 1-bit, WebP, TIFF).

Through `train()` and the shipped configs, as `python train.py data=...` does; only the length of the run, the batch
size and the data's location are overridden (and the device, for the 8-GPU ImageNet recipe). Data workers, input
size and augmentation are the configs' defaults. The RandAugment posterize failure of Pillow 13 hid from tests that
fed tensors or one kind of image.
"""

from __future__ import annotations

import math

import pytest
import yaml
from train_helpers import SHORT, compose

from linvit.train.runs.run import train

pytest.importorskip("skimage", reason="scikit-image (the dev extra) has the sample photos")

from real_images import write_cifar_archive, write_image_folder, write_segmentation_folder  # noqa: E402

FEW_STEPS = [
    *SHORT,
    "trainer.accelerator=cpu",
    "trainer.num_sanity_val_steps=0",
    "callbacks.model_summary=null",
    "export.enabled=false",
]
# the paper's recipe is for 8 GPUs: one CPU process here, with its precision, clipping, mixup and augmentation
ON_THE_CPU = ["trainer.devices=1", "trainer.strategy=auto", "trainer.sync_batchnorm=false"]


def _train(tmp_path, *overrides: str) -> dict:
    metrics = train(compose([*overrides, *FEW_STEPS], tmp_path / "run"))
    assert math.isfinite(metrics["train/loss_epoch"]), metrics
    return metrics


def test_imagefolder(tmp_path):
    root = write_image_folder(tmp_path / "photos_and_digits", classes=3, per_class=5)
    metrics = _train(tmp_path, "data=imagefolder", f"data.root={root}", "data.num_classes=3", "data.batch_size=4")
    assert 0.0 <= metrics["test/acc1"] <= 1.0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    # 15 small images: the auto recipe's gentlest augmentation, recorded as the resolved string
    assert saved["data"]["auto_augment"] == "rand-m3-mstd0.5-inc1" and isinstance(saved["data"]["img_size"], int)
    assert saved["task_name"] == "photos_and_digits_linvit_nano"
    assert (tmp_path / "run" / "test_split.txt").is_file()


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_cifar(tmp_path, monkeypatch, variant):
    import torchvision.datasets.cifar

    root = write_cifar_archive(tmp_path / "data", variant)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)  # not CIFAR's
    metrics = _train(tmp_path, f"data={variant}", f"data.root={root}", "data.batch_size=8", "data.val_size=20")
    assert 0.0 <= metrics["test/acc1"] <= 1.0


def test_seg_folder(tmp_path):
    root = write_segmentation_folder(tmp_path / "streets", num_classes=3)
    (root / "classes.txt").write_text("dark\nmid\nbright\n")
    overrides = ["experiment=seg_synthetic_linvit_nano", "data=seg_folder", f"data.data_dir={root}"]
    overrides += ["data.num_classes=3", "data.batch_size=2", "data.eval_batch_size=2", "model.channels=16"]
    metrics = _train(tmp_path, *overrides)
    assert 0.0 <= metrics["test/mIoU"] <= 1.0
    assert {"test/IoU_dark", "test/IoU_mid", "test/IoU_bright"} <= set(metrics), sorted(metrics)
    assert not any("disc" in key for key in metrics)  # not the synthetic task's labels


def test_the_imagenet_recipe_on_a_tiny_imagefolder(tmp_path):
    """flatten_swin_tiny at 224 px, AdamW, RandAugment, mixup/cutmix, random erasing, bf16-mixed, clipping."""
    root = write_image_folder(tmp_path / "tiny_imagenet", classes=2, per_class=4)
    overrides = ["experiment=imagenet_flatten_swin_tiny", f"data.root={root}", "data.num_classes=2"]
    metrics = _train(tmp_path, *overrides, "data.batch_size=2", *ON_THE_CPU)
    assert 0.0 <= metrics["test/acc1"] <= 1.0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (saved["model"]["model_name"], saved["data"]["img_size"]) == ("flatten_swin_tiny_patch4_224", 224)

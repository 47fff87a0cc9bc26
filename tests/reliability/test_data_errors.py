"""Broken data: clear errors for what makes training impossible, bad single files skipped with one warning.

A tiny ImageNet-layout folder (2 classes x 3 images per split, 20x24 JPEGs) is built per test in tmp_path.
"""

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.train.datamodules import ImageFolderDataModule

CLASSES = ("cat", "dog")


@pytest.fixture
def image_root(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in CLASSES:
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            for index in range(3):
                pixels = rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{index}.jpg")
    return tmp_path


def _datamodule(root: Path, **kwargs) -> ImageFolderDataModule:
    options = {"num_classes": len(CLASSES), "img_size": 16, "batch_size": 2, "num_workers": 0, "auto_augment": None}
    options.update(re_prob=0.0, **kwargs)
    return ImageFolderDataModule(root=str(root), **options)


def _one_epoch(datamodule: ImageFolderDataModule) -> int:
    datamodule.setup("fit")
    return sum(len(targets) for _, targets in datamodule.train_dataloader())


# -- what makes training impossible: a clear error before training ------------------------------------------------
def test_missing_root_names_the_path_and_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)nowhere/train.*train/<class>.*data\.root"):
        _datamodule(tmp_path / "nowhere").setup("fit")


def test_missing_split_folder_names_it(image_root):
    shutil.rmtree(image_root / "val")
    with pytest.raises(FileNotFoundError, match=rf"{image_root / 'val'} is not a folder"):
        _datamodule(image_root).setup("fit")


def test_num_classes_that_disagrees_with_the_data_is_an_error(image_root):
    with pytest.raises(ValueError, match=r"2 classes but data\.num_classes=5.*data\.num_classes=2"):
        _datamodule(image_root, num_classes=5).setup("fit")


def test_a_class_missing_from_val_is_an_error(image_root):
    shutil.rmtree(image_root / "val" / "dog")
    with pytest.raises((ValueError, FileNotFoundError), match="class"):
        _datamodule(image_root).setup("fit")


def test_an_empty_class_folder_is_an_error_naming_it(image_root):
    (image_root / "train" / "empty").mkdir()
    with pytest.raises((ValueError, FileNotFoundError), match=rf"(?s){image_root / 'train' / 'empty'}"):
        _datamodule(image_root).setup("fit")


def test_fashion_mnist_missing_names_the_package_to_install(tmp_path):
    from linvit.train.datasets import load_fashion_mnist_arrays

    with pytest.raises(FileNotFoundError, match=rf"(?s){tmp_path}.*apt-get install.*dataset-fashion-mnist"):
        load_fashion_mnist_arrays(tmp_path)


# -- unusual but valid images ---------------------------------------------------------------------------------------
def test_png_with_alpha_is_composited_to_rgb(image_root):
    rgba = np.zeros((20, 24, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red, fully transparent on the left half
    rgba[:, 12:, 3] = 255
    Image.fromarray(rgba, "RGBA").save(image_root / "train" / "cat" / "alpha.png")
    datamodule = _datamodule(image_root)
    datamodule.setup("fit")
    path = next(p for p, _ in datamodule.train_set.samples if p.endswith("alpha.png"))
    pixels = np.asarray(datamodule.train_set.loader(path))
    assert pixels.shape == (20, 24, 3)
    assert (pixels[:, :12] == 255).all(), "transparent pixels should be white"
    assert (pixels[:, 12:] == (255, 0, 0)).all()
    assert _one_epoch(datamodule) == 6  # 7 images, drop_last batches of 2


def test_16_bit_greyscale_tiff_keeps_its_intensities(image_root):
    ramp = np.tile(np.linspace(0, 65535, 24).astype(np.uint16), (20, 1))
    Image.fromarray(ramp).save(image_root / "train" / "dog" / "grey16.tif")
    datamodule = _datamodule(image_root)
    datamodule.setup("fit")
    path = next(p for p, _ in datamodule.train_set.samples if p.endswith("grey16.tif"))
    pixels = np.asarray(datamodule.train_set.loader(path)).astype(np.float64)
    assert pixels.shape == (20, 24, 3)
    expected = np.tile(ramp / 257.0, (3, 1, 1)).transpose(1, 2, 0)
    assert np.abs(pixels - expected).max() <= 1.0


def test_non_image_files_are_ignored_by_extension(image_root):
    (image_root / "train" / "cat" / "notes.txt").write_text("not an image")
    (image_root / "train" / "cat" / ".DS_Store").write_bytes(b"\0\1")
    datamodule = _datamodule(image_root)
    datamodule.setup("fit")
    assert len(datamodule.train_set) == 6 and datamodule.train_set.classes == list(CLASSES)


# -- single bad files: skipped with one warning (or fatal by a switch), the label set unchanged ---------------------
def _add_bad_files(root: Path) -> list[str]:
    (root / "train" / "cat" / "garbage.jpg").write_bytes(b"this is not a JPEG")
    good = (root / "train" / "dog" / "0.jpg").read_bytes()
    (root / "train" / "dog" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    return ["garbage.jpg", "truncated.jpg"]


def test_bad_files_are_skipped_with_one_warning_naming_them(image_root, caplog, recwarn):
    names = _add_bad_files(image_root)
    datamodule = _datamodule(image_root, batch_size=1, drop_last=False)
    with caplog.at_level(logging.WARNING):
        seen = _one_epoch(datamodule)
    assert datamodule.train_set.classes == list(CLASSES), "the label set changed"
    assert seen >= 6
    messages = [r.getMessage() for r in caplog.records] + [str(w.message) for w in recwarn]
    reports = [m for m in messages if all(n in m for n in names)]
    assert len(reports) == 1 and "2" in reports[0], messages


def test_bad_files_are_fatal_when_configured(image_root):
    _add_bad_files(image_root)
    datamodule = _datamodule(image_root, batch_size=1, drop_last=False, bad_files="error")
    with pytest.raises((OSError, ValueError), match=r"garbage\.jpg|truncated\.jpg"):
        _one_epoch(datamodule)


def test_loaded_batches_are_float_images_of_the_configured_size(image_root):
    datamodule = _datamodule(image_root)
    datamodule.setup("fit")
    images, targets = next(iter(datamodule.train_dataloader()))
    assert images.dtype == torch.float32 and images.shape == (2, 3, 16, 16)
    assert targets.dtype == torch.int64 and set(targets.tolist()) <= {0, 1}


def test_bad_files_skipped_in_worker_processes_are_reported_by_the_main_process(image_root, caplog):
    names = _add_bad_files(image_root)
    datamodule = _datamodule(image_root, batch_size=1, drop_last=False, num_workers=1)
    with caplog.at_level(logging.WARNING):
        seen = _one_epoch(datamodule)
    assert seen == 8
    reports = [r.getMessage() for r in caplog.records if all(n in r.getMessage() for n in names)]
    assert len(reports) == 1 and "skipped 2 " in reports[0]


def test_an_unknown_bad_files_mode_is_an_error(image_root):
    with pytest.raises(ValueError, match=r"bad_files.*skip.*error.*'ignore'"):
        _datamodule(image_root, bad_files="ignore")

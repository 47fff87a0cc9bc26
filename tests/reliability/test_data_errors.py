"""Broken data: clear errors for what makes training impossible, bad single files skipped with one warning.

A tiny ImageNet-layout folder (2 classes x 3 images per split, 20x24 JPEGs) is built per test in tmp_path.
"""

import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.train.data.datamodules import ImageFolderDataModule
from linvit.train.runs.hydra_app import config_dir

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
    options.update(re_prob=0.0, test_fraction=0, **kwargs)  # every train image in train (no test split held out)
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
    from linvit.train.data.datasets import load_fashion_mnist_arrays

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


def test_rgba_images_are_composited_on_white_for_one_channel_models_too(image_root):
    rgba = np.zeros((20, 24, 4), dtype=np.uint8)
    rgba[..., 0] = 255  # red, fully transparent on the left half
    rgba[:, 12:, 3] = 255
    Image.fromarray(rgba, "RGBA").save(image_root / "train" / "cat" / "alpha.png")
    Image.fromarray(rgba[..., [0, 3]], "LA").save(image_root / "train" / "dog" / "alpha_grey.png")
    datamodule = _datamodule(image_root, in_chans=1, mean=[0.5], std=[0.5])
    datamodule.setup("fit")
    loader = datamodule.train_set.loader
    colour = np.asarray(loader(str(image_root / "train" / "cat" / "alpha.png")))
    grey = np.asarray(loader(str(image_root / "train" / "dog" / "alpha_grey.png")))
    expected_red = np.asarray(Image.new("RGB", (1, 1), (255, 0, 0)).convert("L"))[0, 0]  # ITU-R 601: 76
    for pixels, opaque in ((colour, expected_red), (grey, 255)):
        assert pixels.shape == (20, 24)
        assert (pixels[:, :12] == 255).all(), "transparent pixels should be white, as in the RGB path"
        assert (pixels[:, 12:] == opaque).all()


# -- symlinks: loops refused, links out of a class folder followed only with a warning ------------------------------
def _samples(root: Path) -> int:
    datamodule = _datamodule(root)
    datamodule.setup("fit")
    return len(datamodule.train_set)


@pytest.mark.parametrize(("link", "target"), [("cat/loop", "."), ("dog/up", ".."), ("cat/deep/loop", "../..")])
def test_a_symlink_loop_is_refused_naming_the_link(image_root, link, target):
    path = image_root / "train" / link
    path.parent.mkdir(exist_ok=True)
    path.symlink_to(target)
    with pytest.raises(ValueError, match=rf"(?s)symlink loop.*{path}"):
        _samples(image_root)


def test_a_loop_between_two_links_outside_the_tree_is_refused(image_root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "a").mkdir()
    (outside / "b").mkdir()
    (outside / "a" / "to_b").symlink_to(outside / "b")
    (outside / "b" / "to_a").symlink_to(outside / "a")
    (image_root / "train" / "cat" / "elsewhere").symlink_to(outside / "a")
    with pytest.raises(ValueError, match="symlink loop"):
        _samples(image_root)


def test_a_link_into_another_class_folder_is_refused(image_root):
    (image_root / "train" / "cat" / "dogs").symlink_to("../dog")
    with pytest.raises(ValueError, match=r"(?s)cat/dogs.*class folder.*dog"):
        _samples(image_root)


def test_links_out_of_the_class_folder_are_followed_with_a_warning_naming_them(image_root, tmp_path_factory, caplog):
    outside = tmp_path_factory.mktemp("outside")
    for index in range(2):
        Image.new("RGB", (20, 24), (index, 0, 0)).save(outside / f"{index}.png")
    (image_root / "train" / "cat" / "more").symlink_to(outside)
    (image_root / "train" / "dog" / "one.png").symlink_to(outside / "0.png")
    (image_root / "train" / "dog" / "same_class.jpg").symlink_to("0.jpg")  # inside its class folder: silent
    with caplog.at_level(logging.WARNING):
        assert _samples(image_root) == 6 + 2 + 1 + 1
    reports = [r.getMessage() for r in caplog.records if "out of" in r.getMessage()]
    assert len(reports) == 1 and "2 link" in reports[0], reports
    assert "cat/more" in reports[0] and "dog/one.png" in reports[0] and "same_class" not in reports[0]


def test_class_folders_that_are_the_same_folder_are_refused(image_root):
    (image_root / "train" / "kitten").symlink_to("cat")
    (image_root / "val" / "kitten").symlink_to("cat")
    with pytest.raises(ValueError, match=r"(?s)kitten.*cat"):
        _datamodule(image_root, num_classes=3).setup("fit")


# -- any error while decoding one file is that file's problem ------------------------------------------------------
def _decompression_bomb_png(path: Path) -> None:
    """A valid PNG header claiming 20000 x 20000 pixels: PIL raises DecompressionBombError (not an OSError)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 64)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def test_a_decompression_bomb_is_skipped_and_named(image_root, caplog):
    _decompression_bomb_png(image_root / "train" / "cat" / "bomb.png")
    datamodule = _datamodule(image_root, batch_size=1, drop_last=False)
    with caplog.at_level(logging.WARNING):
        assert _one_epoch(datamodule) == 7
    assert any("bomb.png" in r.getMessage() and "skipped 1 " in r.getMessage() for r in caplog.records)
    fatal = _datamodule(image_root, batch_size=1, drop_last=False, bad_files="error")
    with pytest.raises(OSError, match=r"bomb\.png"):
        _one_epoch(fatal)


@pytest.mark.parametrize("error", [KeyError(101), ZeroDivisionError("x"), RuntimeError("decoder"), MemoryError()])
def test_any_exception_of_the_loader_is_handled_like_an_unreadable_file(image_root, error, caplog):
    from linvit.train.data.image_folder import PilLoader, ReadableByPil, TolerantImageFolder

    class Failing(PilLoader):
        def __call__(self, path):
            if path.endswith("1.jpg"):
                raise error
            return super().__call__(path)

    folder = TolerantImageFolder(str(image_root / "train"), loader=Failing("RGB"), is_valid_file=ReadableByPil())
    with caplog.at_level(logging.WARNING):
        assert len([folder[i] for i in range(len(folder))]) == 6
        assert folder.report_bad_files() == [str(image_root / "train" / name / "1.jpg") for name in CLASSES]
    strict = TolerantImageFolder(
        str(image_root / "train"), bad_files="error", loader=Failing("RGB"), is_valid_file=ReadableByPil()
    )
    with pytest.raises(OSError, match=rf"{image_root / 'train' / 'cat' / '1.jpg'}.*{type(error).__name__}"):
        [strict[i] for i in range(len(strict))]


# -- skipped files: reported when a pass ends (not when the next one starts) and in the run's summary ---------------
def test_skipped_files_are_reported_when_the_last_batch_is_fetched(image_root, caplog):
    """Lightning stops after len(loader) batches without exhausting the iterator: the report cannot wait for that."""
    names = _add_bad_files(image_root)
    datamodule = _datamodule(image_root, batch_size=1, drop_last=False)
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    with caplog.at_level(logging.WARNING):
        batches = iter(loader)
        for _ in range(len(loader)):
            next(batches)
    reports = [r.getMessage() for r in caplog.records if all(n in r.getMessage() for n in names)]
    assert len(reports) == 1 and "skipped 2 " in reports[0]


def test_a_one_epoch_run_reports_skipped_files_and_its_summary_counts_them(image_root, tmp_path_factory, caplog):
    from hydra import compose, initialize_config_dir

    from linvit.train.runs.run import summarize, train

    names = _add_bad_files(image_root)
    output_dir = tmp_path_factory.mktemp("run")
    overrides = [
        "model=timm",
        "model.model_name=test_resnet",
        "data=imagefolder",
        f"data.root={image_root}",
        "data.num_classes=2",
        "data.test_fraction=0",
        "data.img_size=16",
        "data.batch_size=2",
        "data.num_workers=0",
        "data.persistent_workers=false",
        "data.pin_memory=false",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0",
        "callbacks.model_summary=null",
        "export.enabled=false",
        f"paths.output_dir={output_dir}",
    ]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    with caplog.at_level(logging.WARNING):
        metrics = train(cfg)
    reports = [r.getMessage() for r in caplog.records if all(n in r.getMessage() for n in names)]
    assert len(reports) == 1, [r.getMessage() for r in caplog.records]
    summary = summarize(cfg, metrics)
    assert "2 unreadable image file(s) skipped" in summary, summary


# -- data options: clear errors for values that cannot be meant, caps for what the machine cannot give --------------
@pytest.mark.parametrize("key", ["batch_size", "eval_batch_size"])
@pytest.mark.parametrize("value", ["1.5", "0", "-2", "true"])
def test_a_batch_size_that_is_not_a_positive_integer_is_refused(key, value, tmp_path):
    from hydra import compose, initialize_config_dir

    from linvit.train.runs.run import _instantiate_plain

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"data.{key}={value}", f"paths.output_dir={tmp_path}"])
    given = {"true": "True"}.get(value, value)  # Hydra reads `true` as a bool, which int() would take for 1
    with pytest.raises(ValueError, match=rf"data\.{key} must be a positive integer, got {given}"):
        _instantiate_plain(cfg.data, "data")


def test_a_whole_number_written_as_a_float_is_accepted_as_a_batch_size():
    from linvit.train.data.datamodules import DigitsDataModule

    assert DigitsDataModule(batch_size=8.0).batch_size == 8


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"val_fraction": 1.5}, "data.val_fraction=1.5"),
        ({"test_fraction": 0.0}, "data.test_fraction=0.0"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "data.val_fraction=0.6 and data.test_fraction=0.5"),
    ],
)
def test_split_fractions_are_checked_as_given(options, named):
    from linvit.train.data.datamodules import DigitsDataModule

    with pytest.raises(ValueError, match=re.escape(named)) as caught:
        DigitsDataModule(**options).setup("fit")
    assert "1.875" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 1.5}, r"data\.batch_size must be a positive integer, got 1\.5: set data\.batch_size=1 or"),
        ({"eval_batch_size": 0}, r"data\.eval_batch_size must be a positive integer, got 0"),
        ({"num_classes": True}, r"data\.num_classes must be a positive integer, got True"),
        ({"img_size": [64, 0]}, r"data\.img_size must be a positive integer, got 0"),
        ({"img_size": [32, 48, 64]}, r"data\.img_size must be one side or \[height, width\], got \[32, 48, 64\]"),
        ({"val_fraction": 1.5}, r"data\.val_fraction=1\.5 is not a share of the data"),
    ],
)
def test_segmentation_data_options_are_checked_like_classification(options, message, tmp_path):
    from linvit.train.data.segmentation import SegmentationDataModule

    with pytest.raises(ValueError, match=message):
        SegmentationDataModule(tmp_path, **{"num_classes": 3, **options})
    assert SegmentationDataModule(tmp_path, num_classes=3, batch_size=4.0, img_size=48).crop_size == (48, 48)


def test_more_data_workers_than_cores_are_capped_with_a_warning(image_root, caplog):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with caplog.at_level(logging.WARNING):
        datamodule = _datamodule(image_root, num_workers=100_000, persistent_workers=True)
    assert datamodule.num_workers == cores
    assert any("100000" in r.getMessage() and f"{cores}" in r.getMessage() for r in caplog.records)
    datamodule.setup("fit")
    assert datamodule.train_dataloader().num_workers == cores
    with pytest.raises(ValueError, match=r"data\.num_workers must be a non-negative integer, got -1"):
        _datamodule(image_root, num_workers=-1)


def test_a_fashion_mnist_val_size_beyond_the_data_is_named_as_given(monkeypatch):
    import linvit.train.data.datamodules as datamodules

    images, labels = np.zeros((40, 28, 28), dtype=np.uint8), np.arange(40) % 10
    monkeypatch.setattr(datamodules, "load_fashion_mnist_arrays", lambda root, split: (images, labels))
    with pytest.raises(ValueError, match=r"data\.val_size=70000 holds out all 40"):
        datamodules.FashionMNISTDataModule(val_size=70_000).setup("fit")
    with pytest.raises(ValueError, match=r"data\.val_size must be a positive integer, got 0\.5"):
        datamodules.FashionMNISTDataModule(val_size=0.5)


def test_a_pass_cut_short_reports_its_skipped_files_at_teardown(image_root, caplog):
    names = _add_bad_files(image_root)
    datamodule = _datamodule(image_root)
    datamodule.setup("fit")
    for index in range(len(datamodule.train_set)):  # read, as a pass that Lightning stops early (fast_dev_run)
        datamodule.train_set[index]
    with caplog.at_level(logging.WARNING):
        datamodule.teardown("fit")
    reports = [r.getMessage() for r in caplog.records if all(n in r.getMessage() for n in names)]
    assert len(reports) == 1
    assert [Path(path).name for path in datamodule.skipped_files()] == sorted(names)

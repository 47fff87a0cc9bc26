"""Hostile image files: one loader (:mod:`linvit.io.images`) with one policy for training, check-data and predict.

Every file is built in tmp_path: float TIFFs full of NaN / Inf / 1e30, a PNG header claiming 20000 x 20000 pixels (a
decompression bomb), a 2 KB PNG of 1 x 1,000,000 pixels, a 0-byte JPEG, a PNG of width 0, a FIFO named like an
image, and a link into two links that point at each other. A FIFO that something opens for reading would block it
forever: :func:`fifo_watch` opens the other end as soon as a reader appears, so a regression fails instead of hanging.
"""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from linvit.cli import main
from linvit.io.images import ImageInputError, ImageLimits, decode_image, load_image, open_image

REPO = Path(__file__).resolve().parents[2]
CLASSES = ("cat", "dog")


# -- hostile files -------------------------------------------------------------------------------------------------
def _png(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` 8-bit grey pixels (the data is one compressed row or less)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def _float_tiff(path: Path, value: float) -> None:
    pixels = np.full((12, 16), 100.0, dtype=np.float32)
    pixels[3:6, 4:9] = value
    Image.fromarray(pixels, "F").save(path)


# each hostile regular file _write_hostile makes, and a phrase of its refusal
HOSTILE = {
    "nan.tif": "NaN/Inf",
    "inf.tif": "NaN/Inf",
    "fill.tif": "1e+30",
    "bomb.png": "max-pixels",
    "big.png": "max-pixels",
    "tall.png": "max-aspect",
    "empty.jpg": "empty (0 bytes)",
    "width0.png": "cannot read image",
    "truncated.jpg": "cannot decode image",
}


def _write_hostile(folder: Path) -> dict[str, str]:
    """Each hostile regular file in ``folder``; returns :data:`HOSTILE`."""
    folder.mkdir(parents=True, exist_ok=True)
    _float_tiff(folder / "nan.tif", float("nan"))
    _float_tiff(folder / "inf.tif", float("-inf"))
    _float_tiff(folder / "fill.tif", 1e30)
    (folder / "bomb.png").write_bytes(_png(20_000, 20_000))  # over twice PIL's bound: PIL's own error
    (folder / "big.png").write_bytes(_png(10_000, 10_000))  # over the bound, under twice it: PIL only warns
    Image.new("L", (1, 1_000_000)).save(folder / "tall.png")  # 2 KB
    (folder / "empty.jpg").write_bytes(b"")
    (folder / "width0.png").write_bytes(_png(0, 10))
    good = folder / "good.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(good)
    (folder / "truncated.jpg").write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # the header is whole
    good.unlink()
    return HOSTILE


def _loop_link(link: Path, elsewhere: Path) -> None:
    """``link`` -> ``elsewhere/a`` -> ``elsewhere/b`` -> ``elsewhere/a``: stat says ELOOP."""
    elsewhere.mkdir(parents=True, exist_ok=True)
    (elsewhere / "a").symlink_to(elsewhere / "b")
    (elsewhere / "b").symlink_to(elsewhere / "a")
    link.symlink_to(elsewhere / "a")


@contextmanager
def fifo_watch(path: Path) -> Iterator[list[str]]:
    """A FIFO at ``path``; if anything opens it for reading, the watcher opens the writing end (so the reader gets
    end-of-file instead of blocking for ever) and notes it in the list, which the test then asserts is empty."""
    os.mkfifo(path)
    opened: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO while no reader has it open
            except OSError:
                time.sleep(0.02)
                continue
            opened.append(str(path))
            os.close(fd)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield opened
    finally:
        stop.set()
        watcher.join()


@pytest.fixture
def image_root(tmp_path) -> Path:
    """train and val, 2 classes x 3 readable 20x24 JPEGs each."""
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(3):
                Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(folder / f"{index}.jpg")
    return root


def _one_line(text: str) -> None:
    assert "Traceback" not in text and "\n" not in text.strip(), text


# -- the loader ----------------------------------------------------------------------------------------------------
def test_each_hostile_file_is_one_line_naming_it(tmp_path):
    for name, phrase in _write_hostile(tmp_path).items():
        path = tmp_path / name
        with pytest.raises(ImageInputError) as caught:
            load_image(path, "RGB")
        message = str(caught.value)
        assert str(path) in message and phrase in message, (name, message)
        _one_line(message)


def test_images_over_the_limits_are_refused_from_the_header_without_decoding(tmp_path, monkeypatch):
    _write_hostile(tmp_path)
    from PIL import ImageFile

    decoded = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: decoded.append(image) or real_load(image))
    for name in ("tall.png", "big.png", "bomb.png"):
        with pytest.raises(ImageInputError, match=r"not decoded|too large to decode"):
            load_image(tmp_path / name, "RGB")
    assert decoded == []


def test_the_limits_are_the_users_to_raise_and_named_as_given(tmp_path):
    path = tmp_path / "wide.png"
    Image.new("RGB", (300, 10)).save(path)
    assert load_image(path, "RGB").size == (300, 10)  # aspect 30, pixels 3,000: within the defaults
    with pytest.raises(ImageInputError, match=r"wide\.png.*30 times.*limit is 20.*data\.max_aspect"):
        load_image(path, "RGB", ImageLimits(max_aspect=20, aspect_option="data.max_aspect"))
    with pytest.raises(ImageInputError, match=r"wide\.png.*3,000 pixels.*limit of 2,999.*--max-pixels"):
        load_image(path, "RGB", ImageLimits(max_pixels=2999))
    for bad in ({"max_pixels": 0}, {"max_pixels": 1.5}, {"max_pixels": True}, {"max_aspect": 0.5}):
        with pytest.raises(ValueError, match=r"--max-(pixels|aspect)"):
            ImageLimits(**bad)


def test_a_raised_pixel_limit_lets_a_large_image_through_pils_own_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # raised below; restored after the test
    path = tmp_path / "big.png"
    path.write_bytes(_png(20_000, 20_000))
    with open_image(path, ImageLimits(max_pixels=400_000_000)) as image:  # the header only: nothing decoded
        assert image.size == (20_000, 20_000)


def test_valid_float_and_16_bit_images_still_load(tmp_path):
    _float_tiff(tmp_path / "float.tif", 200.0)
    Image.fromarray(np.full((12, 16), 40000, dtype=np.uint16)).save(tmp_path / "grey16.png")
    assert np.asarray(load_image(tmp_path / "float.tif", "L")).max() == 200
    assert np.asarray(load_image(tmp_path / "grey16.png", "L")).max() == round(40000 / 257)
    assert decode_image(tmp_path / "float.tif").mode == "F"


def test_non_regular_files_and_link_loops_are_named_never_opened(tmp_path):
    (tmp_path / "folder.jpg").mkdir()
    _loop_link(tmp_path / "loop.jpg", tmp_path / "elsewhere")
    (tmp_path / "dangling.jpg").symlink_to(tmp_path / "nowhere")
    with fifo_watch(tmp_path / "fifo.jpg") as opened:
        for name, phrase in [
            ("fifo.jpg", "a FIFO, not a regular file: not opened"),
            ("folder.jpg", "a folder, not a regular file"),
            ("loop.jpg", "symlink loop"),
            ("dangling.jpg", r"does not exist \(a broken symlink\)"),
        ]:
            with pytest.raises(ImageInputError, match=phrase) as caught:
                load_image(tmp_path / name, "RGB")
            assert str(tmp_path / name) in str(caught.value)
            _one_line(str(caught.value))
        with pytest.raises(ImageInputError, match=r"/dev/null' is a device, not a regular file"):
            load_image("/dev/null", "RGB")
    assert opened == []


# -- check-data ----------------------------------------------------------------------------------------------------
def test_check_data_names_every_hostile_file_and_exits_1(image_root, capsys):
    expected = _write_hostile(image_root / "train" / "cat")
    with fifo_watch(image_root / "train" / "cat" / "fifo.jpg") as opened:
        status = main(["check-data", str(image_root), "--workers", "2"])
    assert opened == []
    captured = capsys.readouterr()
    assert status == 1, captured.out
    assert "Traceback" not in captured.out + captured.err
    listing = captured.out.split("unreadable files")[1].split("\n\n")[0]
    for name, phrase in {**expected, "fifo.jpg": "FIFO"}.items():
        line = next((line for line in listing.splitlines() if f"train/cat/{name}:" in line), None)
        assert line is not None and phrase in line, (name, listing)
    assert f"{len(expected) + 1} unreadable file(s)" in captured.out.splitlines()[-1]


def test_check_data_takes_the_limits_as_options(image_root, capsys):
    assert main(["check-data", str(image_root), "--max-pixels", "400"]) == 1  # 20 x 24 = 480 pixels
    output = capsys.readouterr().out
    assert "12 unreadable file(s)" in output and "over the limit of 400" in output and "--max-pixels" in output
    assert main(["check-data", str(image_root), "--max-aspect", "0.5"]) == 2
    assert "error: --max-aspect" in capsys.readouterr().err


def test_check_data_names_a_link_loop_as_a_problem(image_root, tmp_path, capsys):
    _loop_link(image_root / "train" / "cat" / "x.jpg", tmp_path / "elsewhere")
    assert main(["check-data", str(image_root), "--workers", "1"]) == 1
    output = capsys.readouterr().out
    assert f"train: cannot be listed: symlink loop: {image_root / 'train' / 'cat' / 'x.jpg'}" in output, output
    assert "Traceback" not in output


def test_check_data_reports_a_single_class_as_a_problem(image_root, capsys):
    root = image_root / "train"
    for split in ("train", "val"):
        for path in (image_root / split / "dog").iterdir():
            path.unlink()
        (image_root / split / "dog").rmdir()
    assert main(["check-data", str(root)]) == 1
    problems = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "all: one class folder (cat), training needs two or more" in problems, problems


# -- training ------------------------------------------------------------------------------------------------------
def _datamodule(root: Path, **kwargs):
    from linvit.train.data.datamodules import ImageFolderDataModule

    options = {"num_classes": 2, "img_size": 16, "batch_size": 1, "num_workers": 0, "auto_augment": None}
    options.update(re_prob=0.0, test_fraction=0, drop_last=False, **kwargs)
    return ImageFolderDataModule(root=str(root), **options)


def test_training_skips_and_counts_every_hostile_file(image_root, caplog):
    expected = _write_hostile(image_root / "train" / "cat")
    with fifo_watch(image_root / "train" / "cat" / "fifo.jpg") as opened:
        datamodule = _datamodule(image_root, img_size="auto")  # auto: the headers are read too
        with caplog.at_level(logging.WARNING):
            datamodule.setup("fit")
            seen = sum(len(targets) for _, targets in datamodule.train_dataloader())
    assert opened == []
    assert seen == len(datamodule.train_set) == 6 + len(expected) + 1  # another image stands in for each
    skipped = sorted(Path(path).name for path in datamodule.train_set.skipped_files)
    assert skipped == sorted([*expected, "fifo.jpg"])
    reports = [r.getMessage() for r in caplog.records if "skipped 10 unreadable" in r.getMessage()]
    assert len(reports) == 1, [r.getMessage() for r in caplog.records]


def test_training_with_bad_files_error_stops_on_the_first_naming_it(image_root):
    _float_tiff(image_root / "train" / "cat" / "nan.tif", float("nan"))
    datamodule = _datamodule(image_root, bad_files="error")
    datamodule.setup("fit")
    with pytest.raises(OSError, match=r"cannot read image .*nan\.tif: image '.*nan\.tif' holds 15 NaN/Inf") as caught:
        for _ in datamodule.train_dataloader():
            pass
    _one_line(str(caught.value))


def test_training_takes_the_limits_from_the_data_config(image_root):
    datamodule = _datamodule(image_root, max_pixels=400, bad_files="error")
    datamodule.setup("fit")
    with pytest.raises(OSError, match=r"over the limit of 400.*data\.max_pixels"):
        next(iter(datamodule.train_dataloader()))
    with pytest.raises(ValueError, match=r"data\.max_aspect"):
        _datamodule(image_root, max_aspect=0)


def test_training_refuses_a_link_loop_and_a_single_class_before_it_starts(image_root, tmp_path):
    from linvit.train.data.folder_scan import FolderLayoutError

    _loop_link(image_root / "train" / "cat" / "x.jpg", tmp_path / "elsewhere")
    with pytest.raises(FolderLayoutError, match=r"symlink loop: .*cat/x\.jpg") as caught:
        _datamodule(image_root).setup("fit")
    _one_line(str(caught.value))
    (image_root / "train" / "cat" / "x.jpg").unlink()
    for split in ("train", "val"):
        for path in (image_root / split / "dog").iterdir():
            path.unlink()
        (image_root / split / "dog").rmdir()
    with pytest.raises(FolderLayoutError, match=rf"{image_root / 'train'} holds one class folder \(cat\).*two"):
        _datamodule(image_root).setup("fit")
    with pytest.raises(FolderLayoutError, match=rf"data\.num_classes=1: .*two classes.*{image_root}/train"):
        _datamodule(image_root, num_classes=1)


# -- predict -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    _write_hostile(folder)
    return folder


@pytest.mark.parametrize("name", list(HOSTILE))
def test_predict_refuses_each_hostile_image_in_one_line(hostile_dir, name, capsys, monkeypatch):
    from PIL import ImageFile

    decoded = []  # an image over the limits is refused from its header: the 1 x 1,000,000 PNG took 6.2 GB decoded
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda image: decoded.append(image) or real_load(image))
    path = hostile_dir / name
    assert main(["predict", str(path), "--model", "linvit_nano", "--topk", "1"]) == 1
    assert decoded == [] or "max-" not in HOSTILE[name]
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(path) in errors[0], err
    assert "Traceback" not in err and "DecompressionBomb" not in err, err


def test_predict_never_opens_a_fifo_and_names_a_link_loop(tmp_path, capsys):
    _loop_link(tmp_path / "loop.png", tmp_path / "elsewhere")
    assert main(["predict", str(tmp_path / "loop.png"), "--model", "linvit_nano"]) == 1
    assert f"error: image '{tmp_path / 'loop.png'}' is a symlink loop" in capsys.readouterr().err
    with fifo_watch(tmp_path / "x.jpg") as opened:
        assert main(["predict", str(tmp_path / "x.jpg"), "--model", "linvit_nano"]) == 1
    assert opened == []
    assert f"error: image '{tmp_path / 'x.jpg'}' is a FIFO" in capsys.readouterr().err


def test_predict_takes_the_limits_as_options(tmp_path, capsys):
    path = tmp_path / "wide.png"
    Image.new("RGB", (300, 10)).save(path)
    assert main(["predict", str(path), "--model", "linvit_nano", "--max-aspect", "20"]) == 1
    assert "--max-aspect" in capsys.readouterr().err
    assert main(["predict", str(path), "--model", "linvit_nano", "--max-pixels", "-3"]) == 1
    assert "error: --max-pixels must be a positive number" in capsys.readouterr().err


# -- end to end: train.py with a FIFO in the data ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_py_finishes_with_a_fifo_in_the_data_and_refuses_one_class(image_root, tmp_path):
    overrides = [
        "model=timm",
        "model.model_name=test_resnet",
        "data=imagefolder",
        f"data.root={image_root}",
        "data.num_classes=2",
        "data.test_fraction=0",
        "data.img_size=16",
        "data.batch_size=2",
        "data.num_workers=1",
        "data.persistent_workers=false",
        "data.pin_memory=false",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0",
        "callbacks.model_summary=null",
        "export.enabled=false",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}

    def train(output: Path, *extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(REPO / "train.py"), *overrides, f"paths.output_dir={output}", *extra]
        return subprocess.run(command, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)

    with fifo_watch(image_root / "train" / "cat" / "x.jpg") as opened:
        result = train(tmp_path / "run")
    assert opened == []
    assert result.returncode == 0, result.stderr[-3000:]
    assert "1 unreadable image file(s) skipped" in result.stdout + result.stderr
    os.unlink(image_root / "train" / "cat" / "x.jpg")
    for split in ("train", "val"):
        for path in (image_root / split / "dog").iterdir():
            path.unlink()
        (image_root / split / "dog").rmdir()
    for extra, named in (((), "holds one class folder (cat)"), (("data.num_classes=1",), "data.num_classes=1")):
        result = train(tmp_path / "one_class", *extra)
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and named in errors[0], result.stderr[-3000:]
        assert "Traceback" not in result.stderr


# -- segmentation data reads through the same loader ----------------------------------------------------------------
def test_segmentation_pairs_refuse_a_fifo_and_a_bomb_naming_them(tmp_path):
    from linvit.dense.seg_folder import SegmentationFolder

    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    for stem in ("a", "b"):
        Image.new("L", (8, 6)).save(masks / f"{stem}.png")
    (images / "b.png").write_bytes(_png(20_000, 20_000))
    with fifo_watch(images / "a.png") as opened:
        folder = SegmentationFolder(images, masks, num_classes=2)
        with pytest.raises(ImageInputError, match=r"a\.png' is a FIFO"):
            folder[0]
        with pytest.raises(ImageInputError, match=r"b\.png' is (too large to decode|20000 x 20000).*data\.max_pixels"):
            folder[1]
    assert opened == []

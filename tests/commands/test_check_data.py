"""`linvit check-data ROOT`: counts per class and split, unreadable files, duplicates, links, sizes and modes.

Every dataset is written to tmp_path as real image files (PNG, JPEG, BMP; RGB, RGBA, L; several sizes).
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from linvit.cli import main

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, size: tuple[int, int], mode: str, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 4), dtype=np.uint8)
    Image.fromarray(pixels, "RGBA").convert(mode).save(path)


@pytest.fixture
def clean_root(tmp_path) -> Path:
    """train: cat 3, dog 2; val: cat 1, dog 1; sizes 20x10 .. 40x30; modes RGB, RGBA, L; PNG, JPEG, BMP."""
    root = tmp_path / "pets"
    files = {
        "train/cat/a.png": ((20, 10), "RGBA"),
        "train/cat/b.jpg": ((30, 20), "L"),
        "train/cat/c.bmp": ((40, 30), "RGB"),
        "train/dog/a.jpg": ((24, 16), "RGB"),
        "train/dog/b.png": ((32, 32), "RGB"),
        "val/cat/a.jpg": ((20, 12), "RGB"),
        "val/dog/a.png": ((22, 14), "L"),
    }
    for seed, (name, (size, mode)) in enumerate(files.items()):
        _write(root / name, size, mode, seed)
    (root / "train" / "cat" / "notes.txt").write_text("not an image, ignored as in training")
    return root


def _check(root: Path, capsys) -> tuple[int, str]:
    status = main(["check-data", str(root), "--workers", "2"])
    return status, capsys.readouterr().out


def _row(output: str, name: str) -> list[str]:
    return next(line.split()[1:] for line in output.splitlines() if line.split()[:1] == [name])


def test_counts_per_class_and_split_sizes_and_modes(clean_root, capsys):
    status, output = _check(clean_root, capsys)
    assert status == 0, output
    assert _row(output, "cat") == ["3", "1"] and _row(output, "dog") == ["2", "1"]
    assert _row(output, "total") == ["5", "2"]
    train = next(line for line in output.splitlines() if line.startswith("train:"))
    assert "5 images in 2 classes" in train
    assert "width 20-40 (median 30)" in train and "height 10-32 (median 20)" in train
    assert "RGB 3" in train and "RGBA 1" in train and "L 1" in train
    assert "PNG 2" in train and "JPEG 2" in train and "BMP 1" in train
    assert output.rstrip().endswith("no problems found")


def test_unreadable_files_duplicates_and_links_are_reported(clean_root, capsys, tmp_path):
    good = (clean_root / "train" / "dog" / "a.jpg").read_bytes()
    (clean_root / "train" / "dog" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (clean_root / "train" / "cat" / "garbage.png").write_bytes(b"not a PNG")
    (clean_root / "val" / "dog" / "leak.jpg").write_bytes(good)  # a training image in val
    (clean_root / "train" / "cat" / "two_labels.png").write_bytes((clean_root / "train/dog/b.png").read_bytes())
    _write(tmp_path / "elsewhere" / "x.png", (8, 8), "RGB", 99)
    (clean_root / "train" / "dog" / "more").symlink_to(tmp_path / "elsewhere")
    status, output = _check(clean_root, capsys)
    assert status == 1, output
    unreadable = output.split("unreadable files")[1].split("\n\n")[0]
    assert "(2)" in unreadable and "train/dog/truncated.jpg" in unreadable and "train/cat/garbage.png" in unreadable
    assert re.search(r"more than one split \(1\):\n  train/dog/a\.jpg = val/dog/leak\.jpg", output), output
    assert re.search(r"more than one class \(1\):\n  train/cat/two_labels\.png = train/dog/b\.png", output), output
    assert f"train/dog/more -> {tmp_path / 'elsewhere'}" in output
    problems = output.rstrip().splitlines()[-1]
    assert problems.startswith("problems:") and "2 unreadable" in problems
    assert "1 image(s) in more than one split" in problems and "1 image(s) under more than one class" in problems


def test_a_symlink_loop_is_reported_not_followed(clean_root, capsys):
    (clean_root / "train" / "cat" / "loop").symlink_to(".")
    status, output = _check(clean_root, capsys)
    assert status == 1
    assert re.search(r"train: cannot be listed: symlink loop: .*train/cat/loop", output), output
    assert _row(output, "cat") == ["1"]  # val is still counted


def test_a_missing_class_and_an_empty_class_are_problems(clean_root, capsys):
    (clean_root / "train" / "bird").mkdir()
    (clean_root / "val" / "fish").mkdir()
    _write(clean_root / "val" / "fish" / "a.png", (9, 9), "RGB", 7)
    status, output = _check(clean_root, capsys)
    assert status == 1
    problems = output.rstrip().splitlines()[-1]
    assert "train lacks the class(es) fish" in problems and "val lacks the class(es) bird" in problems
    assert "train: empty class folder(s) bird" in problems


def test_a_root_without_splits_is_one_split_and_a_missing_root_is_an_error(clean_root, capsys):
    status, output = _check(clean_root / "train", capsys)
    assert status == 0 and _row(output, "cat") == ["3"]
    assert main(["check-data", str(clean_root / "nowhere")]) == 2
    assert "nowhere is not a folder" in capsys.readouterr().err


def test_the_readme_command_runs_as_documented(clean_root):
    readme = (REPO / "README.md").read_text()
    commands = [line.split("#")[0].strip() for line in readme.splitlines() if line.startswith("linvit check-data ")]
    assert commands, "README documents `linvit check-data`"
    for command in commands:
        argv = shlex.split(command.replace("/data/my_images", str(clean_root)))
        script = Path(sys.executable).with_name("linvit")
        result = subprocess.run([str(script), *argv[1:]], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "images per class and split" in result.stdout and "no problems found" in result.stdout


def test_the_datamodule_logs_counts_and_with_check_the_report(clean_root, caplog):
    from linvit.train.data.datamodules import ImageFolderDataModule

    options = {"root": clean_root, "num_classes": 2, "img_size": 16, "batch_size": 2, "test_fraction": 0}
    with caplog.at_level(logging.INFO, logger="linvit"):
        ImageFolderDataModule(**options).setup("fit")
    counts = [r.getMessage() for r in caplog.records if "2 classes; train 5 images" in r.getMessage()]
    assert counts and "'cat' most: 3" in counts[0] and "val 2 images" in counts[0], counts
    assert not any("images per class and split" in r.getMessage() for r in caplog.records)
    caplog.clear()
    (clean_root / "val" / "cat" / "leak.jpg").write_bytes((clean_root / "train/cat/b.jpg").read_bytes())
    with caplog.at_level(logging.INFO, logger="linvit"):
        ImageFolderDataModule(**options, check=True).setup("fit")
    assert any("images per class and split" in r.getMessage() for r in caplog.records)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("1 image(s) in more than one split" in m for m in warnings), warnings


def _imbalanced(root: Path, counts: dict[str, int]) -> None:
    for offset, (name, count) in enumerate(counts.items()):
        for index in range(count):
            _write(root / name / f"{index}.png", (4, 4), "RGB", 1000 * offset + index)  # distinct images


@pytest.mark.parametrize("counts, flagged", [({"cat": 20, "dog": 1}, True), ({"cat": 10, "dog": 1}, False)])
def test_classes_out_of_balance_are_a_problem(tmp_path, capsys, counts, flagged):
    """A 20:1 split is flagged past the default 10:1, with the ratio, the classes and what it means for training;
    10:1 is not. --max-imbalance moves the line."""
    _imbalanced(tmp_path / "pets", counts)
    status, output = _check(tmp_path / "pets", capsys)
    assert status == int(flagged), output
    problems = output.rstrip().splitlines()[-1]
    assert ("all: classes out of balance 20:1 (cat over dog)" in problems) == flagged, problems
    assert ("all: 20:1, cat 20 images, dog 1" in output) == flagged, output
    assert ("learns to favour it" in output and "sample the classes evenly" in output) == flagged
    assert main(["check-data", str(tmp_path / "pets"), "--max-imbalance", "5"]) == 1
    assert "classes out of balance 10:1" in capsys.readouterr().out or flagged
    assert main(["check-data", str(tmp_path / "pets"), "--max-imbalance", "25"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("no problems found")


def test_max_imbalance_below_one_is_refused(clean_root, capsys):
    for value in ("0.5", "nan"):
        assert main(["check-data", str(clean_root), "--max-imbalance", value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--max-imbalance must be at least 1" in err, err


def test_a_one_class_folder_is_a_problem(tmp_path, capsys):
    _imbalanced(tmp_path / "cats", {"cat": 3})
    status, output = _check(tmp_path / "cats", capsys)
    assert status == 1, output
    assert "all: one class folder (cat), training needs two or more" in output.rstrip().splitlines()[-1]
    assert "no problems found" not in output

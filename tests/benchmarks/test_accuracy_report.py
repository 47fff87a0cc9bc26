"""The accuracy benchmark (benchmarks/accuracy): a run at another seed trains with ``seed=<n>``, is recorded under its
own name, and RESULTS.md shows each run's mean over its seeds beside the first seed's table; the wallpapers set's
splits come from separate strips of each photo."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks.accuracy import run as accuracy

RUN = "folder_digits_3x40_linvit_nano"


def _row(name: str, seed: int, acc1: float) -> dict:
    return {
        "name": accuracy.seed_run_name(name, seed),
        "run": name,
        "seed": seed,
        "dataset": "folder_digits_3x40",
        "model": "linvit_nano",
        "params": 1_000_000,
        "command": "python train.py data=imagefolder",
        "test_acc1": acc1,
        "test_acc5": 1.0,
        "test_ema_acc1": None,
        "wall_s": 60.0,
        "train_s": 55.0,
        "date": "2026-12-06 20:00 UTC",
        "machine": "x86_64, 2 CPU cores",
        "plot": f"{name}.png" if not seed else None,
    }


@pytest.fixture
def here(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(accuracy, "HERE", tmp_path)
    (tmp_path / "runs").mkdir()
    return tmp_path


def test_seed_runs_are_recorded_apart_and_averaged(here):
    other = "folder_digits_3x40_resnet18"
    rows = [_row(RUN, 2, 0.90), _row(RUN, 0, 0.96), _row(other, 0, 0.92), _row(RUN, 1, 0.93)]
    for row in rows:
        (here / "runs" / f"{row['name']}.json").write_text(json.dumps(row))
    loaded = accuracy._load_rows()
    assert list(loaded) == [RUN, f"{RUN}_seed1", f"{RUN}_seed2", other]  # RUNS order, each run's seeds after it
    accuracy.write_report(loaded)
    report = (here / "RESULTS.md").read_text()
    first_table = report.split("Over seeds")[0]
    assert f"| {RUN} |" in first_table and "_seed1" not in first_table  # the first table: seed 0 only
    assert f"| {RUN} | 0,1,2 | 96.00, 93.00, 90.00 | 93.00% | 6.00 |" in report
    assert f"| {other} | 0 |" not in report  # a run of one seed has no mean to show
    assert "![folder_digits_3x40_linvit_nano_seed1]" not in report


def test_a_run_at_another_seed_trains_with_it(here, tmp_path, fake_accuracy_train):
    calls = fake_accuracy_train
    row = accuracy.run_one(RUN, tmp_path / "logs", [], seed=2)
    assert "seed=2" in calls[0] and any(arg.endswith(f"{RUN}_seed2") for arg in calls[0])
    assert (row["name"], row["run"], row["seed"], row["plot"]) == (f"{RUN}_seed2", RUN, 2, None)
    assert "seed=2" in row["command"] and row["checkpoint_rule"] == accuracy.WITHIN_ERROR  # from its config.yaml
    assert not (here / f"{RUN}.png").exists()  # seed 0's curves are not overwritten by another seed's
    row = accuracy.run_one(RUN, tmp_path / "logs", [], seed=0)
    assert not any(arg.startswith("seed=") for arg in calls[1]) and row["name"] == RUN
    assert (here / f"{RUN}.png").read_bytes() == b"png"


def test_wallpaper_crops_of_each_split_come_from_their_own_strip(tmp_path, monkeypatch):
    """Every pixel's red value is its column: a crop's reds say which strip of the photo it was cut from."""
    from PIL import Image

    from benchmarks.accuracy import folders

    width, height = 1200, 500
    columns = np.broadcast_to((np.arange(width) * 255 // (width - 1)).astype(np.uint8), (height, width))
    photo = np.stack([columns, np.zeros_like(columns), np.zeros_like(columns)], axis=-1)
    for name in folders.WALLPAPER_PHOTOS[:2]:
        (tmp_path / name).mkdir()
        Image.fromarray(photo).save(tmp_path / name / "2560x1600.png")
    monkeypatch.setattr(folders, "WALLPAPERS", str(tmp_path / "{}" / "2560x1600.png"))
    monkeypatch.setattr(folders, "WALLPAPER_PHOTOS", folders.WALLPAPER_PHOTOS[:2])
    root = folders.write_folder("wallpapers", tmp_path / "set", per_class=6, val_per_class=3, test_per_class=4)
    for index, (split, count) in enumerate((("train", 6), ("val", 3), ("test", 4))):
        lowest, highest = 255 * folders.STRIPS[index], 255 * folders.STRIPS[index + 1]
        for label in (0, 1):
            crops = sorted((root / split / f"class_{label}").glob("*.png"))
            assert len(crops) == count
            for crop in crops:
                red = np.asarray(Image.open(crop))[..., 0].astype(float)
                assert red.shape == (64, 64)
                assert lowest - 3 <= red.min() and red.max() <= highest + 3, (split, red.min(), red.max())


def test_the_wallpapers_set_names_its_package_when_missing(tmp_path, monkeypatch):
    from benchmarks.accuracy import folders

    monkeypatch.setattr(folders, "WALLPAPERS", str(tmp_path / "{}.jpg"))
    with pytest.raises(FileNotFoundError, match="plasma-workspace-wallpapers"):
        folders.write_folder("wallpapers", tmp_path / "set", per_class=2)

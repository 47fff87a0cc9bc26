"""`linvit export RUN --quantize int8`: which images calibrate the int8 file (the run's validation split, as the
deployed model sees images; its training split where the run validates on its test images)."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

from linvit.commands import _export_quantize


class _Split(list):
    """A dataset: (image, label) items, each image filled with one value that names its split."""

    def __init__(self, value: float, count: int):
        super().__init__((torch.full((1, 4, 4), value), 0) for _ in range(count))


class _DataModule:
    def __init__(self, validates_on_test: bool):
        self.train_set, self.test_set = _Split(1.0, 300), _Split(3.0, 20)
        self.val_set = self.test_set if validates_on_test else _Split(2.0, 40)

    def test_dataloader(self):
        return [(torch.stack([image for image, _ in self.test_set]), torch.zeros(len(self.test_set)))]


@pytest.mark.parametrize(
    ("validates_on_test", "split", "value", "images"), [(False, "val", 2.0, 40), (True, "train", 1.0, 256)]
)
def test_calibration_images_come_from_validation_unless_it_is_the_test_split(
    monkeypatch, capsys, validates_on_test, split, value, images
):
    calibrated = []
    monkeypatch.setattr(_export_quantize, "_run_datamodule", lambda args: _DataModule(validates_on_test))
    monkeypatch.setattr(
        "linvit.utils.quantize.quantize_static_int8",
        lambda fp32, int8, calibration, force=False: calibrated.extend(calibration),
    )
    comparison = {"images": 20, "fp32_top1": 1.0, "int8_top1": 1.0, "top1_change_points": 0.0, "top1_agreement": 1.0}
    monkeypatch.setattr("linvit.utils.quantize.compare_onnx", lambda fp32, int8, batches: comparison)

    report = _export_quantize._static_from_run(argparse.Namespace(force=False), Path("m.onnx"), Path("m.int8.onnx"))

    values = np.unique(np.concatenate([batch.ravel() for batch in calibrated]))
    assert values.tolist() == [value]  # never a test image (3.0)
    assert report["calibration"]["split"] == split and report["calibration"]["images"] == images
    assert f"calibrated on {images} {'validation' if split == 'val' else 'training'} images" in capsys.readouterr().out

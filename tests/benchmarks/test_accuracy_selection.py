"""Checkpoint-selection rules (benchmarks/accuracy/selection.py) and the per-epoch test callback that feeds them
(benchmarks/accuracy/epoch_test.py): each rule picks the epoch it promises on hand-made curves, the callback records
what the model gets right on the test split, and the runner passes the callback only when asked."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.accuracy import run as accuracy
from benchmarks.accuracy import selection
from benchmarks.accuracy.epoch_test import COLUMNS, EpochTestRecorder


def _curve(val: list[float], test: list[float], loss: list[float] | None = None, images: int = 30) -> list[dict]:
    loss = loss or [1.0] * len(val)
    return [
        {"epoch": i, "step": 10 * i, "val_acc1": v, "val_loss": lo, "val_images": images, "test_acc1": t}
        for i, (v, t, lo) in enumerate(zip(val, test, loss))
    ]


def test_highest_keeps_the_best_accuracy_and_breaks_ties_by_loss():
    curve = _curve([0.5, 0.9, 0.8, 0.9, 0.9], [0.1, 0.2, 0.3, 0.4, 0.5], loss=[1.0, 0.6, 0.5, 0.4, 0.45])
    assert selection.highest(curve) == 3  # 0.9 three times: the lowest loss among them


def test_within_one_error_takes_the_latest_validation_close_to_the_best():
    # 30 images: one standard error at 27/30 is ~1.8 images, so 26/30 after it is within it, 25/30 is not
    curve = _curve([0.7, 27 / 30, 26 / 30, 25 / 30], [0.1, 0.2, 0.3, 0.4])
    assert selection.within_one_error(curve) == 2
    # on 50,000 images the same one-image drop is past one error (~0.05 points): a later epoch must match the best
    big = _curve([0.90, 0.95, 0.946, 0.948], [0.1, 0.2, 0.3, 0.4], images=50_000)
    assert selection.within_one_error(big) == 1


def test_best_of_three_and_lowest_loss():
    curve = _curve([0.9, 0.5, 0.5, 0.8, 0.8, 0.8, 0.7], [0] * 7, loss=[0.9, 0.8, 0.3, 0.3, 0.5, 0.6, 0.7])
    assert selection.best_of_three(curve) == 5  # the one 0.9 does not outweigh three 0.8s
    assert selection.lowest_loss(curve) == 3  # a tie of losses: the later epoch


def _write_curve(path: Path, curve: list[dict]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({**row, "seconds": 1.0} for row in curve)


def test_the_table_averages_each_run_over_its_seeds_and_counts_changes(tmp_path):
    curves = {"a": _curve([0.9, 0.8], [0.80, 0.90]), "a_seed1": _curve([0.8, 0.9], [0.70, 0.60])}
    for name, curve in curves.items():
        _write_curve(tmp_path / f"{name}.epochs.csv", curve)
        row = {"name": name, "run": "folder_x_m", "epoch_curve": f"{name}.epochs.csv"}
        (tmp_path / f"{name}.json").write_text(json.dumps(row))
    (tmp_path / "old.json").write_text(json.dumps({"name": "old", "run": "folder_x_m"}))  # no curve: left out
    lines = selection.table(selection.load_curves(tmp_path))
    header = [cell.strip() for cell in lines[0].split("|")[1:-1]]
    run_row = [cell.strip() for cell in lines[2].split("|")[1:-1]]
    values = dict(zip(header, run_row))
    assert values["run (seeds)"] == "x_m (2)"
    assert values["highest"] == "70.00"  # seed 0: epoch 0 (80%); seed 1: epoch 1 (60%)
    assert values["last"] == "75.00" and values["oracle"] == "80.00"
    assert header[-1] == "oracle" and "last, EMA" not in header  # no EMA columns in these curves
    mean = dict(zip(header, [cell.strip() for cell in lines[-2].split("|")[1:-1]]))
    assert mean["last"] == "75.00 (2)"
    changes = dict(zip(header, [cell.strip() for cell in lines[-1].split("|")[1:-1]]))
    assert changes["last"] == "1 / 0"  # seed 0 gains 10 points, seed 1 ends on the epoch highest chose


def test_the_ema_rules_read_the_ema_weights_columns():
    curve = _curve([0.9, 0.8, 0.7], [0.5, 0.6, 0.7])
    assert "highest, EMA" not in selection.chosen_test(curve)
    for row, ema_val, ema_test in zip(curve, [0.6, 0.9, 0.8], [0.95, 0.85, 0.75]):
        row.update(val_ema_acc1=ema_val, val_ema_loss=1.0, test_ema_acc1=ema_test)
    chosen = selection.chosen_test(curve)
    assert chosen["highest"] == (0, 50.0)  # the raw weights' best validation
    assert chosen["highest, EMA"] == (1, 85.0)  # the EMA weights' best validation, their test
    assert chosen["last, EMA"] == (2, 75.0)


def _fake_trainer(test_images: torch.Tensor, test_targets: torch.Tensor, sanity: bool = False):
    loader = [(test_images[:3], test_targets[:3]), (test_images[3:], test_targets[3:])]
    datamodule = SimpleNamespace(val_set=[0] * 7, test_dataloader=lambda: loader)
    metrics = {"val/acc1": torch.tensor(0.5), "val/loss": torch.tensor(0.7)}
    return SimpleNamespace(
        sanity_checking=sanity, datamodule=datamodule, callback_metrics=metrics, current_epoch=4, global_step=40
    )


class _PicksFirstChannel(torch.nn.Module):
    """Predicts class 0 where the first pixel is positive, 1 elsewhere; records the mode it was called in."""

    def __init__(self):
        super().__init__()
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        positive = x[:, 0] > 0
        return torch.stack([positive.float(), (~positive).float()], dim=-1)


def test_the_callback_records_each_validations_test_accuracy(tmp_path):
    images = torch.tensor([[1.0], [1.0], [-1.0], [-1.0], [1.0]])
    targets = torch.tensor([0, 1, 1, 1, 0])  # the model gets 4 of 5 right
    model, ema = _PicksFirstChannel(), _PicksFirstChannel()
    module = SimpleNamespace(model=model, model_ema=SimpleNamespace(module=ema), device=torch.device("cpu"))
    callback = EpochTestRecorder(tmp_path / "curve.csv")
    callback.on_validation_end(_fake_trainer(images, targets, sanity=True), module)
    assert not (tmp_path / "curve.csv").exists()  # the sanity check is no epoch
    callback.on_validation_end(_fake_trainer(images, targets), module)
    callback.on_validation_end(_fake_trainer(images, targets), module)
    rows = selection.read_curve(tmp_path / "curve.csv")
    assert len(rows) == 2
    assert rows[0]["test_acc1"] == pytest.approx(0.8) and rows[0]["test_ema_acc1"] == pytest.approx(0.8)
    assert rows[0]["val_ema_acc1"] is None  # not among the validation's metrics
    assert (rows[0]["epoch"], rows[0]["step"], rows[0]["val_images"]) == (4, 40, 7)
    assert rows[0]["val_acc1"] == pytest.approx(0.5) and rows[0]["val_loss"] == pytest.approx(0.7)
    assert model.modes == [False] * 4 and model.training  # evaluated in eval mode, left in training mode


def test_the_runner_adds_the_callback_only_when_asked(tmp_path, monkeypatch, fake_accuracy_train):
    monkeypatch.setattr(accuracy, "HERE", tmp_path)
    calls = fake_accuracy_train
    plain = accuracy.run_one("folder_digits_3x40_linvit_nano", tmp_path / "logs", [])
    assert "epoch_curve" not in plain and not any("epoch_test" in arg for arg in calls[0])
    row = accuracy.run_one("folder_digits_3x40_linvit_nano", tmp_path / "logs", [], every_epoch=True)
    assert row["epoch_curve"] == "folder_digits_3x40_linvit_nano.epochs.csv"
    assert [point["test_acc1"] for point in selection.read_curve(tmp_path / "runs" / row["epoch_curve"])] == [0.4]
    assert row["wall_s"] < plain["wall_s"] + 1 and row["wall_s"] < 0  # the 2.5 s of test passes taken off
    assert "epoch_test" not in row["command"]  # the recorded command trains the same without it

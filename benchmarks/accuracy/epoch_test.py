"""Test accuracy after every validation, for comparing checkpoint-selection rules on the same runs.

``best.ckpt`` is one epoch chosen by validation accuracy; on a validation split of 30-200 images that choice moves a
folder run's test top-1 by up to 6 points (NOTES.md). To compare rules for the choice (best validation accuracy,
last epoch, a tolerance of one standard error, ...) without a run per rule, this callback tests the weights of every
validated epoch and writes one CSV row per validation: epoch, step, the validation metrics the rules read, and the
test top-1 of the raw and EMA weights. Benchmark use only: a training run must not look at its test split.

    python train.py data=imagefolder data.root=DIR \\
        +callbacks.epoch_test._target_=benchmarks.accuracy.epoch_test.EpochTestRecorder \\
        '+callbacks.epoch_test.path=${paths.output_dir}/epoch_test.csv'

(``python -m benchmarks.accuracy.run --test-every-epoch`` adds these.)
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

COLUMNS = (
    "epoch",
    "step",
    "val_acc1",
    "val_loss",
    "val_ema_acc1",
    "val_ema_loss",
    "val_images",
    "test_acc1",
    "test_ema_acc1",
    "seconds",
)


class EpochTestRecorder(Callback):
    """Append ``COLUMNS`` to ``path`` after every validation (not the sanity check)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # the test split, read once

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.datamodule is None:
            return
        started = time.perf_counter()
        metrics = trainer.callback_metrics
        ema = getattr(pl_module, "model_ema", None)
        if self.batches is None:  # the evaluation transform has no randomness: the same tensors every epoch
            self.batches = [(images, targets) for images, targets in trainer.datamodule.test_dataloader()]
        row = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "val_acc1": float(metrics["val/acc1"]),
            "val_loss": float(metrics["val/loss"]),
            "val_ema_acc1": float(metrics["val_ema/acc1"]) if "val_ema/acc1" in metrics else "",
            "val_ema_loss": float(metrics["val_ema/loss"]) if "val_ema/loss" in metrics else "",
            "val_images": len(trainer.datamodule.val_set),
            "test_acc1": _top1(pl_module.model, self.batches, pl_module.device),
            "test_ema_acc1": "" if ema is None else _top1(ema.module, self.batches, pl_module.device),
        }
        row["seconds"] = round(time.perf_counter() - started, 3)
        new = not self.path.exists()
        with self.path.open("a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)


def _top1(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device) -> float:
    """Top-1 accuracy of ``model`` over ``batches``, in eval mode; the model's mode is restored."""
    was_training = model.training
    model.eval()
    right = total = 0
    try:
        with torch.inference_mode():
            for images, targets in batches:
                logits = model(images.to(device))
                right += int((logits.argmax(-1).cpu() == targets).sum())
                total += len(targets)
    finally:
        model.train(was_training)
    return right / max(1, total)

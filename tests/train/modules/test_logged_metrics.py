"""metrics.csv survives a resume (ResumableCSVLogger) and is cut back to the checkpoint's rows (ResumeLoggedMetrics).

The whole-run comparisons (epoch means, final metrics, metrics.csv after SIGTERM/SIGKILL at every moment) are in
tests/train/runs/test_train_resume.py and tests/reliability/test_resume_sweep.py.
"""

from __future__ import annotations

import csv

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset

from linvit.train.modules.logged_metrics import ResumableCSVLogger, ResumeLoggedMetrics


def _rows(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _write_csv(path, steps):
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["loss", "step"])
        writer.writeheader()
        writer.writerows({"loss": 0.5, "step": step} for step in steps)


def test_lightning_csv_logger_deletes_the_file_a_resumed_run_finds(tmp_path):
    """The control: the reason for ResumableCSVLogger."""
    _write_csv(tmp_path / "metrics.csv", [0, 1])
    CSVLogger(tmp_path, name="", version="").experiment
    assert not (tmp_path / "metrics.csv").exists()


def test_resumable_csv_logger_appends_and_cuts_back(tmp_path):
    _write_csv(tmp_path / "metrics.csv", [0, 1, 2])
    logger = ResumableCSVLogger(tmp_path, name="", version="")
    logger.experiment
    assert logger.rows_written == 3 and len(_rows(tmp_path / "metrics.csv")) == 3
    logger.keep_rows(2)  # the checkpoint was written after two rows; the third came later
    logger.log_metrics({"loss": 0.25}, step=2)
    logger.log_metrics({"loss": 0.125, "acc": 1.0}, step=3)  # a new column rewrites the header, rows kept
    logger.save()
    rows = _rows(tmp_path / "metrics.csv")
    assert [row["step"] for row in rows] == ["0", "1", "2", "3"]
    assert [row["loss"] for row in rows] == ["0.5", "0.5", "0.25", "0.125"] and rows[3]["acc"] == "1.0"
    assert logger.rows_written == 4


class _Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(run_dir, max_epochs, ckpt_path=None):
    data = TensorDataset(torch.randn(8, 2, generator=torch.Generator().manual_seed(0)), torch.zeros(8, 1))
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        log_every_n_steps=1,
        default_root_dir=run_dir,
        logger=ResumableCSVLogger(run_dir, name="", version=""),
        callbacks=[ResumeLoggedMetrics()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(_Regression(), DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
    return trainer


def test_a_resumed_fit_continues_metrics_csv_and_a_fresh_one_starts_it_anew(tmp_path):
    first = _fit(tmp_path, max_epochs=1)
    first.save_checkpoint(tmp_path / "epoch1.ckpt")
    rows_after_first = _rows(tmp_path / "metrics.csv")
    assert len(rows_after_first) == 3  # two steps and the epoch mean
    _fit(tmp_path, max_epochs=2, ckpt_path=tmp_path / "epoch1.ckpt")
    rows = _rows(tmp_path / "metrics.csv")
    assert rows[:3] == rows_after_first and len(rows) == 6
    assert [row["step"] for row in rows] == ["0", "1", "1", "2", "3", "3"]
    # a run from scratch in the same directory (resume=false): the old rows are not its history
    _fit(tmp_path, max_epochs=1)
    assert _rows(tmp_path / "metrics.csv") == rows_after_first

"""What a run has logged survives a resume: the rows of ``metrics.csv``, the running epoch means, the last values.

Lightning checkpoints the weights, the optimizer and the loops, but not what was logged: a run resumed in the
middle of an epoch logs an epoch mean (``train/loss_epoch``) of the batches after the resume only, a run resumed
after its last epoch reports no metrics at all, and ``CSVLogger`` deletes the ``metrics.csv`` it finds. Here:

- :class:`ResumableCSVLogger` appends to an existing ``metrics.csv`` instead of deleting it;
- :class:`ResumeLoggedMetrics` stores in every checkpoint how many rows that file had (flushed first), the
  running sums of the training metrics logged with ``on_epoch=True`` and the trainer's ``callback_metrics``; a run
  resumed from the checkpoint cuts ``metrics.csv`` back to those rows (rows a killed run wrote after its last
  checkpoint are logged again) and continues the sums, so its logs equal those of a run never interrupted.

The restore reaches into Lightning's logger connector (``_ResultCollection``, its ``_Metadata``), which has no
public API for it; it is checked against Lightning 2.6 by ``tests/reliability/test_resume_sweep.py``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from linvit.train.modules.fault_tolerance import atomic_write

__all__ = ["ResumableCSVLogger", "ResumeLoggedMetrics"]

_log = logging.getLogger(__name__)

_REDUCTIONS = {"mean": torch.mean, "sum": torch.sum, "max": torch.max, "min": torch.min}


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer that keeps an existing ``metrics.csv`` (its header and rows) and counts the rows."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self.rows_written = 0
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                reader = csv.DictReader(file)
                self.rows_written = sum(1 for _ in reader)
                self.metrics_keys = list(reader.fieldnames or [])

    def _check_log_dir_exists(self) -> None:
        """Lightning deletes ``metrics.csv`` here; a resumed run appends to it instead."""

    def save(self) -> None:
        pending = len(self.metrics)
        super().save()
        self.rows_written += pending

    def keep_rows(self, count: int) -> None:
        """Cut ``metrics.csv`` back to its header and first ``count`` rows (rows logged after a checkpoint)."""
        if count >= self.rows_written or not self._fs.isfile(self.metrics_file_path):
            return
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            reader = csv.DictReader(file)
            fieldnames, rows = list(reader.fieldnames or []), [row for _, row in zip(range(count), reader)]
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(self.metrics_file_path, lambda file: file.write(text.getvalue().encode()), "metrics")
        self.rows_written = len(rows)


class ResumableCSVLogger(CSVLogger):
    """``CSVLogger`` whose ``metrics.csv`` survives a resume: rows are appended to the file a run finds.

    With :class:`ResumeLoggedMetrics` among the callbacks, a resumed run first cuts the file back to the rows it had
    when the checkpoint was written. Only local paths are supported for the cut (remote files are left as they are).
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> _AppendingWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment

    @property
    def rows_written(self) -> int:
        """Rows in ``metrics.csv`` so far (0 on processes other than rank 0, which write nothing)."""
        return self._experiment.rows_written if isinstance(self._experiment, _AppendingWriter) else 0

    def keep_rows(self, count: int) -> None:
        if isinstance(self._experiment, _AppendingWriter) and "://" not in str(self.log_dir):
            self._experiment.keep_rows(count)


class ResumeLoggedMetrics(Callback):
    """Checkpoint what the run has logged, and give it back to a run resumed from the checkpoint.

    See the module docstring. Costs a flush of ``metrics.csv`` at every checkpoint.
    """

    def __init__(self) -> None:
        self._loaded: dict[str, Any] | None = None

    # -- saving -------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            return {}
        csv_loggers = _csv_loggers(trainer)
        for logger in csv_loggers:
            logger.save()  # rows logged so far are on disk before the checkpoint that counts them
        return {
            "csv_rows": [logger.rows_written for logger in csv_loggers],
            "epoch_results": _running_epoch_results(trainer),
            "callback_metrics": {
                key: value.detach().cpu().clone()
                for key, value in trainer._logger_connector._callback_metrics.items()
                if isinstance(value, torch.Tensor)
            },
        }

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer  # state_dict() takes no trainer

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = None

    # -- resuming -----------------------------------------------------------------------------------------------
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict) if state_dict else None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # after Lightning's reset of the trainer's metrics, before the loops run
        if trainer.ckpt_path is None:
            # a run that starts from scratch: rows of a killed run that left no checkpoint are not its history
            for logger in _csv_loggers(trainer):
                logger.keep_rows(0)
        if self._loaded is None:
            return
        for logger, rows in zip(_csv_loggers(trainer), self._loaded.get("csv_rows", [])):
            logger.keep_rows(int(rows))
        trainer._logger_connector._callback_metrics.update(self._loaded.get("callback_metrics", {}))

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loaded, self._loaded = self._loaded, None
        if not loaded:
            return
        # again: the sanity check, which runs after on_fit_start on a resume from the end of an epoch (a SIGTERM
        # there), resets the trainer's metrics, and later checkpoints record them (train/loss_epoch of that epoch)
        trainer._logger_connector._callback_metrics.update(loaded.get("callback_metrics", {}))
        # the loops are restored now: a run resumed inside an epoch continues that epoch's sums
        if loaded.get("epoch_results"):
            _restore_epoch_results(trainer, loaded["epoch_results"])


def _csv_loggers(trainer: Trainer) -> list[ResumableCSVLogger]:
    return [logger for logger in trainer.loggers if isinstance(logger, ResumableCSVLogger)]


def _running_epoch_results(trainer: Trainer) -> list[dict[str, Any]]:
    """The training metrics logged with ``on_epoch=True`` so far this epoch: their metadata and running sums."""
    saved = []
    for key, result in trainer.fit_loop.epoch_loop._results.items():
        meta = getattr(result, "meta", None)
        if not getattr(result, "is_tensor", False) or meta is None or not meta.on_epoch or result.has_reset:
            continue  # torchmetrics objects keep their own state; reset entries hold nothing yet
        reduction = next((name for name, fn in _REDUCTIONS.items() if meta.reduce_fx is fn), None)
        if reduction is None or meta.sync.group is not None:
            continue
        fields = {
            field.name: getattr(meta, field.name)
            for field in dataclasses.fields(meta)
            if field.name not in ("reduce_fx", "_sync")
        }
        entry = {
            "key": key,
            "meta": fields,
            "reduction": reduction,
            "sync": {"should": meta.sync.should, "rank_zero_only": meta.sync.rank_zero_only},
            "value": result.value.detach().cpu().clone(),
        }
        if meta.is_mean_reduction:
            entry["cumulated_batch_size"] = result.cumulated_batch_size.detach().cpu().clone()
        saved.append(entry)
    return saved


def _restore_epoch_results(trainer: Trainer, saved: list[dict[str, Any]]) -> None:
    from lightning.pytorch.trainer.connectors.logger_connector.result import _Metadata, _ResultMetric, _Sync

    results = trainer.fit_loop.epoch_loop._results
    device = trainer.strategy.root_device
    for entry in saved:
        meta = _Metadata(**entry["meta"], reduce_fx=_REDUCTIONS[entry["reduction"]])
        # the same arguments as LightningModule.log, so that the next self.log of this key finds equal metadata
        meta.sync = _Sync(
            fn=trainer.strategy.reduce, _should=entry["sync"]["should"], rank_zero_only=entry["sync"]["rank_zero_only"]
        )
        result = _ResultMetric(meta, is_tensor=True)
        result.value = entry["value"].to(device)
        if "cumulated_batch_size" in entry:
            result.cumulated_batch_size = entry["cumulated_batch_size"].to(device)
        result._update_count = 1  # torchmetrics: updated (compute() would warn otherwise)
        result.has_reset = False
        results[entry["key"]] = result
    # Lightning clears the training results at the first logged batch of an epoch; this is not the first batch
    trainer._logger_connector._first_loop_iter = False
    _log.debug("restored the running epoch sums of %s", [entry["key"] for entry in saved])

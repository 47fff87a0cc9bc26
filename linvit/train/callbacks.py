"""Training callbacks: reproducible per-step randomness, learning-curve plot, atomic checkpoints, SIGTERM save.

Each idea is one callback, configured in ``configs/callbacks/``; reliability features (non-finite loss handling,
preemption) fit in beside them.
"""

from __future__ import annotations

import logging
import os
import random
import signal
from pathlib import Path
from typing import Any
from weakref import proxy

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

_log = logging.getLogger(__name__)


class StepReseed(Callback):
    """Reseed torch, numpy and random before every training step from ``(seed, global_step, rank)``.

    The randomness of a step (drop path, dropout, mixup) then depends on nothing the process did before it, so a run
    resumed from any checkpoint, at an epoch boundary or in the middle of an epoch, continues exactly as the
    uninterrupted run. (The data side: :class:`linvit.train.datasets.SeededSamples` seeds each sample's augmentation
    from its key, and the sampler skips the samples a resumed run already trained on.)
    """

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        value = (self.seed * 1_000_003 + trainer.global_step * 1_009 + trainer.global_rank) % (2**31)
        random.seed(value)
        np.random.seed(value)
        torch.manual_seed(value)


class LearningCurves(Callback):
    """Record epoch metrics and draw them (loss, accuracy, learning rate) into a PNG in the run directory.

    The history is part of the checkpoint, so a resumed run draws the whole curve.
    """

    LOSS_KEYS = ("train/loss_epoch", "val/loss", "val_ema/loss")
    ACCURACY_KEYS = ("val/acc1", "val_ema/acc1", "val/acc5")

    def __init__(self, filename: str | os.PathLike = "learning_curves.png"):
        self.filename = Path(filename)
        self.history: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        row = {"epoch": float(trainer.current_epoch), "step": float(trainer.global_step)}
        for key, value in trainer.callback_metrics.items():
            if key in self.LOSS_KEYS + self.ACCURACY_KEYS or key == "lr":
                row[key] = float(value)
        if trainer.optimizers:
            row["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        self.history.append(row)
        if trainer.is_global_zero:
            self.plot()

    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))

    def plot(self) -> Path | None:
        """Write the PNG; returns its path (None without history)."""
        if not self.history:
            return None
        import matplotlib

        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure  # no pyplot: no global state, no display needed

        figure = Figure(figsize=(12, 3.6), layout="constrained")
        axes = figure.subplots(1, 3)
        epochs = [row["epoch"] + 1 for row in self.history]
        for ax, keys, title in (
            (axes[0], self.LOSS_KEYS, "loss"),
            (axes[1], self.ACCURACY_KEYS, "accuracy"),
            (axes[2], ("lr",), "learning rate (end of epoch)"),
        ):
            for key in keys:
                points = [(e, row[key]) for e, row in zip(epochs, self.history) if key in row]
                if points:
                    ax.plot(*zip(*points), marker="o", markersize=3, label=key.replace("_epoch", ""))
            ax.set_title(title)
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        self.filename.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.filename.with_name(self.filename.name + ".tmp.png")
        figure.savefig(temporary, dpi=110)
        os.replace(temporary, self.filename)
        return self.filename


class AtomicModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose files are written to a temporary name and renamed into place.

    A crash or kill while saving leaves the previous ``last.ckpt``/``best.ckpt`` intact instead of a torn file.
    ``last.ckpt`` is written after every validation, also when the monitored metric did not improve (Lightning
    >= 2.5 writes it only together with a top-k checkpoint), so that a resume never goes back further than one
    validation interval.
    """

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def _save_last_if_missed(self, trainer: Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        from fsspec.implementations.local import LocalFileSystem

        if not isinstance(self._fs, LocalFileSystem):
            super()._save_checkpoint(trainer, filepath)
            return
        temporary = f"{filepath}.tmp"
        trainer.save_checkpoint(temporary, self.save_weights_only)  # ends with a barrier across ranks
        if trainer.is_global_zero:
            os.replace(temporary, filepath)
        trainer.strategy.barrier("atomic_model_checkpoint")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))


class SaveOnSigterm(Callback):
    """On SIGTERM (cluster preemption, ``kill``), save ``last.ckpt`` after the current step and stop cleanly.

    The run can then be resumed with the same command (auto-resume) or ``ckpt_path=.../last.ckpt``.
    """

    def __init__(self, dirpath: str | os.PathLike, filename: str = "last.ckpt"):
        self.path = Path(dirpath) / filename
        self._requested = False
        self._saved_step = -1
        self._previous_handler: Any = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or not _is_main_thread():
            return
        self._previous_handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._on_signal)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self._previous_handler is not None and _is_main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._requested = True

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if not self._requested:
            return
        self._requested = False
        self._save(trainer)
        trainer.should_stop = True

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        # A SIGTERM during validation: Lightning leaves the evaluation loop with SIGTERMException before any
        # on_train_batch_end, so save here, unless a checkpoint of this step is already on disk.
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit":
            return
        self._requested = False
        saved = [getattr(callback, "_last_global_step_saved", -1) for callback in trainer.checkpoint_callbacks]
        if trainer.global_step > max(saved + [self._saved_step]):
            self._save(trainer)

    def _save(self, trainer: Trainer) -> None:
        _log.warning("SIGTERM received: saving %s and stopping", self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        trainer.save_checkpoint(temporary)
        if trainer.is_global_zero:
            os.replace(temporary, self.path)
        self._saved_step = trainer.global_step


def _is_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()

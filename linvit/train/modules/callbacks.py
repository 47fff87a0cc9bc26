"""Training callbacks: reproducible per-step randomness, learning-curve plot, atomic checkpoints, SIGTERM save.

Each idea is one callback, configured in ``configs/callbacks/``; reliability features (non-finite loss handling,
preemption) fit in beside them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from weakref import proxy

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from linvit.io.destination import TEMPORARY_SUFFIX, DestinationError, move_into_place, prepare_folder, write_file
from linvit.train.data.worker_signals import workers_block_sigterm
from linvit.train.modules.fault_tolerance import CHECKPOINT_KIND

_log = logging.getLogger(__name__)


class StepReseed(Callback):
    """Reseed torch, numpy and random before every training step from ``(seed, global_step, rank)``.

    The randomness of a step (drop path, dropout, mixup) then depends on nothing the process did before it, so a run
    resumed from any checkpoint, at an epoch boundary or in the middle of an epoch, continues exactly as the
    uninterrupted run. (The data side: :class:`linvit.train.data.datasets.SeededSamples` seeds each sample's
    augmentation from its key, and the sampler skips the samples a resumed run already trained on.)
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
        prepare_folder(self.filename.parent)
        # the run's own plot (force: an older linvit wrote it without a record)
        write_file(self.filename, lambda tmp: figure.savefig(tmp, dpi=110, format="png"), "plot", force=True)
        return self.filename


class AtomicModelCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose files are written to a temporary name and renamed into place.

    A crash or kill while saving leaves the previous ``last.ckpt``/``best.ckpt`` intact instead of a torn file.
    ``last.ckpt`` is written after every validation, also when the monitored metric did not improve (Lightning
    >= 2.5 writes it only together with a top-k checkpoint), so that a resume never goes back further than one
    validation interval.

    ``tie_break`` (e.g. ``val/loss``, lower wins; ``tie_break_mode="max"``: higher wins) decides between a validation
    whose monitored value equals the best one's and that best: a small validation set reaches 100% top-1 early, and
    a strict "better than" would keep the first epoch that got there, long before the run ended (a 3-class folder
    with 20 validation images per class kept epoch 16 of 100). The best one's value travels in the checkpoint, so a
    resumed run decides as the uninterrupted one. Only with ``save_top_k=1`` (the config's): with more checkpoints
    kept, ties are Lightning's as before.

    ``within_error`` (a monitored accuracy in [0, 1], ``mode="max"``, ``save_top_k=1``): a validation replaces the
    best checkpoint when its accuracy is within one binomial standard error of the best seen so far (over the
    validation images, :func:`accuracy_standard_error`), not only when it is higher. On 30-200 validation images one
    image is 0.5-3 points, and the strict rule kept an early epoch that happened to get one more image right (epoch
    25 of 91: 86.7% test top-1, the last epoch 91.6%); on 50,000 images the margin is ~0.1 points. It replaces
    ``tie_break`` (a tie is within the error: the later epoch wins).
    """

    def __init__(
        self,
        *args: Any,
        tie_break: str | None = None,
        tie_break_mode: str = "min",
        within_error: bool = False,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        if tie_break_mode not in ("min", "max"):
            raise ValueError(f"tie_break_mode must be 'min' or 'max', not {tie_break_mode!r}")
        if within_error and self.mode != "max":
            _log.warning(
                "within_error is for an accuracy (mode=max); with mode=%s the best value alone wins", self.mode
            )
            within_error = False
        self.tie_break, self.tie_break_mode = tie_break, tie_break_mode
        self.best_tie_break: float | None = None  # the tie_break value of the best checkpoint
        self.within_error = bool(within_error)
        self.best_seen: float | None = None  # within_error: the highest monitored value so far
        self._warned_no_images = False

    def check_monitor_top_k(self, trainer: Trainer, current: torch.Tensor | None = None) -> bool:
        if self.within_error and self.save_top_k == 1 and current is not None:
            return self._within_error_of_best(trainer, float(current))
        better = super().check_monitor_top_k(trainer, current)
        if not self.tie_break or self.save_top_k != 1 or current is None:
            return better
        tie = trainer.callback_metrics.get(self.tie_break)
        tie = float(tie) if tie is not None else None
        if not better and tie is not None and self.best_tie_break is not None and self.best_k_models:
            ties = float(current) == float(self.best_k_models[self.kth_best_model_path])
            wins = tie < self.best_tie_break if self.tie_break_mode == "min" else tie > self.best_tie_break
            better = trainer.strategy.reduce_boolean_decision(ties and wins)  # every rank takes this branch alike
        if better:
            self.best_tie_break = tie
        return better

    def _within_error_of_best(self, trainer: Trainer, value: float) -> bool:
        if math.isnan(value):
            return False
        self.best_seen = value if self.best_seen is None else max(self.best_seen, value)
        images = _validation_images(trainer)
        if images is None and not self._warned_no_images:
            _log.warning("within_error: the validation split's size is unknown; only a tie replaces the best")
            self._warned_no_images = True
        margin = accuracy_standard_error(self.best_seen, images) if images and 0 <= value <= 1 else 0.0
        better = not self.best_k_models or value >= self.best_seen - margin
        return trainer.strategy.reduce_boolean_decision(better)  # every rank takes this branch alike

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_tie_break": self.best_tie_break, "best_seen": self.best_seen}

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_missed(trainer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self.dirpath == state_dict.get("dirpath", self.dirpath):
            # Lightning leaves it out: a resumed run would save None until its next new best
            self.current_score = state_dict.get("current_score", self.current_score)
            self.best_tie_break = state_dict.get("best_tie_break", self.best_tie_break)
            self.best_seen = state_dict.get("best_seen", self.best_seen)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # A run resumed from its own last.ckpt: that file holds the state at this step already
        resumed, last = trainer.ckpt_path, self.last_model_path
        same = bool(resumed and last and os.path.isfile(resumed) and os.path.isfile(last))
        self._resumed_last_step = trainer.global_step if same and os.path.samefile(resumed, last) else None

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning writes last.ckpt at the end of training when this process has not written it yet. After a resume
        # that trained no further step (only the end of the last epoch was left) it would replace the file of the
        # uninterrupted run (saved by the last validation) with a later copy of the same weights.
        if getattr(self, "_resumed_last_step", None) == trainer.global_step:
            return
        super().on_train_end(trainer, pl_module)

    def _save_last_if_missed(self, trainer: Trainer) -> None:
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    def _save_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        from fsspec.implementations.local import LocalFileSystem

        if not isinstance(self._fs, LocalFileSystem):
            super()._save_checkpoint(trainer, filepath)
            return
        # a name of this writer's own: two processes saving into one directory never share a temporary file
        temporary = trainer.strategy.broadcast(str(unique_temporary(filepath)))
        with _naming(filepath, temporary):
            trainer.save_checkpoint(temporary, self.save_weights_only)  # ends with a barrier across ranks
        if trainer.is_global_zero:
            move_into_place(temporary, filepath, CHECKPOINT_KIND, force=True)  # the run's own file: recorded
        trainer.strategy.barrier("atomic_model_checkpoint")
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))


def accuracy_standard_error(accuracy: float, images: int) -> float:
    """The binomial standard error of an accuracy measured on ``images`` images, Laplace-smoothed: a perfect score
    on 30 images is (30 + 1) / (30 + 2), not a certainty with no error."""
    p = (accuracy * images + 1) / (images + 2)
    return math.sqrt(p * (1 - p) / images)


def _validation_images(trainer: Trainer) -> int | None:
    """How many images a validation scores (the datamodule's validation split), or None where it has none."""
    try:
        return len(trainer.datamodule.val_set) or None
    except (AttributeError, TypeError):
        return None


class SaveOnSigterm(Callback):
    """On SIGTERM (cluster preemption, ``kill``, ``timeout``), save ``last.ckpt`` and exit with status 0.

    Lightning notices SIGTERM and stops at its next safe point by raising ``SIGTERMException``: after the training
    batch in flight (its optimizer step, EMA update and logging done), after the validation batch in flight, or after
    the epoch's end. This callback saves there (``on_exception``), so the checkpoint is the state of the uninterrupted
    run at that point and the same command (auto-resume) or ``ckpt_path=.../last.ckpt`` continues it exactly:

    - after a training batch: mid-epoch, the DataModule records how far into the epoch it was;
    - during validation: the checkpoint rewinds that validation to its start (the batches already evaluated are
      not saved), so the resumed run evaluates it whole and ``best.ckpt``, the logs and the curves see it once.

    Nothing is changed while the run goes on (no ``should_stop``, which makes Lightning run an extra validation that
    may write ``best.ckpt`` at an odd step). A SIGTERM sent to the whole process group (``timeout``, SLURM, most
    schedulers) also reaches the data-loader workers: while a fit runs, processes forked from it (the workers) start
    with SIGTERM blocked, so that only the main process acts on it and shuts the workers down as usual.
    """

    def __init__(self, dirpath: str | os.PathLike, filename: str = "last.ckpt"):
        self.path = Path(dirpath) / filename
        self._rewinding = False  # the save in progress rewinds an interrupted validation
        self._resumed_rewound = False  # this run resumed from such a checkpoint
        self._blocking = False  # workers forked now block SIGTERM

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and not self._blocking:
            workers_block_sigterm(True)
            self._blocking = True

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_blocking()

    def _stop_blocking(self) -> None:
        if self._blocking:
            workers_block_sigterm(False)
            self._blocking = False

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        self._stop_blocking()  # Lightning calls no teardown hook after an exception
        if not isinstance(exception, SIGTERMException) or trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        if not trainer.validating and trainer.fit_loop.done and _saved_at_this_step(trainer):
            # after the last epoch, whose validation saved last.ckpt: a resume from that file does the epoch's end
            # again and lands exactly here, so that last.ckpt stays the one an uninterrupted run keeps
            _log.warning("SIGTERM received after the last training step: stopping (checkpoints are up to date)")
            return
        _log.warning("SIGTERM received: saving %s and stopping", self.path)
        self._rewinding = trainer.validating
        try:
            _save_atomically(trainer, self.path)
        finally:
            self._rewinding = False

    def state_dict(self) -> dict[str, Any]:
        return {"rewound_validation": self._rewinding}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resumed_rewound = bool(state_dict.get("rewound_validation", False))

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._rewinding:
            _rewind_validation(checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"])

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._resumed_rewound:
            # Lightning has read the "validation started" mark (restart stage) and runs the validation again from
            # its first batch: take the mark's extra batch back out of the totals so that later checkpoints add up
            total = trainer.fit_loop.epoch_loop.val_loop.batch_progress.total
            total.ready -= 1
            total.started -= 1
            self._resumed_rewound = False


def _saved_at_this_step(trainer: Trainer) -> bool:
    return any(getattr(c, "_last_global_step_saved", -1) == trainer.global_step for c in trainer.checkpoint_callbacks)


def _rewind_validation(progress: dict[str, Any]) -> None:
    """Rewrite a checkpoint's validation progress to "validation started, first batch in flight".

    That is Lightning's mid-evaluation restart state: the resumed run goes back and runs the validation, from its
    first batch (the current counts start again from those that completed: none), before training on.
    """
    current, total = progress["current"], progress["total"]
    earlier = {key: total[key] - current[key] for key in total}  # batches of earlier validations in this epoch
    progress["current"] = {"ready": 1, "started": 1, "processed": 0, "completed": 0}
    progress["total"] = {
        "ready": earlier["ready"] + 1,
        "started": earlier["started"] + 1,
        "processed": earlier["processed"],
        "completed": earlier["completed"],
    }
    progress["is_last_batch"] = False


def _save_atomically(trainer: Trainer, path: Path) -> None:
    """``trainer.save_checkpoint`` to a temporary name of this process beside ``path``, then rename onto ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = trainer.strategy.broadcast(str(unique_temporary(path)))  # every rank names the same file
    with _naming(path, temporary):
        trainer.save_checkpoint(temporary, weights_only=False)  # a full checkpoint, to resume from
    if trainer.is_global_zero:
        move_into_place(temporary, path, CHECKPOINT_KIND, force=True)
    trainer.strategy.barrier("save_atomically")


@contextlib.contextmanager
def _naming(path: str | os.PathLike, temporary: str | os.PathLike) -> Iterator[None]:
    """A :class:`DestinationError` (a full disk) while writing ``temporary`` names ``path``, the file the user knows."""
    try:
        yield
    except DestinationError as error:
        raise DestinationError(str(error).replace(str(temporary), str(path))) from None


def unique_temporary(path: str | os.PathLike) -> Path:
    """A temporary file name beside ``path`` that no other writer uses: ``.<name>.<pid>-<random>.linvit-tmp``.

    Hidden and ending in :data:`linvit.io.destination.TEMPORARY_SUFFIX`, so that
    :func:`linvit.io.destination.remove_own_temporaries` removes it when a kill left it behind (and nobody else's).
    """
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{TEMPORARY_SUFFIX}")

"""Fault tolerance for training: crash-safe checkpoint files and a guard against non-finite losses.

What Lightning 2.6 already does, and what this module adds:

- Checkpoint files. ``TorchCheckpointIO`` serialises to memory and writes through an fsspec transaction whose
  temporary file lives in the system temp directory, so the final move is a copy when that directory is on another
  file system (a kill during the copy tears the file) and nothing is fsynced. :class:`AtomicCheckpointIO` writes
  a temporary file beside the target, flushes, fsyncs, renames (``os.replace``, atomic on POSIX) and fsyncs the
  directory: the target is always either the previous complete file or the new complete file.
  :class:`AtomicCheckpointing` installs it from the callbacks config, so no trainer plugin config is needed.
- SIGTERM. Lightning records SIGTERM and stops at the end of the training batch (``SIGTERMException``); on SLURM
  with ``auto_requeue`` it also saves an ``hpc_ckpt`` and requeues on the requeue signal (SIGUSR1). What it does not
  do outside SLURM is save: :class:`linvit.train.modules.callbacks.SaveOnSigterm` does that (same batch boundary).
- Non-finite losses. Lightning has no guard (``detect_anomaly`` only raises, and slowly). :class:`NonFiniteLossGuard`
  skips the optimiser step of a batch whose loss (or, without a grad scaler, gradient) is NaN/Inf, stops after too
  many skips in a row, or stops at the first one, and never lets non-finite weights into a checkpoint, so the last
  good checkpoint stays on disk.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import Callback, LightningModule, Trainer

from linvit.io.integrity import write_recorded

__all__ = [
    "AtomicCheckpointIO",
    "AtomicCheckpointing",
    "NonFiniteLossError",
    "NonFiniteLossGuard",
    "atomic_write",
    "remove_stale_temporaries",
]

_log = logging.getLogger(__name__)

NON_FINITE_ACTIONS = ("skip", "stop")


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN/Inf loss, gradient or weight and the guard was told to stop."""


def _fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (no-op where directories cannot be opened, e.g. Windows)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it and rename it onto ``path``.

    A crash or kill at any moment leaves ``path`` as it was before (or absent) or complete, never torn. The temporary
    file is removed if ``write`` raises. Returns ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        # BaseException: also on KeyboardInterrupt/SystemExit (SIGTERM) during the write
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(path.parent)
    return path


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files a killed :func:`atomic_write` left in ``directory``; returns what was removed.

    Call it when no writer is active (at the start of a run): a SIGKILL during a save leaves one such file.
    """
    directory = Path(directory)
    removed = []
    if directory.is_dir():
        for leftover in directory.glob(".*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                removed.append(leftover)
    return removed


def _is_local(path: str | os.PathLike) -> bool:
    text = str(path)
    return "://" not in text or text.startswith("file://")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` that writes local files atomically and durably (temp file beside, fsync, rename).

    Remote URLs (``s3://`` ...) go through Lightning's own fsspec path. Use as a trainer plugin
    (``Trainer(plugins=[AtomicCheckpointIO()])``) or through the :class:`AtomicCheckpointing` callback.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None or not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        local = str(path)[len("file://") :] if str(path).startswith("file://") else path
        # its SHA-256 goes into the folder's record, checked before the file is loaded (linvit.io.integrity)
        write_recorded(local, lambda: atomic_write(local, lambda file: torch.save(checkpoint, file)))


class AtomicCheckpointing(Callback):
    """Install :class:`AtomicCheckpointIO` on the trainer's strategy at setup, for every checkpoint the run writes.

    Only a plain ``TorchCheckpointIO`` is replaced: a strategy that brings its own (DeepSpeed, FSDP sharded, async)
    keeps it, with a log line saying so. At the start of fit, temporary files left by a killed save in the
    checkpoint directory are removed.
    """

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        current = strategy.checkpoint_io
        if type(current) is TorchCheckpointIO:
            strategy.checkpoint_io = AtomicCheckpointIO()
        elif not isinstance(current, AtomicCheckpointIO):
            _log.info("keeping the strategy's %s: atomic checkpoint files not installed", type(current).__name__)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
        if trainer.is_global_zero and dirpath and _is_local(dirpath):
            for leftover in remove_stale_temporaries(dirpath):
                _log.info("removed %s, left by a save that was killed", leftover)


def _first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding NaN/Inf, or None (one device sync in all)."""
    named = [(n, t) for n, t in tensors.items() if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()]
    if not named:
        return None
    # amax propagates NaN and keeps Inf, so one stacked check finds both without a sync per tensor
    peaks = torch.stack([t.detach().abs().amax().float().to(named[0][1].device) for _, t in named])
    finite = torch.isfinite(peaks)
    if bool(finite.all()):
        return None
    return named[int((~finite).nonzero()[0])][0]


class NonFiniteLossGuard(Callback):
    """Keep NaN/Inf out of the weights and out of the checkpoints.

    Args:
        action: ``"skip"`` drops the optimiser step of a batch whose loss is not finite (its gradients are
            discarded; a warning names the step) and stops after ``max_consecutive_skips`` skipped steps in a row;
            ``"stop"`` stops at the first non-finite loss. Stopping raises :class:`NonFiniteLossError` before the
            weights change, so no checkpoint is written and the last good one stays on disk. Under DDP the
            processes agree on every decision (one boolean all-reduce per step).
        max_consecutive_skips: skipped steps in a row before the run is declared diverged and stopped.
        check_gradients: also skip when the loss is finite but a gradient is not. Skipped automatically under a
            gradient scaler (fp16 mixed precision), which already skips such steps and lowers its scale.
        check_weights_on_save: refuse to write a checkpoint whose weights hold NaN/Inf (raises
            :class:`NonFiniteLossError`; the previous checkpoint file is left as it was).
    """

    def __init__(
        self,
        action: str = "skip",
        max_consecutive_skips: int = 10,
        check_gradients: bool = True,
        check_weights_on_save: bool = True,
    ):
        if action not in NON_FINITE_ACTIONS:
            raise ValueError(f"NonFiniteLossGuard action must be one of {NON_FINITE_ACTIONS}, got {action!r}.")
        if int(max_consecutive_skips) < 1:
            raise ValueError(f"max_consecutive_skips must be >= 1, got {max_consecutive_skips}.")
        self.action = action
        self.max_consecutive_skips = int(max_consecutive_skips)
        self.check_gradients = bool(check_gradients)
        self.check_weights_on_save = bool(check_weights_on_save)
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self._bad_loss: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"skipped_steps": self.skipped_steps, "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.consecutive_skips = int(state_dict.get("consecutive_skips", 0))

    def _stop(self, trainer: Trainer, reason: str) -> None:
        raise NonFiniteLossError(
            f"{reason} at step {trainer.global_step} (epoch {trainer.current_epoch}); stopping before the weights "
            "change, so the last checkpoint on disk is the last good one. Lower the learning rate, enable "
            "gradient clipping (trainer.gradient_clip_val=1.0), use bf16 instead of fp16, or check the data; "
            "callbacks.non_finite_loss.action=skip skips such steps instead."
        )

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        value = float(loss.detach())
        if not math.isfinite(value):
            # decided in on_before_optimizer_step, after accumulation and together with the other processes
            self._bad_loss = value

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        reason = None
        if self._bad_loss is not None:
            reason = f"non-finite training loss ({self._bad_loss})"
        elif self.check_gradients and getattr(trainer.precision_plugin, "scaler", None) is None:
            grads = {name: p.grad for name, p in pl_module.named_parameters() if p.grad is not None}
            bad = _first_non_finite(grads)
            if bad is not None:
                reason = f"non-finite gradient of {bad}"
        self._bad_loss = None
        # every process must take the same decision (a lone skip or stop would desynchronise or hang DDP)
        if trainer.strategy.reduce_boolean_decision(reason is not None, all=False) and reason is None:
            reason = "non-finite loss or gradient on another process"
        if reason is None:
            self.consecutive_skips = 0
            return
        if self.action == "stop":
            self._stop(trainer, reason)
        self.skipped_steps += 1
        self.consecutive_skips += 1
        if self.consecutive_skips >= self.max_consecutive_skips:
            self._stop(trainer, f"{reason}: {self.consecutive_skips} steps in a row")
        _log.warning(
            "%s at step %d: skipping this optimiser step (%d skipped so far)",
            reason,
            trainer.global_step,
            self.skipped_steps,
        )
        # without gradients the optimiser leaves every parameter (and its moments) as it was
        optimizer.zero_grad(set_to_none=True)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.skipped_steps:
            _log.warning("%d optimiser step(s) were skipped for non-finite losses or gradients", self.skipped_steps)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if not self.check_weights_on_save:
            return
        bad = _first_non_finite(checkpoint.get("state_dict", {}))
        if bad is not None:
            raise NonFiniteLossError(
                f"refusing to write a checkpoint at step {trainer.global_step}: weight {bad!r} holds NaN/Inf. The "
                "previous checkpoint file is left as it was; resume from it with a lower learning rate or "
                "gradient clipping (trainer.gradient_clip_val=1.0)."
            )

"""Callbacks that the crash tests inject into ``train.py`` runs (``+callbacks.<name>=...``); on PYTHONPATH there."""

import hashlib
import json
import os
import signal

from lightning.pytorch import Callback


class SignalAtStep(Callback):
    """Send ``signal_name`` to this process when the training batch after ``step`` optimiser steps starts.

    The signal lands while a batch is in flight, like a real one. SIGKILL ends the process on the spot (no handler,
    no cleanup), like the OOM killer or a node failure; SIGTERM is what SLURM sends before pre-emption.
    """

    def __init__(self, step: int, signal_name: str = "SIGKILL"):
        self.step = int(step)
        self.signal = getattr(signal, signal_name)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)


class RecordFinalState(Callback):
    """At the end of fit, write the optimiser step count, epoch and a digest of every weight to a JSON file."""

    def __init__(self, path: str):
        self.path = path

    def on_train_end(self, trainer, pl_module) -> None:
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        state = {"global_step": trainer.global_step, "epoch": trainer.current_epoch, "weights": digest.hexdigest()}
        with open(self.path, "w") as file:
            json.dump(state, file)


class SignalDuringValidation(Callback):
    """Send ``signal_name`` to this process when the validation of epoch ``epoch`` starts its first batch."""

    def __init__(self, epoch: int, signal_name: str = "SIGTERM"):
        self.epoch = int(epoch)
        self.signal = getattr(signal, signal_name)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch and batch_idx == 0:
            os.kill(os.getpid(), self.signal)


class SignalGroupAtStep(Callback):
    """When the batch after ``step`` starts, have another process send SIGTERM to this process's whole group.

    What ``timeout``, SLURM and most schedulers do: the data-loader workers get it too, from a process that is not
    their parent (torch's workers exit quietly only on their parent's SIGTERM). The batch then goes on for a moment,
    so that the signal lands while it is in flight. Only for a process started in its own session
    (``start_new_session=True``): the group must not include the test runner.
    """

    def __init__(self, step: int):
        self.step = int(step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            import subprocess
            import sys
            import time

            group = os.getpgid(0)
            if group != os.getpid():
                raise RuntimeError("SignalGroupAtStep needs a process that leads its own group (start_new_session)")
            sender = f"import os, signal; os.killpg({group}, signal.SIGTERM)"
            subprocess.run([sys.executable, "-c", sender], check=False)  # the sender gets it too, and may die of it
            time.sleep(2)


class SnapshotRunDir(Callback):
    """Copy the run directory at every training step and during every validation: what a SIGKILL there would leave.

    ``<into>/step<k>``: the directory as the batch after k optimizer steps starts; ``<into>/val<e>``: as the second
    batch of epoch e's validation starts; ``<into>/end``: when training has ended, before test and export.
    Checkpoints are hard-linked (they are only ever replaced, never rewritten in place); everything else is copied
    (``metrics.csv`` grows in place).
    """

    def __init__(self, run_dir, into):
        self.run_dir, self.into = str(run_dir), str(into)

    def _snapshot(self, name: str) -> None:
        import shutil

        def link_or_copy(source, target):
            if source.endswith(".ckpt"):
                os.link(source, target)
            else:
                shutil.copy2(source, target)

        shutil.copytree(self.run_dir, os.path.join(self.into, name), copy_function=link_or_copy)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._snapshot(f"step{trainer.global_step}")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking and batch_idx == 1:
            self._snapshot(f"val{trainer.current_epoch}")

    def on_train_end(self, trainer, pl_module) -> None:
        self._snapshot("end")


class SignalAtValidationEnd(Callback):
    """Send ``signal_name`` to this process when the validation of epoch ``epoch`` has ended (after the
    checkpoints it writes: the callbacks of the run come first)."""

    def __init__(self, epoch: int, signal_name: str = "SIGTERM"):
        self.epoch = int(epoch)
        self.signal = getattr(signal, signal_name)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), self.signal)


class SignalAtTrainEpochEnd(Callback):
    """Send ``signal_name`` to this process at the end of training epoch ``epoch`` (``on_train_epoch_end``)."""

    def __init__(self, epoch: int, signal_name: str = "SIGTERM"):
        self.epoch = int(epoch)
        self.signal = getattr(signal, signal_name)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), self.signal)


class SignalDuringEpochSave(Callback):
    """Send ``signal_name`` to this process while the checkpoint written at the end of epoch ``epoch``'s
    validation is being saved (from ``on_save_checkpoint``, inside ``trainer.save_checkpoint``)."""

    def __init__(self, epoch: int, signal_name: str = "SIGTERM"):
        self.epoch = int(epoch)
        self.signal = getattr(signal, signal_name)
        self.sent = False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if not self.sent and trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            self.sent = True
            os.kill(os.getpid(), self.signal)

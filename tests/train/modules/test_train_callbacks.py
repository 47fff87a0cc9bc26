"""Callbacks: SIGTERM saves last.ckpt and stops; checkpoints are renamed into place; learning curves plot."""

from __future__ import annotations

import os
import signal

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from linvit.io.destination import RECORD_NAME, file_sha256, recorded_sha256
from linvit.train.modules.callbacks import AtomicModelCheckpoint, LearningCurves, SaveOnSigterm, accuracy_standard_error
from linvit.train.modules.classification import ImageClassifier


def _loader(n=24):
    images = torch.randn(n, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(images, torch.arange(n) % 4), batch_size=4)


class _KillAtStep(pl.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_saves_last_checkpoint_and_stops(tmp_path):
    module = ImageClassifier("test_resnet", num_classes=4)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        # order matters: the kill happens at the end of step 2, the save right after it
        callbacks=[_KillAtStep(2), SaveOnSigterm(tmp_path)],
    )
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit):  # Lightning's SIGTERMException after the save
        trainer.fit(module, train_dataloaders=_loader())
    assert signal.getsignal(signal.SIGTERM) is not None
    checkpoint = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2
    # beside it only the record of its SHA-256, checked before it is loaded
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, "last.ckpt"], "a temporary file was left behind"
    assert recorded_sha256(tmp_path / "last.ckpt") == file_sha256(tmp_path / "last.ckpt")
    from linvit.train.data import worker_signals

    assert not worker_signals.blocking(), "processes started after the fit would still block SIGTERM"
    signal.signal(signal.SIGTERM, previous)


def test_atomic_checkpoint_and_learning_curves(tmp_path):
    module = ImageClassifier("test_resnet", num_classes=4, ema={"enabled": True})
    curves = LearningCurves(tmp_path / "curves.png")
    checkpoint = AtomicModelCheckpoint(dirpath=tmp_path / "ckpt", filename="best", monitor="val/acc1", mode="max")
    checkpoint.save_last = True
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint, curves],
    )
    trainer.fit(module, train_dataloaders=_loader(), val_dataloaders=_loader(8))
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [RECORD_NAME, "best.ckpt", "last.ckpt"]
    for name in ("best.ckpt", "last.ckpt"):  # recorded under their final names, checked before they are loaded
        assert recorded_sha256(tmp_path / "ckpt" / name) == file_sha256(tmp_path / "ckpt" / name)
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)["global_step"] == 12
    assert [row["epoch"] for row in curves.history] == [0.0, 1.0]
    assert {"val/acc1", "val_ema/acc1", "train/loss_epoch", "lr"} <= set(curves.history[-1])
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    restored = LearningCurves(tmp_path / "other.png")
    restored.load_state_dict(curves.state_dict())
    assert restored.history == curves.history


_GROUP_SIGTERM_CHILD = """
import sys, time
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from linvit.train.modules.callbacks import SaveOnSigterm
from linvit.train.data.worker_signals import SigtermSafeDataLoader


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            print("in step 2", flush=True)  # the test now sends SIGTERM to the whole process group
            time.sleep(3)
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":  # spawned workers import this file
    out_dir, start_method = sys.argv[1], sys.argv[2]
    # fork: any DataLoader (a user's own); spawn and forkserver: linvit's loaders
    loader_class = DataLoader if start_method == "fork" else SigtermSafeDataLoader
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    loader = loader_class(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, num_workers=2,
                          persistent_workers=True, multiprocessing_context=start_method)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[SaveOnSigterm(out_dir)])
    pl.seed_everything(0, workers=True)  # Lightning's worker seeding, wrapped by linvit's loader
    trainer.fit(Model(), loader)
    print("fit returned without the signal", flush=True)
"""


@pytest.mark.parametrize(
    "start_method",
    # ~20 s per start method: fork in the default tier, the others slow
    ["fork", pytest.param("spawn", marks=pytest.mark.slow), pytest.param("forkserver", marks=pytest.mark.slow)],
)
def test_sigterm_to_the_process_group_with_data_workers_saves(start_method, tmp_path):
    """What `timeout`, SLURM and most schedulers do: SIGTERM to every process of the job, the data workers too.

    The workers used to die at once, and the main process crashed ("DataLoader worker (pid ...) is killed by signal:
    Terminated") without saving; with spawn and forkserver (Python 3.14's default) they still did after the fork
    fix (in this test forkserver workers happened to survive without it).
    """
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(_GROUP_SIGTERM_CHILD)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), start_method],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so that the signal reaches it and its workers, not pytest
    )
    try:
        assert child.stdout.readline().strip() == "in step 2"
        os.killpg(child.pid, signal.SIGTERM)
        stdout, stderr = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 0, stderr[-3000:]
    assert "without the signal" not in stdout
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 3


def test_a_tie_on_the_monitored_value_goes_to_the_better_tie_break(tmp_path):
    from types import SimpleNamespace

    def checkpoint_callback(**options) -> AtomicModelCheckpoint:
        return AtomicModelCheckpoint(dirpath=tmp_path, filename="best", monitor="val/acc1", mode="max", **options)

    trainer = SimpleNamespace(callback_metrics={}, strategy=SimpleNamespace(reduce_boolean_decision=lambda d, **_: d))

    def validate(checkpoint: AtomicModelCheckpoint, acc1: float, loss: float) -> bool:
        trainer.callback_metrics = {"val/acc1": torch.tensor(acc1), "val/loss": torch.tensor(loss)}
        better = checkpoint.check_monitor_top_k(trainer, torch.tensor(acc1))
        if better:  # what Lightning's _update_best_and_save keeps
            checkpoint.best_k_models, checkpoint.kth_best_model_path = {"best.ckpt": torch.tensor(acc1)}, "best.ckpt"
        return better

    checkpoint = checkpoint_callback(tie_break="val/loss")
    assert validate(checkpoint, 0.9, 0.5)
    assert validate(checkpoint, 1.0, 0.3)  # better
    assert not validate(checkpoint, 1.0, 0.4)  # a tie, with a higher loss
    assert validate(checkpoint, 1.0, 0.2)  # a tie, with a lower loss: the later epoch
    assert not validate(checkpoint, 0.95, 0.01)  # worse, however low its loss
    assert checkpoint.best_tie_break == pytest.approx(0.2)

    resumed = checkpoint_callback(tie_break="val/loss")
    resumed.load_state_dict(checkpoint.state_dict())
    assert resumed.best_tie_break == pytest.approx(0.2)  # a resumed run decides as the uninterrupted one

    strict = checkpoint_callback()  # no tie_break: the first of equal values stays
    assert validate(strict, 1.0, 0.3) and not validate(strict, 1.0, 0.1)
    with pytest.raises(ValueError, match="tie_break_mode must be 'min' or 'max'"):
        checkpoint_callback(tie_break="val/loss", tie_break_mode="lowest")


def test_within_error_keeps_the_latest_validation_within_one_standard_error_of_the_best(tmp_path):
    from types import SimpleNamespace

    def checkpoint_callback() -> AtomicModelCheckpoint:
        return AtomicModelCheckpoint(
            dirpath=tmp_path, filename="best", monitor="val/acc1", mode="max", tie_break="val/loss", within_error=True
        )

    trainer = SimpleNamespace(
        callback_metrics={},
        strategy=SimpleNamespace(reduce_boolean_decision=lambda d, **_: d),
        datamodule=SimpleNamespace(val_set=[None] * 30),  # one image is 3.3 points
    )

    def validate(checkpoint: AtomicModelCheckpoint, right: int, loss: float = 1.0) -> bool:
        acc1 = right / 30
        trainer.callback_metrics = {"val/acc1": torch.tensor(acc1), "val/loss": torch.tensor(loss)}
        better = checkpoint.check_monitor_top_k(trainer, torch.tensor(acc1))
        if better:  # what Lightning's _update_best_and_save keeps
            checkpoint.best_k_models, checkpoint.kth_best_model_path = {"best.ckpt": torch.tensor(acc1)}, "best.ckpt"
        return better

    checkpoint = checkpoint_callback()
    assert validate(checkpoint, 20)
    assert validate(checkpoint, 27)  # better
    # one standard error at 27/30 (Laplace-smoothed: 28/32) is 1.8 images
    assert validate(checkpoint, 26, loss=9.0)  # one image below, later: it replaces the best, whatever its loss
    assert not validate(checkpoint, 25)  # two images below the best seen (27), not the best kept (26)
    assert validate(checkpoint, 27)
    assert checkpoint.best_seen == pytest.approx(0.9)
    assert accuracy_standard_error(1.0, 30) == pytest.approx(((31 / 32) * (1 / 32) / 30) ** 0.5)
    assert accuracy_standard_error(0.9, 50_000) < 0.0014  # a large validation split keeps a margin of ~0.1 points

    resumed = checkpoint_callback()
    resumed.load_state_dict(checkpoint.state_dict())
    resumed.best_k_models, resumed.kth_best_model_path = dict(checkpoint.best_k_models), "best.ckpt"
    assert resumed.best_seen == pytest.approx(0.9) and not validate(resumed, 25)  # decides as the uninterrupted run

    nan_check = checkpoint_callback()
    assert validate(nan_check, 20) and not validate(nan_check, float("nan"))
    assert not AtomicModelCheckpoint(dirpath=tmp_path, monitor="val/loss", mode="min", within_error=True).within_error

"""Crash-safe checkpoint files and the non-finite loss guard (linvit/train/modules/fault_tolerance.py), in-process."""

import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from linvit.io.destination import RECORD_NAME, DestinationError, file_sha256, recorded_sha256
from linvit.train.modules.fault_tolerance import (
    AtomicCheckpointing,
    AtomicCheckpointIO,
    NonFiniteLossError,
    NonFiniteLossGuard,
    atomic_write,
    remove_stale_temporaries,
)


# -- atomic files -------------------------------------------------------------------------------------------------
def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")
    atomic_write(target, lambda file: file.write(b"new"))
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, "last.ckpt"]  # the record of what it wrote


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")

    def broken(file):
        file.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DestinationError, match="the disk is full") as error:
        atomic_write(target, broken)
    assert str(target) in str(error.value) and "\n" not in str(error.value)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_sigkill_during_a_save_leaves_the_previous_checkpoint_intact(tmp_path):
    """A child process is killed while it is half-way through writing the next checkpoint."""
    target = tmp_path / "last.ckpt"
    child = textwrap.dedent(
        f"""
        import sys, time, torch
        from linvit.train.modules.fault_tolerance import AtomicCheckpointIO, atomic_write
        AtomicCheckpointIO().save_checkpoint({{"step": 1, "weight": torch.arange(1000.0)}}, {str(target)!r})

        def slow(file):
            file.write(b"x" * 4096)        # half a checkpoint on disk ...
            file.flush()
            print("writing", flush=True)  # ... tell the parent, and wait to be killed
            time.sleep(60)

        atomic_write({str(target)!r}, slow)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "writing"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    checkpoint = AtomicCheckpointIO().load_checkpoint(target, weights_only=True)
    assert checkpoint["step"] == 1 and torch.equal(checkpoint["weight"], torch.arange(1000.0))
    # beside it: the record of its SHA-256 (checked before it is loaded), and the killed save's temporary file
    leftovers = [p for p in tmp_path.iterdir() if p.name not in ("last.ckpt", RECORD_NAME)]
    assert len(leftovers) == 1, "the killed save should leave exactly its temporary file"
    assert leftovers[0].name.endswith(".linvit-tmp")
    (tmp_path / ".notes.tmp").write_text("a user's file that looks temporary")
    assert remove_stale_temporaries(tmp_path) == leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == [".linvit-written.json", ".notes.tmp", "last.ckpt"]
    assert recorded_sha256(target) == file_sha256(target)


def test_atomic_checkpoint_io_round_trip_and_remote_paths_fall_back(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    io.save_checkpoint({"a": torch.ones(3)}, tmp_path / "sub" / "x.ckpt")
    assert torch.equal(io.load_checkpoint(tmp_path / "sub" / "x.ckpt")["a"], torch.ones(3))
    calls = []
    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", lambda self, *a, **k: calls.append(a[1]))
    io.save_checkpoint({"a": 1}, "memory://bucket/x.ckpt")
    assert calls == ["memory://bucket/x.ckpt"]


# -- a tiny Lightning setup ---------------------------------------------------------------------------------------
class TinyRegression(LightningModule):
    """One linear layer; the loss is made NaN (or its gradient NaN) on chosen optimiser steps."""

    def __init__(self, nan_loss_steps=(), nan_grad_steps=()):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.nan_loss_steps, self.nan_grad_steps = set(nan_loss_steps), set(nan_grad_steps)
        self.weights_seen: dict[int, torch.Tensor] = {}

    def training_step(self, batch, batch_idx):
        self.weights_seen[self.global_step] = self.layer.weight.detach().clone()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_step in self.nan_loss_steps:
            loss = loss * float("nan")
        if self.global_step in self.nan_grad_steps:
            # finite (zero) value, NaN gradient: d sqrt(u)/du at u = 0 is inf, times the 0 of d(0*w)/dw
            loss = loss + torch.sqrt(self.layer.weight.abs().sum() * 0.0)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)


def _loader(batches: int = 6) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batches * 2, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)


def _trainer(tmp_path, callbacks, max_steps=6) -> Trainer:
    return Trainer(
        default_root_dir=tmp_path,
        max_steps=max_steps,
        accelerator="cpu",
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )


def test_skip_drops_the_bad_step_and_training_goes_on(tmp_path, caplog):
    model, guard = TinyRegression(nan_loss_steps={2}), NonFiniteLossGuard(action="skip")
    with caplog.at_level(logging.WARNING, logger="linvit.train.modules.fault_tolerance"):
        _trainer(tmp_path, [guard]).fit(model, _loader())
    assert guard.skipped_steps == 1 and guard.consecutive_skips == 0
    assert torch.equal(model.weights_seen[2], model.weights_seen[3]), "the bad step changed the weights"
    assert not torch.equal(model.weights_seen[3], model.weights_seen[4]), "training did not go on after the skip"
    assert torch.isfinite(model.layer.weight).all()
    assert any("non-finite training loss" in r.message and "step 2" in r.message for r in caplog.records)


def test_skip_also_catches_a_non_finite_gradient_behind_a_finite_loss(tmp_path):
    model, guard = TinyRegression(nan_grad_steps={1}), NonFiniteLossGuard(action="skip")
    _trainer(tmp_path, [guard]).fit(model, _loader())
    assert guard.skipped_steps == 1
    assert torch.equal(model.weights_seen[1], model.weights_seen[2])
    assert torch.isfinite(model.layer.weight).all()


def test_without_the_guard_the_same_nan_ruins_the_weights(tmp_path):
    """The control: the tests above would fail without the guard."""
    model = TinyRegression(nan_loss_steps={2})
    _trainer(tmp_path, []).fit(model, _loader())
    assert not torch.isfinite(model.layer.weight).all()


def test_stop_raises_a_clear_error_and_keeps_the_last_good_checkpoint(tmp_path):
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True, every_n_train_steps=1, save_top_k=0)
    model = TinyRegression(nan_loss_steps={3})
    trainer = _trainer(tmp_path, [NonFiniteLossGuard(action="stop"), checkpoints, AtomicCheckpointing()])
    with pytest.raises(NonFiniteLossError, match=r"non-finite training loss \(nan\) at step 3.*gradient_clip_val"):
        trainer.fit(model, _loader())
    last = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert last["global_step"] == 3
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values())
    assert torch.equal(last["state_dict"]["layer.weight"], model.weights_seen[3])


def test_too_many_skips_in_a_row_stop_the_run(tmp_path):
    model = TinyRegression(nan_loss_steps=set(range(100)))
    with pytest.raises(NonFiniteLossError, match="3 steps in a row"):
        _trainer(tmp_path, [NonFiniteLossGuard(action="skip", max_consecutive_skips=3)]).fit(model, _loader())
    assert torch.isfinite(model.layer.weight).all()


def test_a_checkpoint_with_nan_weights_is_refused_and_the_old_file_kept(tmp_path):
    model = TinyRegression()
    trainer = _trainer(tmp_path, [NonFiniteLossGuard(), AtomicCheckpointing()], max_steps=1)
    trainer.fit(model, _loader())
    target = tmp_path / "last.ckpt"
    trainer.save_checkpoint(target)
    before = target.read_bytes()
    with torch.no_grad():
        model.layer.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteLossError, match="layer.weight"):
        trainer.save_checkpoint(target)
    assert target.read_bytes() == before


def test_atomic_checkpointing_installs_the_io_plugin(tmp_path):
    trainer = _trainer(tmp_path, [AtomicCheckpointing()], max_steps=1)
    trainer.fit(TinyRegression(), _loader())
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


class _ConstantMetric(TinyRegression):
    def validation_step(self, batch, batch_idx):
        self.log("val/const", 1.0)


@pytest.mark.parametrize(
    "on_train_epoch_end",
    [
        pytest.param(False, id="after-validation"),  # configs/callbacks/model_checkpoint.yaml
        pytest.param(None, id="lightning-default"),
    ],
)
def test_last_ckpt_follows_every_epoch_even_without_a_new_best(tmp_path, on_train_epoch_end):
    """last.ckpt is what a resumed run starts from: it must not stay at the epoch of the best metric."""
    from linvit.train.modules.callbacks import AtomicModelCheckpoint

    checkpoints = AtomicModelCheckpoint(
        dirpath=tmp_path,
        filename="best",
        monitor="val/const",
        mode="max",
        save_top_k=1,
        save_last=True,
        save_on_train_epoch_end=on_train_epoch_end,
    )
    trainer = _trainer(tmp_path, [checkpoints, AtomicCheckpointing()], max_steps=-1)
    trainer.fit_loop.max_epochs = 3
    trainer.fit(_ConstantMetric(), _loader(), _loader(1))
    assert torch.load(tmp_path / "best.ckpt", weights_only=True)["global_step"] == 6  # the first epoch's
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 18


def test_guard_rejects_unknown_actions():
    with pytest.raises(ValueError, match="skip.*stop"):
        NonFiniteLossGuard(action="ignore")


_DDP_CHILD = """
import json, sys, torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset
from linvit.train.modules.fault_tolerance import NonFiniteLossGuard
from linvit.train.runs.run import leave_process_group


class Model(LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        if self.global_rank == 0 and self.global_step == 2:  # NaN on one process only
            loss = loss * float("nan")
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.1)


x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)
guard, model = NonFiniteLossGuard(action="skip", check_gradients=False), Model()
trainer = Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=4, logger=False, callbacks=[guard],
                  enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
trainer.fit(model, loader)
with open(f"{sys.argv[1]}/rank{trainer.global_rank}.json", "w") as file:
    json.dump({"skipped": guard.skipped_steps, "weight": model.layer.weight.flatten().tolist()}, file)
leave_process_group()  # as train.py does: a gloo group left to the interpreter's exit can abort it
"""


@pytest.mark.slow
def test_under_ddp_every_process_skips_the_same_step(tmp_path):
    """A NaN on one process only: both skip (gradients are not checked here, only the loss flag travels)."""
    import json

    script = tmp_path / "ddp_child.py"
    script.write_text(_DDP_CHILD)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["skipped"] == ranks[1]["skipped"] == 1
    assert ranks[0]["weight"] == ranks[1]["weight"], "the processes' weights diverged"
    assert all(map(torch.isfinite, torch.tensor(ranks[0]["weight"])))


def test_the_callbacks_config_builds_the_callbacks(tmp_path):
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from linvit.train.runs.hydra_app import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose("train", overrides=["callbacks=fault_tolerance", f"paths.output_dir={tmp_path}"])
    built = {name: instantiate(entry) for name, entry in cfg.callbacks.items()}
    assert isinstance(built["atomic_checkpointing"], AtomicCheckpointing)
    guard = built["non_finite_loss"]
    assert isinstance(guard, NonFiniteLossGuard) and guard.action == "skip" and guard.max_consecutive_skips == 10

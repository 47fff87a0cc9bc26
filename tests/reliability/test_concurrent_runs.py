"""Concurrent runs never share a run directory or a temporary file (linvit/train/runs/run_dir.py, RunDirectoryGuard).

Two ``python train.py`` started in the same second with the same task_name used to share one run directory: one
crashed on the shared ``last.ckpt.tmp``, the survivor had a mixed ``metrics.csv`` and a ``config.yaml`` that
disagreed with its ``.hydra/overrides.yaml``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from train_helpers import FAST, TINY_TIMM, compose

from linvit.train.modules.callbacks import AtomicModelCheckpoint, unique_temporary
from linvit.train.modules.fault_tolerance import remove_stale_temporaries
from linvit.train.runs.run import train
from linvit.train.runs.run_dir import (
    LOCK_NAME,
    RunDirectoryInUseError,
    claim_new_directory,
    run_directory_lock,
)

ROOT = Path(__file__).resolve().parents[2]
TINY_RUN = [
    *TINY_TIMM,
    *FAST,
    "trainer.max_epochs=1",
    "+trainer.limit_train_batches=2",
    "+trainer.limit_val_batches=1",
    "test=false",
    "export.enabled=false",
]


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", HF_HUB_OFFLINE="1")


def _train_py(log_dir: Path, *overrides: str) -> subprocess.Popen:
    command = [sys.executable, str(ROOT / "train.py"), f"paths.log_dir={log_dir}", *overrides]
    return subprocess.Popen(command, cwd=log_dir, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _hold_lock(directory: Path) -> subprocess.Popen:
    """Another process that holds ``directory``'s lock (as a running train.py does) until it is killed."""
    code = (
        "import sys, time\n"
        "from linvit.train.runs.run_dir import hold_run_directory\n"
        "hold_run_directory(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(directory)], env=_env(), stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)  # the kernel drops a dead process's lock
        process.wait(timeout=60)


# -- run directories ----------------------------------------------------------------------------------------------
def test_claim_new_directory_gives_every_caller_its_own(tmp_path):
    claimed: list[Path] = []
    threads = [threading.Thread(target=lambda: claimed.append(claim_new_directory(tmp_path, "run"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(p.name for p in claimed) == sorted(["run"] + [f"run_{i}" for i in range(1, 8)])


def test_two_train_py_started_together_get_their_own_run_directories(tmp_path):
    # the same timestamped run_name for both (a year, not a second: they surely start within it)
    runs = [_train_py(tmp_path, *TINY_RUN, f"seed={seed}", "run_name=run_${now:%Y}") for seed in (1, 2)]
    for run in runs:
        _, stderr = run.communicate(timeout=600)
        assert run.returncode == 0, stderr[-3000:]
    run_dirs = sorted((tmp_path / "digits_test_resnet").iterdir())  # <data>_<model>
    assert len(run_dirs) == 2, f"the two runs shared a directory: {run_dirs}"
    seeds = set()
    for run_dir in run_dirs:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text())
        assert f"seed={config['seed']}" in overrides, f"{run_dir.name}: config.yaml and overrides.yaml disagree"
        assert config["run_name"] == run_dir.name
        assert (run_dir / "checkpoints" / "last.ckpt").is_file()
        rows = (run_dir / "metrics.csv").read_text().splitlines()
        assert len(rows) == 1 + 2, f"{run_dir.name}: metrics.csv holds another run's rows too"  # val + train epoch
        seeds.add(config["seed"])
    assert seeds == {1, 2}


@pytest.mark.slow  # two train.py processes (~10 s); the in-process lock test runs in the default tier
def test_a_second_train_py_with_the_same_run_name_is_refused(tmp_path):
    run_dir = tmp_path / "digits_test_resnet" / "busy"  # <data>_<model>
    holder = _hold_lock(run_dir)
    try:
        second = _train_py(tmp_path, *TINY_RUN, "run_name=busy")
        _, stderr = second.communicate(timeout=600)
        assert second.returncode == 1
        assert "is in use by another process" in stderr and "run_name=" in stderr, stderr[-2000:]
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME], "the refused run wrote into the directory"
    finally:
        _stop(holder)
    # once the first process has ended (here: killed), the same command runs (and would resume)
    again = _train_py(tmp_path, *TINY_RUN, "run_name=busy")
    _, stderr = again.communicate(timeout=600)
    assert again.returncode == 0, stderr[-3000:]
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_train_refuses_a_run_directory_in_use_and_releases_its_own(tmp_path):
    holder = _hold_lock(tmp_path / "busy")
    try:
        with pytest.raises(RunDirectoryInUseError, match=r"busy is in use by another process \(pid \d+"):
            train(compose([*TINY_RUN, "train=false"], tmp_path / "busy"))
        assert not (tmp_path / "busy" / "config.yaml").exists()
    finally:
        _stop(holder)
    # one process may take the lock again and again (a resumed in-process run), and nests it
    with run_directory_lock(tmp_path / "mine"), run_directory_lock(tmp_path / "mine"):
        pass
    for _ in range(2):
        train(compose([*TINY_RUN, "train=false"], tmp_path / "mine"))


# -- temporary files ----------------------------------------------------------------------------------------------
def test_checkpoint_temporary_files_are_named_per_writer(tmp_path, monkeypatch):
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from linvit.train.modules.classification import ImageClassifier

    used: list[str] = []
    save = pl.Trainer.save_checkpoint
    monkeypatch.setattr(
        pl.Trainer,
        "save_checkpoint",
        lambda self, path, *a, **k: (used.append(str(path)), save(self, path, *a, **k))[1],
    )
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(images, torch.arange(8) % 4), batch_size=4)
    checkpoints = AtomicModelCheckpoint(
        dirpath=tmp_path, filename="best", monitor="val/acc1", mode="max", save_last=True
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints],
    )
    trainer.fit(ImageClassifier("test_resnet", num_classes=4), loader, loader)
    assert len(used) >= 3 and len(set(used)) == len(used), used  # last twice, best at least once; never one name twice
    for path in map(Path, used):
        assert path.name.startswith((".best.ckpt.", ".last.ckpt.")) and path.name.endswith(".linvit-tmp")
        assert f".{os.getpid()}-" in path.name
    # and the record of their SHA-256s (linvit.io.integrity), written under its own temporary names
    assert sorted(p.name for p in tmp_path.iterdir()) == [".linvit-written.json", "best.ckpt", "last.ckpt"]
    # a kill between write and rename leaves one; the next run's start removes it
    leftover = unique_temporary(tmp_path / "last.ckpt")
    leftover.write_bytes(b"half")
    assert remove_stale_temporaries(tmp_path) == [leftover]

"""Real DDP on the CPU: `python train.py trainer=ddp` starts 2 processes (gloo), run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from train_helpers import FAST, REPO, TINY_TIMM


def test_train_py_ddp_two_processes(tmp_path):
    command = [
        sys.executable,
        str(REPO / "train.py"),
        *TINY_TIMM,
        *FAST,
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "trainer.sync_batchnorm=false",
        "trainer.max_epochs=1",
        "+trainer.limit_train_batches=3",
        "+trainer.limit_val_batches=2",
        "model.optimizer.lr_base_size=64",
        f"paths.log_dir={tmp_path}",
        "run_name=ddp",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "MEMBER: 2/2" in output  # both ranks joined the process group
    run_dir = tmp_path / "digits_linvit_nano" / "ddp"
    log = (run_dir / "train.log").read_text()
    assert "effective batch 32" in log  # 16 per device x 2 devices
    assert "lr 0.001 " in log  # 2e-3 per 64 images x 32 images
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["test/acc1"] <= 1.0
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "model.safetensors").is_file()
    # only rank 0 writes the run directory: no second run folder from the re-launched rank
    assert sorted(p.name for p in (tmp_path / "digits_linvit_nano").iterdir()) == ["ddp"]

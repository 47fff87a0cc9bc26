"""DDP on the CPU with the default config (linvit_nano on digits, EMA on): both documented multi-process commands.

`python train.py trainer=ddp trainer.accelerator=cpu trainer.devices=2` used to stop at "SyncBatchNorm layers only
work with GPU modules", and `python train.py trainer=ddp_sim` at "unable to resize file" (the EMA copy's random
generator does not cross spawn). The README test runs both commands whole (slow tier); here they run short.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import torch
import torch.multiprocessing as mp
from train_helpers import REPO, SHORT, report_ema_parameters  # SHORT: one epoch of two steps; else the defaults

from linvit.train.modules.classification import ImageClassifier


def _train_py(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(REPO / "train.py"), *overrides, *SHORT, f"paths.log_dir={tmp_path}", "run_name=ddp"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def _check_run(tmp_path, result: subprocess.CompletedProcess) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    run_dir = tmp_path / "digits_linvit_nano" / "ddp"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["test/acc1"] <= 1.0 and 0.0 <= metrics["test_ema/acc1"] <= 1.0  # EMA on, as by default
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "model.safetensors").is_file()
    # only rank 0 writes the run directory: no second run folder from the other rank
    assert sorted(p.name for p in (tmp_path / "digits_linvit_nano").iterdir()) == ["ddp"]
    return (run_dir / "train.log").read_text()


def test_ddp_on_the_cpu_with_the_default_config(tmp_path):
    result = _train_py(tmp_path, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2")
    log = _check_run(tmp_path, result)
    assert "MEMBER: 2/2" in result.stdout + result.stderr  # both ranks joined the process group
    assert "effective batch 128" in log  # 64 per device x 2 devices
    assert "sync_batchnorm=true needs GPUs" in log
    config = (tmp_path / "digits_linvit_nano" / "ddp" / "config.yaml").read_text()
    assert "sync_batchnorm: false" in config  # the saved config says what ran
    assert result.stdout.count("test: top-1") == 1, "the summary is printed once, by rank 0"


def test_the_ema_model_crosses_spawn():
    """What ddp_spawn does with the LightningModule (trainer=ddp_sim): send it to a spawned process."""
    module = ImageClassifier("test_resnet", 10, ema={"enabled": True})
    module.model_ema.update(module.model, step=1)
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    process = context.Process(target=report_ema_parameters, args=(0, module, queue))
    process.start()
    process.join(120)
    assert process.exitcode == 0
    expected = sum(p.numel() for p in module.model_ema.parameters())
    assert queue.get() == (0, expected, module.model_ema._sr_generator.initial_seed())
    # and a plain pickle round trip keeps the generator's state
    copy = pickle.loads(pickle.dumps(module.model_ema))
    assert torch.equal(copy._sr_generator.get_state(), module.model_ema._sr_generator.get_state())

"""Fixtures of the benchmark tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.accuracy import run as accuracy


@pytest.fixture
def fake_accuracy_train(monkeypatch) -> list[list[str]]:
    """The accuracy runner's ``python train.py`` replaced by a stand-in that writes what a finished run leaves (test
    metrics, curves PNG, config; the per-epoch CSV when the command asks for it) in no time; returns the commands."""
    calls: list[list[str]] = []

    def fake_train(command, **kwargs):
        calls.append(command)
        run_dir = Path(next(arg for arg in command if arg.startswith("hydra.run.dir=")).split("=", 1)[1])
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.json").write_text(json.dumps({"test/acc1": 0.5, "test/acc5": 1.0}))
        (run_dir / "learning_curves.png").write_bytes(b"png")
        (run_dir / "config.yaml").write_text("callbacks:\n  model_checkpoint:\n    within_error: true\n")
        if any("epoch_test" in arg for arg in command):
            (run_dir / "epoch_test.csv").write_text(
                "epoch,step,val_acc1,val_loss,val_images,test_acc1,test_ema_acc1,seconds\n0,5,0.5,1.0,10,0.4,,2.5\n"
            )
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(accuracy.subprocess, "run", fake_train)
    monkeypatch.setattr(accuracy, "_params", lambda model: 1)
    monkeypatch.setattr(accuracy, "_write_folder_set", lambda dataset, folders: None)
    return calls

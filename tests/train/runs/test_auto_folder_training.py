"""The bar of `auto`: a new user's small folder trains with the one command and nothing else.

3 classes x 40 training images (the first three of scikit-learn's digits, upsampled to 32-px PNGs; 10 per class
validate, 100 per class test) with `linvit train data=imagefolder data.root=DIR`. With ImageNet's recipe (batch
128, drop_last, 20 epochs) this took 20 optimizer steps and stayed at chance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_three_classes_of_forty_images_train_with_the_one_command(tmp_path):
    sys.path.insert(0, str(REPO))
    from benchmarks.accuracy.folders import write_folder

    root = write_folder("digits", tmp_path / "three_digits", classes=3, per_class=40, val_per_class=10)
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # the `linvit` script
    started = time.perf_counter()
    result = subprocess.run(
        ["linvit", "train", "data=imagefolder", f"data.root={root}"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    (run_dir,) = (tmp_path / "outputs" / "three_digits_linvit_nano").iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    log = result.stdout + result.stderr
    for key in ("data.num_classes=auto: 3", "data.batch_size=auto: 8", "trainer.max_epochs=auto"):
        assert key in log, key
    print(f"test top-1 {100 * metrics['test/acc1']:.2f}% in {wall:.0f} s")  # shown with -s
    assert metrics["test/acc1"] >= 0.9, metrics

"""Real artefacts for the property tier, made once per test session, and its three Hypothesis profiles.

The artefacts are what a user has after the README's commands: a trained run directory (``config.yaml``,
``checkpoints/best.ckpt`` and ``last.ckpt``, the exported ``model.safetensors`` + ``config.json``), weights saved as a
plain ``.pth`` state dict, and images in the formats and modes users have. Each example copies what it damages into a
folder of its own, so no example sees another's damage. xdist's workers share one copy (made under a lock).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

REPO = Path(__file__).resolve().parents[2]

_QUIET = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
# The default tier: a few examples per property, the same every run (a failure there reproduces), no shrinking.
settings.register_profile(
    "hostile-fast",
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=_QUIET,
)
# CI, after the default tier: more examples, again the same every run. A red CI names a failure that reproduces on a
# developer's machine, and only a change can turn CI red, never a new draw.
settings.register_profile(
    "hostile-long",
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=_QUIET,
)
# A developer hunting: many random examples, each failure shrunk to its smallest and kept in .hypothesis/ to replay.
# What it finds becomes an @example of its property, so the fixed profiles try it from then on.
settings.register_profile("hostile-hunt", max_examples=200, deadline=None, suppress_health_check=_QUIET)
settings.load_profile(os.environ.get("LINVIT_HYPOTHESIS_PROFILE", "hostile-fast"))

TINY_RUN = [
    "data.img_size=32",
    "data.batch_size=16",
    "data.num_workers=0",
    "trainer.max_epochs=1",
    "+trainer.limit_train_batches=2",
    "+trainer.limit_val_batches=1",
    "+trainer.limit_test_batches=1",
    "trainer.enable_progress_bar=false",
]


def _make_run(folder: Path) -> Path:
    run = folder / "run"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [sys.executable, str(REPO / "train.py"), *TINY_RUN, f"paths.output_dir={run}"],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    return run


def _make_images(folder: Path) -> Path:
    """A two-class ImageFolder (train/val/test) of the digits, in PNG, JPEG, TIFF (also float), BMP and GIF."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    root = folder / "images"
    formats = [("png", "L"), ("jpg", "RGB"), ("tif", "F"), ("bmp", "RGB"), ("gif", "P"), ("png", "RGBA")]
    for split, start in (("train", 0), ("val", 40), ("test", 80)):
        for label in (0, 1):
            class_dir = root / split / f"digit{label}"
            class_dir.mkdir(parents=True)
            indices = np.flatnonzero(digits.target == label)[start : start + 6]
            for number, index in enumerate(indices):
                suffix, mode = formats[number % len(formats)]
                pixels = (digits.images[index] * 16).astype(np.uint8)
                image = Image.fromarray(pixels).resize((32, 32))
                image = image.convert(mode) if mode != "F" else Image.fromarray(np.asarray(image, np.float32) / 255)
                image.save(class_dir / f"{number}.{suffix}")
    return root


def _make_artefacts(folder: Path) -> None:
    import torch

    run = _make_run(folder)
    checkpoint = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    weights = {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items()}
    weights = {key: value for key, value in weights.items() if not key.startswith(("ema", "model_ema"))}
    torch.save(weights, folder / "weights.pth")
    export = folder / "export"
    export.mkdir()
    for name in ("model.safetensors", "config.json"):
        shutil.copy(run / name, export / name)
    _make_images(folder)
    (folder / "done").write_text("ok")


@pytest.fixture(scope="session")
def real_artefacts(tmp_path_factory) -> Path:
    """The folder of real artefacts, shared by xdist's workers (the first makes it, under a lock)."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base folder sits in the run's shared one
        shared = shared.parent
    folder = shared / "hostile-artefacts"
    with FileLock(str(shared / "hostile-artefacts.lock")):
        if not (folder / "done").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            _make_artefacts(folder)
    return folder

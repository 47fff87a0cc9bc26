"""Segmentation training (linvit.train.data.segmentation, linvit.train.modules.segmentation): the folder DataModule, a
short run that learns, the shared warm-up + cosine schedule, and runs saved when these classes lived in linvit.dense
(their configs name linvit.dense.seg_*): `linvit eval` evaluates them without Hydra, and a config written then still
trains."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from linvit.dense.seg_folder import IGNORE_INDEX
from linvit.dense.synthetic import generate_synthetic_segmentation
from linvit.train.data.segmentation import SegmentationDataModule
from linvit.train.modules.segmentation import SegmentationModule

REPO = Path(__file__).resolve().parents[3]


def test_datamodule_split_without_train_val_folders(tmp_path):
    generate_synthetic_segmentation(tmp_path / "gen", num_train=10, num_val=0, size=(32, 32))
    flat = tmp_path / "gen" / "train"
    datamodule = SegmentationDataModule(flat, num_classes=4, img_size=(32, 32), batch_size=4, val_fraction=0.2)
    datamodule.setup("fit")
    assert len(datamodule.train_set) == 8 and len(datamodule.val_set) == 2
    images, masks = next(iter(datamodule.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and masks.shape == (4, 32, 32)


def test_training_learns_synthetic_shapes(tmp_path):
    """A few epochs on the generated shapes task reach an mIoU far above chance and above predicting background."""
    import lightning as L

    L.seed_everything(0, workers=True)
    datamodule = SegmentationDataModule(
        tmp_path / "shapes",
        num_classes=4,
        img_size=(64, 64),
        batch_size=8,
        scale_range=(0.75, 1.25),
        synthetic={"num_train": 48, "num_val": 16, "size": (64, 64), "seed": 0},
    )
    module = SegmentationModule("test_convnext", 4, head="fpn", channels=32, optimizer={"lr": 3e-3})
    trainer = L.Trainer(
        max_epochs=8,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule)
    miou = float(trainer.callback_metrics["val/mIoU"])
    # the best constant answer (all background) scores IoU_bg / 4 over the four classes
    masks = torch.stack([m for _, m in datamodule.val_set])
    valid = masks != IGNORE_INDEX
    background_only = float(((masks == 0) & valid).sum() / valid.sum()) / 4
    assert miou > 0.45, f"mIoU {miou:.3f} after training"
    assert miou > 2 * background_only, (miou, background_only)
    assert np.isfinite(float(trainer.callback_metrics["val/loss"]))


def test_schedule_warms_up_from_one_step_and_ends_at_the_min_ratio():
    module = SegmentationModule(
        "test_convnext", 3, channels=8, scheduler={"warmup_fraction": 0.1, "min_lr_ratio": 0.05}
    )
    module._trainer = SimpleNamespace(estimated_stepping_batches=100)
    schedule = module.configure_optimizers()["lr_scheduler"]["scheduler"].lr_lambdas[0]
    for step in range(10):  # the warm-up of linvit's segmentation recipe: (step + 1) / (warmup + 1)
        assert schedule(step) == pytest.approx((step + 1) / 11)
    assert schedule(10) == pytest.approx(1.0)
    assert schedule(55) == pytest.approx(0.05 + 0.95 * 0.5)  # half way through the cosine
    assert schedule(100) == pytest.approx(0.05)


# -- runs saved when segmentation training lived in linvit.dense ---------------------------------------------------
OLD_DATA = "linvit.dense.seg_data.SegmentationDataModule"
OLD_MODEL = "linvit.dense.seg_module.SegmentationModule"


def _old_segmentation_run(tmp_path: Path) -> tuple[Path, SegmentationModule, dict]:
    """A run directory as such a run left it: config.yaml naming the old classes, a checkpoint of the module."""
    torch.manual_seed(0)
    module = SegmentationModule("test_convnext", 4, channels=16)
    generate_synthetic_segmentation(tmp_path / "shapes", num_train=2, num_val=4, num_test=4, size=(32, 32))
    data = {
        "_target_": OLD_DATA,
        "_convert_": "all",
        "data_dir": str(tmp_path / "shapes"),
        "num_classes": 4,
        "img_size": [32, 32],
        "batch_size": 2,
        "eval_batch_size": 4,
        "num_workers": 0,
        "synthetic": {"num_train": 2, "num_val": 4, "num_test": 4, "size": [32, 32], "seed": 0},
    }
    model = {"_target_": OLD_MODEL, "_convert_": "all", "backbone": "test_convnext", "num_classes": 4, "channels": 16}
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"data": data, "model": model}))
    saved = {"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}
    torch.save(saved, run / "checkpoints" / "best.ckpt")
    return run, module, data


def _blocked(folder: Path, name: str) -> str:
    """A folder that shadows package ``name`` with one that refuses to import."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked in this test')\n")
    return str(folder)


def test_eval_of_a_segmentation_run_saved_under_the_old_names_without_hydra(tmp_path):
    import lightning.pytorch as pl

    run, module, data = _old_segmentation_run(tmp_path)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(filter(None, [_blocked(tmp_path / "b", "hydra"), os.environ.get("PYTHONPATH")])),
    )
    command = [sys.executable, "-m", "linvit.cli", "eval", str(run), "--json", "--accelerator", "cpu"]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout)
    assert {"test/mIoU", "test/loss", "test/IoU_background", "test/IoU_triangle"} <= set(metrics)
    # the same weights on the same data, evaluated here: the command loaded the checkpoint, not a fresh model
    datamodule = SegmentationDataModule(**{k: v for k, v in data.items() if not k.startswith("_")})
    datamodule.setup("test")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False)
    expected = trainer.test(module.eval(), dataloaders=datamodule.test_dataloader(), verbose=False)[0]
    assert metrics["test/mIoU"] == pytest.approx(expected["test/mIoU"], abs=1e-6)


def test_eval_of_a_segmentation_run_refuses_backbone_arguments_that_load_files(tmp_path, capsys):
    from linvit.cli import main as linvit_main

    run, module, _ = _old_segmentation_run(tmp_path)
    hparams = {**dict(module.hparams), "backbone_kwargs": {"pretrained_cfg_overlay": {"file": "/tmp/x.pth"}}}
    torch.save({"hyper_parameters": hparams, "state_dict": module.state_dict()}, run / "checkpoints" / "best.ckpt")
    assert linvit_main(["eval", str(run), "--accelerator", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "pretrained_cfg_overlay" in err and "--trusted" in err


def test_saved_runs_build_their_classes_under_the_new_names(tmp_path):
    from linvit.train.runs.saved_run import RENAMED_TARGETS, build_from_config, load_run_config
    from linvit.utils.saved_config import TRUSTED_TARGETS

    assert set(RENAMED_TARGETS.values()) <= TRUSTED_TARGETS
    run, _, _ = _old_segmentation_run(tmp_path)
    config = load_run_config(run / "config.yaml")
    assert config["data"]["_target_"] == "linvit.train.data.segmentation.SegmentationDataModule"
    assert config["model"]["_target_"] == "linvit.train.modules.segmentation.SegmentationModule"
    datamodule = build_from_config(config["data"], run / "config.yaml", prefix="data")
    assert isinstance(datamodule, SegmentationDataModule) and datamodule.crop_size == (32, 32)


def test_a_config_written_with_the_old_names_still_trains(tmp_path, caplog):
    """A user's config copied from ours before the move (e.g. in --config-dir) builds the classes where they are now."""
    from train_helpers import compose

    from linvit.train.runs.run import _instantiate_plain

    overrides = ["experiment=seg_synthetic_linvit_nano", "model.backbone=test_convnext", "model.channels=8"]
    overrides += [f"paths.data_dir={tmp_path}", f"data._target_={OLD_DATA}", f"model._target_={OLD_MODEL}"]
    cfg = compose(overrides, tmp_path / "run")
    with caplog.at_level("WARNING", logger="linvit.train"):
        datamodule, model = _instantiate_plain(cfg.data, "data"), _instantiate_plain(cfg.model, "model")
    assert isinstance(datamodule, SegmentationDataModule) and isinstance(model, SegmentationModule)
    assert (
        f"_target_: {OLD_DATA} has moved: write _target_: linvit.train.data.segmentation.SegmentationDataModule"
        in caplog.text
    )

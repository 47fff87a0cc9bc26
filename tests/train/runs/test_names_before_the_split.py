"""Runs and configs written while linvit.train was one flat folder name their classes by the old module paths
(``linvit.train.datamodules.DigitsDataModule``, ``linvit.train.module.ImageClassifier`` ...): they still build, the
same classes under their names now (:data:`linvit.train.runs.saved_run.MOVED_MODULES`)."""

from __future__ import annotations

import logging

import pytest
import torch
import yaml

from linvit.cli import main as linvit_main
from linvit.train.runs.saved_run import _locate, current_target, load_run_config
from linvit.utils.saved_config import TRUSTED_DATAMODULES, TRUSTED_MODELS

# every _target_ of the configs as they were before the split, and the class's name now
OLD_TARGETS = {
    "linvit.train.datamodules.DigitsDataModule": "linvit.train.data.datamodules.DigitsDataModule",
    "linvit.train.datamodules.FashionMNISTDataModule": "linvit.train.data.datamodules.FashionMNISTDataModule",
    "linvit.train.datamodules.ImageFolderDataModule": "linvit.train.data.datamodules.ImageFolderDataModule",
    "linvit.train.datamodules.CIFARDataModule": "linvit.train.data.datamodules.CIFARDataModule",
    "linvit.train.seg_data.SegmentationDataModule": "linvit.train.data.segmentation.SegmentationDataModule",
    "linvit.train.module.ImageClassifier": "linvit.train.modules.classification.ImageClassifier",
    "linvit.train.seg_module.SegmentationModule": "linvit.train.modules.segmentation.SegmentationModule",
    "linvit.train.callbacks.StepReseed": "linvit.train.modules.callbacks.StepReseed",
    "linvit.train.callbacks.LearningCurves": "linvit.train.modules.callbacks.LearningCurves",
    "linvit.train.callbacks.AtomicModelCheckpoint": "linvit.train.modules.callbacks.AtomicModelCheckpoint",
    "linvit.train.callbacks.SaveOnSigterm": "linvit.train.modules.callbacks.SaveOnSigterm",
    "linvit.train.fault_tolerance.AtomicCheckpointing": "linvit.train.modules.fault_tolerance.AtomicCheckpointing",
    "linvit.train.fault_tolerance.NonFiniteLossGuard": "linvit.train.modules.fault_tolerance.NonFiniteLossGuard",
    "linvit.train.logged_metrics.ResumeLoggedMetrics": "linvit.train.modules.logged_metrics.ResumeLoggedMetrics",
    "linvit.train.logged_metrics.ResumableCSVLogger": "linvit.train.modules.logged_metrics.ResumableCSVLogger",
    "linvit.train.run.RunDirectoryGuard": "linvit.train.runs.run.RunDirectoryGuard",
}


@pytest.mark.parametrize("old", sorted(OLD_TARGETS))
def test_an_old_target_names_the_class_under_its_name_now(old):
    new = current_target(old)
    assert new == OLD_TARGETS[old]
    assert _locate(new).__name__ == new.rpartition(".")[2]
    if ".data." in new or ".modules.classification." in new or ".modules.segmentation." in new:
        assert new in TRUSTED_DATAMODULES | TRUSTED_MODELS


def test_names_that_never_moved_are_left_as_they_are():
    for name in ("linvit.train.data.datamodules.DigitsDataModule", "lightning.pytorch.callbacks.RichModelSummary"):
        assert current_target(name) == name
    assert current_target("linvit.train.datamodules") == "linvit.train.datamodules"  # a module, not a class in one


def _old_classification_run(tmp_path):
    from linvit.train.modules.classification import ImageClassifier

    torch.manual_seed(0)
    module = ImageClassifier("linvit_nano", num_classes=10, model_kwargs={"img_size": 16}, ema={"enabled": False})
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    config = {
        "data": {"_target_": "linvit.train.datamodules.DigitsDataModule", "img_size": 16, "eval_batch_size": 512},
        "model": {"_target_": "linvit.train.module.ImageClassifier", "model_name": "linvit_nano", "num_classes": 10},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    torch.save(
        {"hyper_parameters": dict(module.hparams), "state_dict": module.state_dict()}, run / "checkpoints" / "best.ckpt"
    )
    return run


def test_eval_of_a_run_saved_before_the_split(tmp_path, capsys):
    run = _old_classification_run(tmp_path)
    config = load_run_config(run / "config.yaml")
    assert config["data"]["_target_"] == "linvit.train.data.datamodules.DigitsDataModule"
    assert config["model"]["_target_"] == "linvit.train.modules.classification.ImageClassifier"
    assert linvit_main(["eval", str(run), "--accelerator", "cpu", "--json"]) == 0
    assert '"test/acc1"' in capsys.readouterr().out


def test_a_config_with_old_callback_and_logger_targets_still_builds(tmp_path, caplog):
    from train_helpers import FAST, TINY_TIMM, compose

    from linvit.train.modules.callbacks import StepReseed
    from linvit.train.modules.logged_metrics import ResumableCSVLogger
    from linvit.train.runs.run import _instantiate_all

    cfg = compose(
        [
            *TINY_TIMM,
            *FAST,
            "callbacks.step_reseed._target_=linvit.train.callbacks.StepReseed",
            "logger.csv._target_=linvit.train.logged_metrics.ResumableCSVLogger",
        ],
        tmp_path,
    )
    with caplog.at_level(logging.WARNING, logger="linvit.train"):
        callbacks, loggers = _instantiate_all(cfg.callbacks), _instantiate_all(cfg.logger)
    assert any(isinstance(callback, StepReseed) for callback in callbacks)
    assert any(isinstance(logger, ResumableCSVLogger) for logger in loggers)
    assert "write _target_: linvit.train.modules.callbacks.StepReseed" in caplog.text

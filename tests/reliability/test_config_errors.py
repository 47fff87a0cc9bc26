"""Config mistakes fail before any training starts, with a message that says what to change."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate

from linvit.train.hydra_app import config_dir

CONFIGS = config_dir()  # the configs linvit ships (linvit/configs)


def _compose(tmp_path: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=[f"paths.output_dir={tmp_path}", *overrides])


def test_an_experiment_that_does_not_exist_lists_the_available_ones(tmp_path):
    with pytest.raises(HydraException, match=r"(?s)experiment.*nonexistent_experiment.*digits_linvit_nano"):
        _compose(tmp_path, "experiment=nonexistent_experiment")


def test_a_config_group_option_that_does_not_exist_lists_the_available_ones(tmp_path):
    with pytest.raises(HydraException, match=r"(?s)data.*cifar11.*cifar10"):
        _compose(tmp_path, "data=cifar11")


def test_a_model_name_that_does_not_exist_lists_close_matches(tmp_path):
    from linvit.train.run import train

    cfg = _compose(tmp_path, "model.model_name=linvit_tinny")
    with pytest.raises(Exception, match=r"(?s)linvit_tinny.*linvit_tiny"):  # noqa: PT011  (Hydra wraps it)
        instantiate(cfg.model)
    # train.py unwraps Hydra's InstantiationException: the ValueError itself, before any training
    with pytest.raises(ValueError, match=r"(?s)linvit_tinny.*Close matches: linvit_tiny"):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()


def test_num_classes_that_disagrees_with_the_dataset_fails_at_setup(tmp_path):
    cfg = _compose(tmp_path, "data.num_classes=7")
    assert cfg.model.num_classes == 7, "the model reads num_classes from the data config"
    datamodule = instantiate(cfg.data)
    with pytest.raises(ValueError, match=r"(?s)10 classes.*num_classes=7.*num_classes=10"):
        datamodule.setup("fit")  # Trainer.fit calls this before the first step


def test_a_model_num_classes_that_disagrees_with_the_data_fails_before_training(tmp_path):
    from linvit.train.run import train

    cfg = _compose(tmp_path, "model.num_classes=5", "model.model_name=linvit_nano")
    with pytest.raises(ValueError, match=r"model\.num_classes=5 but the data has num_classes=10"):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()

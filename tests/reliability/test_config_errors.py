"""Config mistakes fail before any training starts, with a message that says what to change."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import instantiate

from linvit.train.runs.hydra_app import config_dir

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
    from linvit.train.runs.run import train

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
    from linvit.train.runs.run import train

    cfg = _compose(tmp_path, "model.num_classes=5", "model.model_name=linvit_nano")
    with pytest.raises(ValueError, match=r"model\.num_classes=5 but the data has num_classes=10"):
        train(cfg)
    assert not (tmp_path / "checkpoints").exists()


# -- values of the wrong type: one typed check of the whole composed config, before anything starts ---------------
WRONG_TYPES = [
    ("trainer.max_epochs=ten", "trainer.max_epochs='ten' (str) must be auto or an integer"),
    ("model.optimizer.lr=abc", "model.optimizer.lr='abc' (str) must be a finite number"),
    ("model.optimizer.lr=null", "model.optimizer.lr=null must be a finite number"),
    ("model.optimizer.weight_decay=abc", "model.optimizer.weight_decay='abc' (str) must be a finite number"),
    ("model.ema.decay=abc", "model.ema.decay='abc' (str) must be a finite number"),
    ("seed=abc", "seed='abc' (str) must be an integer or null"),
    ("model.label_smoothing=abc", "model.label_smoothing='abc' (str) must be a finite number"),
    ("model.scheduler.warmup_epochs=abc", "model.scheduler.warmup_epochs='abc' (str) must be a finite number"),
    ("model.model_kwargs.drop_path_rate=abc", "model.model_kwargs.drop_path_rate='abc' (str) must be a finite number"),
    ("model.ema.enabled=1", "model.ema.enabled=1 (int) must be true or false"),
]


@pytest.mark.parametrize("override, message", WRONG_TYPES, ids=[override for override, _ in WRONG_TYPES])
def test_a_value_of_the_wrong_type_is_named_before_anything_starts(tmp_path, override, message):
    from train_helpers import FAST, SHORT, compose

    from linvit.train.runs.run import train

    run_dir = tmp_path / "run"
    cfg = compose([*FAST, *SHORT, "test=false", "export.enabled=false", override], run_dir)
    with pytest.raises(ValueError) as error:
        train(cfg)
    assert str(error.value).count("\n") == 0 and message in str(error.value), str(error.value)
    assert not run_dir.exists(), "something started before the check"


def test_train_py_prints_every_wrong_value_in_one_line_and_exits_with_1(tmp_path, capsys):
    from train_helpers import compose

    from linvit.train.runs.hydra_app import run_task

    cfg = compose(["trainer.max_epochs=ten", "model.optimizer.lr=abc"], tmp_path / "run")
    with pytest.raises(SystemExit) as stopped:
        run_task(cfg)
    assert stopped.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "trainer.max_epochs='ten'" in lines[0] and "model.optimizer.lr='abc'" in lines[0]


def _config_names(group: str) -> list[str]:
    return sorted(path.stem for path in (CONFIGS / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "overrides",
    [[f"model={name}"] for name in _config_names("model")]
    + [[f"data={name}"] for name in _config_names("data")]
    + [[f"experiment={name}"] for name in _config_names("experiment")]
    + [[f"trainer={name}"] for name in _config_names("trainer")],
    ids=lambda overrides: overrides[0],
)
def test_every_shipped_config_has_values_of_the_types_the_check_wants(tmp_path, overrides):
    from linvit.train.runs.config_types import check_config_types

    check_config_types(_compose(tmp_path, *overrides))

"""Every config composes through Hydra's compose API and builds its objects (no training)."""

from __future__ import annotations

import importlib.util

import pytest
import timm
from hydra.utils import instantiate
from omegaconf import OmegaConf
from train_helpers import CONFIG_DIR, compose

import linvit  # noqa: F401  (registers the models)
from linvit.train.runs.model_configs import missing_or_stale, registered_model_names

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
DATA = sorted(p.stem for p in (CONFIG_DIR / "data").glob("*.yaml"))
TRAINERS = sorted(p.stem for p in (CONFIG_DIR / "trainer").glob("*.yaml"))


def test_default_run_is_the_digits_linvit_nano_experiment():
    assert compose([]) == compose(["experiment=digits_linvit_nano"])
    cfg = compose([])
    assert cfg.model.model_name == "linvit_nano"
    assert cfg.data._target_.endswith("DigitsDataModule")


@pytest.mark.parametrize("experiment", [e for e in EXPERIMENTS if not e.startswith("seg_")])
def test_experiment_composes_and_instantiates(experiment):
    cfg = compose([f"experiment={experiment}"])
    OmegaConf.resolve(cfg)  # every interpolation resolves
    if not timm.is_model(cfg.model.model_name):
        pytest.skip(f"{cfg.model.model_name} is not registered (yet)")
    datamodule = instantiate(cfg.data)
    model = instantiate(cfg.model)
    assert model.num_classes == datamodule.num_classes == cfg.data.num_classes
    assert model.model.num_classes == datamodule.num_classes
    trainer_cfg = OmegaConf.to_container(cfg.trainer)
    assert trainer_cfg["_target_"] == "lightning.pytorch.Trainer"


def test_paper_recipe():
    cfg = compose(["experiment=imagenet_flatten_swin_tiny"])
    m, d, t = cfg.model, cfg.data, cfg.trainer
    assert (m.optimizer.opt, m.optimizer.lr, m.optimizer.lr_base_size, m.optimizer.weight_decay) == (
        "adamw",
        1e-3,
        1024,
        0.05,
    )
    assert (t.max_epochs, m.scheduler.warmup_epochs, t.devices, t.strategy) == (300, 20, 8, "ddp")
    assert (m.mixup.mixup_alpha, m.mixup.cutmix_alpha, m.label_smoothing) == (0.8, 1.0, 0.1)
    assert (d.auto_augment, d.re_prob, m.model_kwargs.drop_path_rate) == ("rand-m9-mstd0.5-inc1", 0.25, 0.2)
    assert d.batch_size * t.devices == 1024  # lr 1e-3 at the paper's effective batch


def test_every_registered_model_has_a_config():
    names = registered_model_names()
    assert "linvit_nano" in names or not timm.list_models("linvit_*")
    assert missing_or_stale() == [], "run `python -m linvit.train.runs.model_configs --config-dir configs` to add them"
    for name in names:
        cfg = compose([f"model={name}"])
        assert cfg.model.model_name == name
        assert cfg.model.model_kwargs.img_size == cfg.data.img_size


@pytest.mark.parametrize("data", [d for d in DATA if not d.startswith("seg_")])
def test_data_config_instantiates(data):
    cfg = compose([f"data={data}", "model=timm", "model.model_name=test_resnet"])
    datamodule = instantiate(cfg.data)
    assert cfg.data.num_classes == cfg.model.num_classes
    if cfg.data.num_classes == "auto":  # a folder's: counted before the model is built (tests/train/data/test_auto_*)
        assert "num_classes" in datamodule.auto_options
    else:
        assert datamodule.num_classes == cfg.data.num_classes
    assert datamodule.in_chans == cfg.model.in_chans


def test_num_classes_and_channels_flow_from_data_to_model():
    cfg = compose(["data.num_classes=7", "data.in_chans=1", "data.img_size=24"])
    assert (cfg.model.num_classes, cfg.model.in_chans, cfg.model.model_kwargs.img_size) == (7, 1, 24)


@pytest.mark.parametrize("trainer", TRAINERS)
def test_trainer_configs_compose(trainer):
    cfg = compose([f"trainer={trainer}"])
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"
    if trainer in ("default", "cpu", "ddp_sim"):  # the others need GPUs
        built = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
        assert built.num_devices == cfg.trainer.devices


@pytest.mark.parametrize("logger", ["csv", "tensorboard", "many_loggers", "none"])
def test_logger_configs(logger, tmp_path):
    if logger in ("tensorboard", "many_loggers") and importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed (pip install tensorboard)")
    cfg = compose([f"logger={logger}"], output_dir=tmp_path)
    built = [instantiate(entry) for entry in (cfg.get("logger") or {}).values()]
    assert len(built) == {"csv": 1, "tensorboard": 1, "many_loggers": 2, "none": 0}[logger]


def test_slurm_launcher_config():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="hydra-submitit-launcher is not installed")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose("train", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher.tasks_per_node == cfg.hydra.launcher.gpus_per_node


def test_default_callbacks_include_fault_tolerance():
    cfg = compose([])
    targets = {entry._target_ for entry in cfg.callbacks.values() if entry and "_target_" in entry}
    assert "linvit.train.modules.fault_tolerance.AtomicCheckpointing" in targets
    assert "linvit.train.modules.fault_tolerance.NonFiniteLossGuard" in targets


def test_trust_checkpoint_is_off_by_default():
    assert compose([]).trust_checkpoint is False


def test_the_config_generator_writes_only_where_it_is_told(tmp_path, capsys):
    from linvit.train.runs.model_configs import CONFIG_DIR, main

    shipped = sorted(path.stat().st_mtime_ns for path in (CONFIG_DIR / "model").glob("*.yaml"))
    with pytest.raises(SystemExit) as refused:  # no --config-dir: an error, not a write into the package
        main([])
    assert refused.value.code == 2 and "--config-dir" in capsys.readouterr().err
    assert sorted(path.stat().st_mtime_ns for path in (CONFIG_DIR / "model").glob("*.yaml")) == shipped
    assert main(["--check", "--config-dir", str(tmp_path)]) == 1
    assert main(["--config-dir", str(tmp_path)]) == 0
    written = sorted(path.stem for path in (tmp_path / "model").glob("*.yaml"))
    assert written == registered_model_names()
    assert main(["--check", "--config-dir", str(tmp_path)]) == 0 and main(["--check"]) == 0

"""The segmentation Hydra configs compose, instantiate, and train through train.py."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "configs"


def _compose(overrides):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(version_base="1.3", config_dir=str(CONFIGS)):
        return compose(config_name="train", overrides=overrides, return_hydra_config=False)


@pytest.mark.skipif(not (CONFIGS / "train.yaml").is_file(), reason="configs/train.yaml (training configs) missing")
@pytest.mark.parametrize("model", ["seg_fpn", "seg_upernet"])
def test_experiment_composes_and_instantiates(tmp_path, model):
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = _compose(
        [
            "experiment=seg_synthetic_linvit_nano",
            f"model={model}",
            "model.backbone=test_convnext",
            f"paths.data_dir={tmp_path}",
            "paths.output_dir=" + str(tmp_path / "run"),
        ]
    )
    assert cfg.model.num_classes == cfg.data.num_classes == 4
    assert cfg.callbacks.model_checkpoint.monitor == "val/mIoU"
    data = instantiate(cfg.data)
    module = instantiate(cfg.model)
    assert module.model.head_name == OmegaConf.select(cfg, "model.head")
    assert data.crop_size == (96, 128)


@pytest.mark.slow  # a fresh interpreter importing torch/lightning/timm: ~30 s on 2 shared cores
@pytest.mark.skipif(not (ROOT / "train.py").is_file(), reason="train.py missing")
def test_train_py_runs_segmentation_experiment(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "experiment=seg_synthetic_linvit_nano",
        "model.backbone=test_convnext",
        "model.channels=16",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
        "logger=none",
        f"paths.log_dir={tmp_path / 'logs'}",
        f"paths.data_dir={tmp_path / 'data'}",
        "data.synthetic.num_train=16",
        "data.synthetic.num_val=4",
        "data.img_size=[48,64]",
        "data.synthetic.size=[48,64]",
        "run_name=seg_test",
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # task_name is <data>_<model> from what the run trains (the backbone override), not the experiment's name
    run_dir = tmp_path / "logs" / "seg_synthetic_test_convnext" / "seg_test"
    assert (run_dir / "checkpoints" / "best.ckpt").is_file()
    assert "test/mIoU" in (run_dir / "metrics.json").read_text()
    assert (tmp_path / "data" / "seg_synthetic" / "train" / "images").is_dir()

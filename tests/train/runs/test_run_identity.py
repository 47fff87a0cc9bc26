"""Runs are named and labelled from what they train on (the data and the model), not from the default task.

`data=imagefolder` or `data=seg_folder` used to land in outputs/digits_linvit_nano/ or seg_synthetic_linvit_nano/,
and the segmentation IoU labels read background/disc/... from the synthetic task whatever the data.
"""

from __future__ import annotations

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf
from train_helpers import CONFIG_DIR, compose

from linvit.train.runs.run_identity import data_label, model_label, register_resolvers


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "digits_linvit_nano"),
        (["experiment=fashion_mnist_linvit_nano"], "fashion_mnist_linvit_nano"),
        (["experiment=seg_synthetic_linvit_nano"], "seg_synthetic_linvit_nano"),
        (["data=imagefolder", "data.root=/data/flowers"], "flowers_linvit_nano"),
        (["data=imagefolder", "data.root=/data/My Photos/"], "My_Photos_linvit_nano"),
        (["data=cifar100", "model=timm", "model.model_name=resnet18"], "cifar100_resnet18"),
        (["experiment=seg_synthetic_linvit_nano", "data=seg_folder", "data.data_dir=/data/mine"], "mine_linvit_nano"),
        (["experiment=seg_synthetic_linvit_nano", "model.backbone=convnext_atto"], "seg_synthetic_convnext_atto"),
        (["experiment=imagenet_flatten_swin_tiny", "data.root=/data/in1k"], "in1k_flatten_swin_tiny_patch4_224"),
        (["data=imagefolder", "data.root=/data/flowers", "task_name=mine"], "mine"),
    ],
)
def test_task_name_comes_from_the_data_and_the_model(overrides, expected):
    assert compose(overrides).task_name == expected


def test_the_run_directory_follows_the_task_name():
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(
            "train",
            overrides=["data=imagefolder", "data.root=/data/flowers", "run_name=r1"],
            return_hydra_config=True,
        )
    assert OmegaConf.select(cfg, "hydra.run.dir") == "outputs/flowers_linvit_nano/r1"


def test_labels_of_configs_outside_the_project():
    assert data_label({"_target_": "my.pkg.SatelliteTilesDataModule"}) == "satellite_tiles"
    assert data_label({"_target_": "x.Y", "root": "C:/data/sat-2024"}) == "sat-2024"
    assert model_label({"model_name": "hf-hub:timm/resnet18.a1_in1k"}) == "resnet18.a1_in1k"
    assert model_label({"_target_": "my.pkg.Detector"}) == "detector"


def test_segmentation_class_names_come_from_the_data(tmp_path):
    from linvit.train.data.segmentation import SegmentationDataModule
    from linvit.train.modules.segmentation import SegmentationModule

    synthetic = SegmentationDataModule(tmp_path / "s", num_classes=3, synthetic={"num_train": 1})
    assert synthetic.class_names == ["background", "disc", "square"]
    folder = SegmentationDataModule(tmp_path, num_classes=2)
    assert folder.class_names == ["0", "1"]
    (tmp_path / "classes.txt").write_text("road\nsky\n")
    assert folder.class_names == ["road", "sky"]
    given = SegmentationDataModule(tmp_path, num_classes=2, class_names=["a", "b"])
    assert given.class_names == ["a", "b"]
    with pytest.raises(ValueError, match="one name per class"):
        SegmentationDataModule(tmp_path, num_classes=3, class_names=["a", "b"])
    (tmp_path / "classes.txt").write_text("road\n")
    with pytest.raises(ValueError, match="classes.txt names 1 classes but data.num_classes=2"):
        folder.class_names

    module = SegmentationModule("test_convnext", num_classes=2, channels=8)
    module._trainer = type("T", (), {"datamodule": given})()
    module.setup("fit")
    assert module.class_names == ["a", "b"]
    explicit = SegmentationModule("test_convnext", num_classes=2, channels=8, class_names=["x", "y"])
    explicit._trainer = type("T", (), {"datamodule": given})()
    explicit.setup("fit")
    assert explicit.class_names == ["x", "y"]  # an explicit model.class_names wins
